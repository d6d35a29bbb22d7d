"""Any Hugging Face encoder whose tokenizer is not one token per character (word pieces, SentencePiece
Unigram as in XLM-RoBERTa, byte-level BPE as in RoBERTa-style models), read as per-character
features through the fast tokenizer's offset mapping.

The featuriser hands a language model one id per character (`CharVocab.ids`); here those ids are the
characters themselves (their code points), so the seam between features and pretrained stays as it
is and a frozen LM's cache is keyed by the text. The embedder rebuilds each sentence's text,
tokenizes it whole, runs the encoder (in overlapping windows of tokens when the sentence is longer
than its positions; XLNet, whose positions are relative, reads it in consecutive segments instead,
each with the states of the segments before as its memory, `mems`), and gives each character the
mean of the states of the tokens whose offsets cover it. Mean, because a character is usually
covered by one token (then it is that token's state) and byte-level BPE may split one character's
bytes over several tokens, which should weigh alike; every character of a multi-character piece
gets the piece's state (where in the piece it sits is left to the character and bigram embeddings
beside it). A character that no token covers (the whitespace a tokenizer drops, an accent its
normaliser strips) reads one learned vector instead, `uncovered` (zeros at first, trained with the
tagger even when the LM is frozen), as a character-level LM reads whitespace as its trained
`[unused1]`; offsets never shift. Such a character's layer states are exact zeros (`states`, and the
cache that stores them), which is how `combine` finds it.
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
MEMORY_TYPES = ("xlnet",)  # encoders read in segments with a segment-level memory (`mems`) instead of windows
# A SentencePiece model that transformers converts to a fast tokenizer (with the sentencepiece and
# protobuf packages of the `lm` extra): XLNet's and XLM-RoBERTa's file names.
SENTENCEPIECE_FILES = ("spiece.model", "sentencepiece.bpe.model")


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
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError) as e:
        fix = "give a directory with tokenizer.json (a fast tokenizer), as `save_pretrained` writes"
        sentencepiece = any((directory / name).is_file() for name in SENTENCEPIECE_FILES)
        if sentencepiece and not (directory / "tokenizer.json").is_file():
            fix = ('a SentencePiece model is converted with the sentencepiece and protobuf packages: '
                   'pip install -e ".[lm]" (or ' + fix + ")")
        raise UserError(f"its tokenizer cannot be read ({_gist(e)})", where=str(directory), fix=fix) from None
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
        # XLNet: the states kept per layer between segments (its config's mem_len, else one segment's); 0: windows
        self.memory = 0
        if getattr(config, "model_type", "") in MEMORY_TYPES:
            self.memory = getattr(config, "mem_len", None) or self.window + specials
        self.uncovered = nn.Parameter(torch.zeros(self.output_dim))  # (D,) what a character no token covers reads

    def combine(self, stack: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """As CharFeatures.combine, then the learned `uncovered` vector at every real character whose
        layer states are all zeros (covered by no token). (B, T, D), zero at padding."""
        features = super().combine(stack, mask)  # (B, T, D)
        uncovered = mask & (stack.flatten(2) == 0).all(dim=-1)  # (B, T)
        return torch.where(uncovered[..., None], self.uncovered.to(features.dtype), features)

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
        """(B, T, S, D) float32, exact zeros at padding and at characters no token covers."""
        B, T = lm_ids.shape
        device = lm_ids.device
        out = torch.zeros(B, T, self.num_states, self.output_dim, device=device)
        lengths = mask.sum(dim=1).tolist()
        tokens, weights = [], []
        for b, n in enumerate(lengths):
            ids, cover = self.align("".join(map(chr, lm_ids[b, :n].tolist())))
            tokens.append(ids)
            weights.append(cover)
        read = self._read_with_memory if self.memory else self._read_in_windows
        token_states = read(tokens, device)  # per sentence (tokens, S, D)
        for b, n in enumerate(lengths):
            if n:  # (chars, tokens) @ (tokens, S*D): each character the mean of its tokens
                flat = token_states[b].flatten(1)  # (tokens, S * D)
                out[b, :n] = (weights[b].to(device) @ flat).view(n, self.num_states, self.output_dim)
        return out

    def _read_in_windows(self, tokens: list[list[int]], device) -> list[torch.Tensor]:
        """Each sentence's token states (tokens, S, D), its tokens read in overlapping windows
        (`lm_windows`), all the sentences' windows in one batch."""
        rows, places = [], []  # places: (sentence, row, first content position, take range)
        for b, ids in enumerate(tokens):
            for start, end, take_start, take_end in lm_windows(len(ids), self.window):
                places.append((b, len(rows), len(self.prefix) - start, take_start, take_end))
                rows.append(self.prefix + ids[start:end] + self.suffix)
        token_states = [torch.zeros(len(ids), self.num_states, self.output_dim, device=device) for ids in tokens]
        if rows:
            stack, _ = self._run(*self._batch(rows, device))  # (R, W, S, D)
            for b, r, shift, take_start, take_end in places:
                token_states[b][take_start:take_end] = stack[r, take_start + shift:take_end + shift]
        return token_states

    def _read_with_memory(self, tokens: list[list[int]], device) -> list[torch.Tensor]:
        """Each sentence's token states (tokens, S, D), its tokens and special tokens cut into
        consecutive segments of a window's length (the last one shorter) read in order, each with the
        states of the ones before it as XLNet's memory (`mems`, at most `self.memory` positions a
        layer, so the memory stays bounded however long the text). The sentences' k-th segments share
        a batch; only a sentence's last segment is shorter, and a sentence leaves the batch after it,
        so the memory never holds padding (XLNet attends to every position of its memory)."""
        frame, P = self.window + len(self.prefix) + len(self.suffix), len(self.prefix)
        streams = [self.prefix + ids + self.suffix for ids in tokens]
        token_states = [torch.zeros(len(ids), self.num_states, self.output_dim, device=device) for ids in tokens]
        active = [b for b, ids in enumerate(tokens) if ids]  # the sentences still being read
        start, mems = 0, None
        while active:
            rows = [streams[b][start:start + frame] for b in active]
            stack, mems = self._run(*self._batch(rows, device), mems=mems, remember=True)  # (R, W, S, D)
            for r, b in enumerate(active):  # the content tokens of [start, start + frame)
                lo, hi = max(start, P), min(start + frame, P + len(tokens[b]))
                if hi > lo:
                    token_states[b][lo - P:hi - P] = stack[r, lo - start:hi - start]
            start += frame
            going = [r for r, b in enumerate(active) if len(streams[b]) > start]
            active = [active[r] for r in going]
            mems = [m[:, going] for m in mems]  # (positions, rows, D) a layer
        return token_states

    def _batch(self, rows: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
        """Token rows as input ids and attention (R, W), right-padded to a width from a few sizes
        (nerkit.shapes), never past a window's: bounded native caches."""
        longest = max(len(r) for r in rows)
        width = max(longest, min(padded_size(longest), self.window + len(self.prefix) + len(self.suffix)))
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)  # (R, W)
        attention = torch.zeros(len(rows), width, dtype=torch.long)  # (R, W)
        for r, row in enumerate(rows):
            input_ids[r, :len(row)] = torch.tensor(row)
            attention[r, :len(row)] = 1
        return input_ids.to(device), attention.to(device)

    def _run(self, input_ids: torch.Tensor, attention: torch.Tensor, mems: list | None = None,
             remember: bool = False) -> tuple[torch.Tensor, list | None]:
        """input_ids, attention (R, W) -> layer states (R, W, S, D) float32, and with `remember`
        (XLNet) the memory to read the next segment with: a list a layer of (positions, R, D), the
        last `self.memory` positions of `mems` and this segment (None without)."""
        grad = self.finetune and torch.is_grad_enabled()
        memory = dict(mems=mems, use_mems=True) if remember else {}
        with torch.set_grad_enabled(grad), torch.autocast(input_ids.device.type, dtype=torch.bfloat16,
                                                          enabled=self.bf16):
            out = self.lm(input_ids=input_ids, attention_mask=attention,
                          output_hidden_states=self.layers == "mix", **memory)
        states = out.hidden_states if self.layers == "mix" else (out.last_hidden_state,)
        kept = [m[-self.memory:] for m in out.mems] if remember else None  # detached by the model
        return torch.stack(states, dim=2).float(), kept  # (R, W, S, D)
