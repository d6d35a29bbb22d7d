"""Any Hugging Face encoder whose tokenizer is not one token per character (word pieces, SentencePiece
Unigram as in XLM-RoBERTa, byte-level BPE as in RoBERTa-style models), read as per-character
features through the fast tokenizer's offset mapping.

The featuriser hands a language model one id per character (`CharVocab.ids`); here those ids are the
characters themselves (their code points), so the seam between features and pretrained stays as it
is and a frozen LM's cache is keyed by the text. The embedder rebuilds each sentence's text,
tokenizes it whole, runs the encoder (in overlapping windows of tokens when the sentence is longer
than its positions), and gives each character the mean of the states of the tokens whose offsets
cover it. Mean, because a character is usually covered by one token (then it is that token's state)
and byte-level BPE may split one character's bytes over several tokens, which should weigh alike;
every character of a multi-character piece gets the piece's state (where in the piece it sits is
left to the character and bigram embeddings beside it). A character that no token covers (the
whitespace a tokenizer drops) gets zeros from the LM: its own character and bigram embeddings still
tell the model what it is, and offsets never shift.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn

from nerkit.errors import UserError
from nerkit.pretrained.base import CharFeatures, CharVocab, _gist, lm_windows
from nerkit.shapes import padded_size

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
DEFAULT_WINDOW = 510  # tokens per window for encoders that declare no position limit (XLNet)


class CodepointVocab(CharVocab):
    """Each character's id is its code point: the subword embedder reads the text back from them.
    Its identity, which keys a frozen LM's cache, is the tokenizer's."""

    pad_id = 0  # what fills a batch past a sentence's end (the embedder reads only each sentence's own length)

    def __init__(self, tokenizer_identity: str):
        super().__init__()
        self.identity = tokenizer_identity

    def _lookup(self, char: str) -> int:
        return ord(char)

    def _identity(self) -> list:
        return ["codepoints", self.identity]


def read_tokenizer(directory: Path):
    """The fast tokenizer of a local Hugging Face directory (never a hub)."""
    from nerkit.pretrained.bert import _transformers

    try:
        tokenizer = _transformers().AutoTokenizer.from_pretrained(str(directory), local_files_only=True, use_fast=True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(f"its tokenizer cannot be read ({_gist(e)})", where=str(directory),
                        fix="give a directory with tokenizer.json (a fast tokenizer), as `save_pretrained` writes") from None
    if not getattr(tokenizer, "is_fast", False):
        raise UserError("the tokenizer is not a fast tokenizer, which offsets need", where=str(directory),
                        fix="save the tokenizer with tokenizer.json (e.g. AutoTokenizer.from_pretrained(..., "
                            "use_fast=True).save_pretrained(DIR))")
    return tokenizer


def tokenizer_identity(tokenizer) -> str:
    """A checksum of what decides the tokens: the tokenizer's full serialisation."""
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode("utf-8")).hexdigest()


def token_positions(config) -> int:
    """How many tokens, special ones included, the encoder of `config` reads at once; 0: no limit
    (XLNet says -1). RoBERTa-style position ids start after the padding id, which costs two."""
    limit = max(0, getattr(config, "max_position_embeddings", None) or 0)
    if limit and getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
        limit -= 2
    return limit


def special_frame(tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after one sequence ([CLS] ... [SEP] for BERT,
    <s> ... </s> for XLM-R, ... <sep> <cls> for XLNet), read from how it encodes a probe text."""
    probe = tokenizer("a", add_special_tokens=True, return_special_tokens_mask=True)
    ids, special = probe["input_ids"], probe["special_tokens_mask"]
    content = [i for i, s in enumerate(special) if not s]
    if not content:
        return ids, []
    return ids[:content[0]], ids[content[-1] + 1:]


class SubwordEmbedder(CharFeatures):
    """Per-character features of an encoder with a subword tokenizer (see the module's docstring)."""

    kind = "subword"

    def __init__(self, lm: nn.Module, tokenizer, layers: str = "last", finetune: bool = False, bf16: bool = False):
        config = lm.config
        num_layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer")
        width = getattr(config, "hidden_size", None) or getattr(config, "d_model")
        super().__init__(lm, CodepointVocab(tokenizer_identity(tokenizer)), layers, finetune, bf16,
                         num_layers=num_layers, output_dim=width)
        self.tokenizer = tokenizer
        self.prefix, self.suffix = special_frame(tokenizer)
        specials = len(self.prefix) + len(self.suffix)
        self.window = max(1, (token_positions(config) or DEFAULT_WINDOW + specials) - specials)  # content tokens

    def align(self, text: str) -> tuple[list[int], torch.Tensor]:
        """The token ids of `text` (no special tokens) and the (chars, tokens) float weights that give
        each character the mean of the tokens covering it (a zero row: covered by none)."""
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
        cover = torch.zeros(len(text), len(ids))  # (chars, tokens)
        for t, (start, end) in enumerate(offsets):
            cover[start:end, t] = 1.0
        counts = cover.sum(dim=1, keepdim=True)  # (chars, 1)
        return ids, cover / counts.clamp(min=1.0)

    def states(self, lm_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T, S, D) float32, zero at padding and at characters no token covers."""
        B, T = lm_ids.shape
        device = lm_ids.device
        out = torch.zeros(B, T, self.num_states, self.output_dim, device=device)
        lengths = mask.sum(dim=1).tolist()
        rows, places, weights = [], [], []  # places: (sentence, row, first content position, take range)
        for b, n in enumerate(lengths):
            text = "".join(map(chr, lm_ids[b, :n].tolist()))
            ids, cover = self.align(text)
            weights.append(cover)
            for start, end, take_start, take_end in lm_windows(len(ids), self.window):
                places.append((b, len(rows), len(self.prefix) - start, take_start, take_end))
                rows.append(self.prefix + ids[start:end] + self.suffix)
        if rows:  # the width from a few sizes (nerkit.shapes), never past a window's: bounded native caches
            longest = max(len(r) for r in rows)
            width = max(longest, min(padded_size(longest), self.window + len(self.prefix) + len(self.suffix)))
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            input_ids = torch.full((len(rows), width), pad, dtype=torch.long)  # (R, W), right-padded
            attention = torch.zeros(len(rows), width, dtype=torch.long)  # (R, W)
            for r, row in enumerate(rows):
                input_ids[r, :len(row)] = torch.tensor(row)
                attention[r, :len(row)] = 1
            stack = self._run(input_ids.to(device), attention.to(device))  # (R, W, S, D)
        token_states = [torch.zeros(cover.size(1), self.num_states, self.output_dim, device=device)
                        for cover in weights]  # per sentence (tokens, S, D)
        for b, r, shift, take_start, take_end in places:
            token_states[b][take_start:take_end] = stack[r, take_start + shift:take_end + shift]
        for b, n in enumerate(lengths):
            if n:  # (chars, tokens) @ (tokens, S*D): each character the mean of its tokens
                flat = token_states[b].flatten(1)  # (tokens, S * D)
                out[b, :n] = (weights[b].to(device) @ flat).view(n, self.num_states, self.output_dim)
        return out

    def _run(self, input_ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """input_ids, attention (R, W) -> layer states (R, W, S, D) float32."""
        grad = self.finetune and torch.is_grad_enabled()
        with torch.set_grad_enabled(grad), torch.autocast(input_ids.device.type, dtype=torch.bfloat16,
                                                          enabled=self.bf16):
            out = self.lm(input_ids=input_ids, attention_mask=attention,
                          output_hidden_states=self.layers == "mix")
        states = out.hidden_states if self.layers == "mix" else (out.last_hidden_state,)
        return torch.stack(states, dim=2).float()  # (R, W, S, D)
