"""Baidu's LAC-small lexical analyser, the model jieba ships for its paddle mode, in plain torch (no
paddle): its character embeddings and two bidirectional GRU layers give per-character features to any
encoder (`embeddings.lm.path`), and its emission layer and CRF tag text, which checks the port.

Its directory (`nerkit vectors export-lac`) is read and written by nerkit.pretrained.lac_files, and
jieba's Paddle files by nerkit.pretrained.paddle.
"""

from __future__ import annotations

import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from nerkit.data.tags import Span, tags_to_spans
from nerkit.errors import UserError
from nerkit.pretrained.base import (
    CharFeatures,
    CharVocab,
)

MODEL_TYPE = "lac-bigru"  # config.json's model_type in an exported directory
EXPORT_FIX = "run `nerkit vectors export-lac --out DIR` (needs jieba 0.42 or later) and point to DIR"

CHARS_FILE, TAGS_FILE, WEIGHTS_FILE = "word.dic", "tag.dic", "model.safetensors"


OOV = "OOV"  # word.dic's entry for every character it lacks (and for whitespace)


# LAC's types that MSRA and People's Daily call NR, NS and NT; its other tags are word classes.
MSRA_TYPES = {"PER": "NR", "LOC": "NS", "ORG": "NT"}


# LAC was trained on folded text: the rows of word_emb that never moved from their random start
# (norm 0.65 against about 5) are those of upper-case ASCII letters, of the full-width (U+FF01-FF5E)
# and small (U+FE50-FE6B) forms of ASCII, and of this CJK punctuation, whose ASCII twins are trained.
_ASCII_TWINS = {"。": ".", "、": ",", "“": '"', "”": '"', "〝": '"', "〞": '"', "「": '"', "」": '"',
                "『": '"', "』": '"', "‘": "'", "’": "'", "【": "[", "】": "]", "〖": "[", "〗": "]",
                "〔": "[", "〕": "]", "〈": "<", "〉": ">", "—": "-", "‐": "-", "∶": ":"}


# ------------------------------------------------------------------------------------ characters

class LACVocab(CharVocab):
    """LAC's word.dic read as one id per character; whitespace and unknown characters are OOV.

    `fold`: look a character up as LAC's training text had it. jieba's reader looks each character
    up as it comes, but LAC was trained on folded text, so the rows of full-width and small forms
    of ASCII, of upper-case letters and of CJK punctuation with an ASCII twin (。、“” ...) were
    never trained. With `fold` those characters take their folded form's row (`_ASCII_TWINS`);
    every other character keeps its own, so that a character's features stay its own.
    """

    def __init__(self, entries: dict[str, int], fold: bool = True, where: str = CHARS_FILE):
        super().__init__()
        if OOV not in entries:
            raise UserError(f"the character dictionary has no {OOV} entry", where=where, fix=EXPORT_FIX)
        self.entries, self.fold = entries, fold
        self.oov_id = self.pad_id = entries[OOV]  # padding is masked: any id will do

    @classmethod
    def read(cls, path: Path, fold: bool = True) -> "LACVocab":
        """word.dic: `id<TAB>character` per line."""
        entries: dict[str, int] = {}
        try:
            lines = path.read_text(encoding="utf-8").split("\n")
        except FileNotFoundError:
            raise UserError(f"{path.name} not found", where=str(path.parent), fix=EXPORT_FIX) from None
        except UnicodeDecodeError:
            raise UserError("not UTF-8 text", where=str(path), fix=EXPORT_FIX) from None
        for number, line in enumerate(lines, 1):
            if not line:
                continue
            row, tab, char = line.partition("\t")
            if not tab or not row.isdigit() or not char:
                raise UserError(f"expected `id<TAB>character`, found {line!r}", where=f"{path}:{number}",
                                fix=EXPORT_FIX)
            entries[char] = int(row)
        return cls(entries, fold, where=str(path))

    def lines(self) -> str:
        return "".join(f"{i}\t{c}\n" for c, i in sorted(self.entries.items(), key=lambda e: e[1]))

    @staticmethod
    def _folded(char: str) -> str:
        if 0xFF01 <= ord(char) <= 0xFF5E or 0xFE50 <= ord(char) <= 0xFE6B:
            char = unicodedata.normalize("NFKC", char)  # ａ -> a, ， -> ",", ﹑ -> 、
        return _ASCII_TWINS.get(char, char.lower() if char.isascii() else char)

    def _lookup(self, char: str) -> int:
        if char.isspace():
            return self.oov_id  # jieba's LAC reads OOV back as a space: its training text did so too
        candidates = (self._folded(char), char) if self.fold else (char,)
        return next((self.entries[c] for c in candidates if c in self.entries), self.oov_id)

    def _identity(self) -> list:
        return [sorted(self.entries.items()), self.fold, sorted(_ASCII_TWINS.items())]

    def __len__(self) -> int:
        return len(self.entries)


# ------------------------------------------------------------------------------------ the network

@dataclass
class LACConfig:
    vocab_size: int = 20941
    embedding_dim: int = 128
    hidden_size: int = 128
    num_layers: int = 2
    num_tags: int = 57
    fold: bool = True  # LACVocab's folding

    def to_dict(self) -> dict:
        return {"model_type": MODEL_TYPE, **asdict(self)}


class PaddleGRU(nn.Module):
    """One direction of Paddle's `fc` + `dynamic_gru` (origin_mode False), its weights as Paddle
    keeps them: the input projection x W_x + b_fc + b_gru gives the update, reset and candidate
    parts [u | r | c] of 3H, and with h the previous state
        u = sigmoid(x_u + h W_u),  r = sigmoid(x_r + h W_r)     (update_reset = [W_u | W_r], (H, 2H))
        c = tanh(x_c + (r * h) W_c)                            (candidate = W_c, (H, H))
        h' = (1 - u) * h + u * c
    The reset gate scales h before W_c (torch.nn.GRU scales W_c h instead), so torch's GRU cannot
    run these weights."""

    def __init__(self, input_dim: int, hidden: int):
        super().__init__()
        self.project = nn.Linear(input_dim, 3 * hidden)  # Paddle's fc_k
        self.update_reset = nn.Parameter(torch.zeros(hidden, 2 * hidden))  # (H, 2H), h @ W
        self.candidate = nn.Parameter(torch.zeros(hidden, hidden))  # (H, H)
        self.bias = nn.Parameter(torch.zeros(3 * hidden))  # (3H,) gru_k's bias, after fc_k's


def run_gru(inputs: torch.Tensor, update_reset: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
    """N independent GRUs (`PaddleGRU`'s equations) over left-aligned sequences from h = 0.
    inputs (N, B, T, 3H) projected inputs with both biases; update_reset (N, H, 2H); candidate
    (N, H, H). Returns the states (N, B, T, H); at padding they are garbage that never reaches a
    real step, since every step only looks back."""
    N, B, T, _ = inputs.shape
    H = candidate.shape[-1]
    gate_inputs, candidate_inputs = inputs[..., :2 * H], inputs[..., 2 * H:]  # (N, B, T, 2H), (N, B, T, H)
    h = inputs.new_zeros(N, B, H)
    states = []
    for t in range(T):
        gates = torch.sigmoid(gate_inputs[:, :, t] + torch.bmm(h, update_reset))  # (N, B, 2H)
        update, reset = gates[..., :H], gates[..., H:]
        proposal = torch.tanh(candidate_inputs[:, :, t] + torch.bmm(reset * h, candidate))  # (N, B, H)
        h = h + update * (proposal - h)  # (1 - u) h + u c
        states.append(h)
    if not states:
        return inputs.new_zeros(N, B, 0, H)
    return torch.stack(states, dim=2)  # (N, B, T, H)


def reversal_index(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """(B, T): position t of each sentence read backwards within its length (padding stays put);
    gathering with it twice gives the sentence back."""
    t = torch.arange(width, device=lengths.device)[None, :]  # (1, T)
    return torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)  # (B, T)


class BiGRULayer(nn.Module):
    """LAC's `_bigru_layer`: a forward and a reverse `PaddleGRU` over the same input, each with its
    own projection, their states concatenated [forward | reverse] (B, T, 2H)."""

    def __init__(self, input_dim: int, hidden: int):
        super().__init__()
        self.forward_gru = PaddleGRU(input_dim, hidden)
        self.reverse_gru = PaddleGRU(input_dim, hidden)

    def forward(self, x: torch.Tensor, backwards: torch.Tensor) -> torch.Tensor:
        """x (B, T, D_in); backwards (B, T) from `reversal_index`. Returns (B, T, 2H)."""
        f, r = self.forward_gru, self.reverse_gru
        index = backwards[:, :, None].expand(-1, -1, 3 * f.candidate.shape[0])  # (B, T, 3H)
        inputs = torch.stack([f.project(x) + f.bias,
                              (r.project(x) + r.bias).gather(1, index)])  # (2, B, T, 3H), the reverse GRU's reversed
        states = run_gru(inputs, torch.stack([f.update_reset, r.update_reset]),
                         torch.stack([f.candidate, r.candidate]))  # (2, B, T, H)
        reverse = states[1].gather(1, index[..., :states.shape[-1]])  # (B, T, H), back in reading order
        return torch.cat([states[0], reverse], dim=-1)  # (B, T, 2H)


class LACEncoder(nn.Module):
    """LAC's character embedding and stack of bidirectional GRU layers (`lex_net` up to its
    emission layer). Returns every state: the embeddings (B, T, E), then each layer's (B, T, 2H)."""

    def __init__(self, config: LACConfig):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.embedding_dim)
        widths = [config.embedding_dim] + [2 * config.hidden_size] * (config.num_layers - 1)
        self.layers = nn.ModuleList(BiGRULayer(w, config.hidden_size) for w in widths)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        """ids (B, T) long; mask (B, T) bool, left-aligned."""
        backwards = reversal_index(mask.sum(dim=1), ids.shape[1])  # (B, T)
        states = [self.embedding(ids)]  # (B, T, E)
        for layer in self.layers:
            states.append(layer(states[-1], backwards))  # (B, T, 2H)
        return states


class LACTagger(nn.Module):
    """The whole LAC-small: encoder, emission layer (Paddle's fc_4) and linear-chain CRF (crfw:
    row 0 start scores, row 1 end scores, then transitions[from, to]), decoded by Viterbi without
    constraints, as Paddle's crf_decoding does."""

    def __init__(self, config: LACConfig):
        super().__init__()
        self.encoder = LACEncoder(config)
        self.emission = nn.Linear(2 * config.hidden_size, config.num_tags)
        self.crf = nn.Parameter(torch.zeros(config.num_tags + 2, config.num_tags))  # (K + 2, K)

    @torch.no_grad()
    def decode(self, ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
        """ids, mask (B, T) -> the best tag ids of each sentence."""
        emissions = self.emission(self.encoder(ids, mask)[-1])  # (B, T, K)
        start, end, transitions = self.crf[0], self.crf[1], self.crf[2:]  # (K,), (K,), (K, K)
        score = start + emissions[:, 0]  # (B, K)
        itself = torch.arange(score.shape[1], device=score.device).expand_as(score)  # (B, K)
        pointers = []
        for t in range(1, ids.shape[1]):
            best, previous = (score[:, :, None] + transitions).max(dim=1)  # (B, K) over the previous tag
            real = mask[:, t, None]  # (B, 1)
            score = torch.where(real, best + emissions[:, t], score)
            pointers.append(torch.where(real, previous, itself))
        tag = (score + end).argmax(dim=1)  # (B,)
        path = [tag]
        for back in reversed(pointers):  # padding points each tag to itself, so rows trace back together
            tag = back.gather(1, tag[:, None]).squeeze(1)
            path.append(tag)
        rows = torch.stack(path[::-1], dim=1).tolist()  # (B, T)
        return [row[:n] for row, n in zip(rows, mask.sum(dim=1).tolist())]


def tag_sentences(tagger: LACTagger, vocab: LACVocab, tags: list[str], sentences: list[list[str]],
                  batch_size: int = 64) -> list[list[str]]:
    """LAC's tag (e.g. `PER-B`, `n-I`, `O`) for each character of each sentence."""
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    found: dict[int, list[str]] = {}
    for first in range(0, len(order), batch_size):
        batch = order[first:first + batch_size]
        width = max(1, max(len(sentences[i]) for i in batch))
        ids = torch.full((len(batch), width), vocab.pad_id, dtype=torch.long)  # (B, T)
        mask = torch.zeros(len(batch), width, dtype=torch.bool)  # (B, T)
        for b, i in enumerate(batch):
            ids[b, :len(sentences[i])] = torch.tensor(vocab.ids(sentences[i]), dtype=torch.long)
            mask[b, :len(sentences[i])] = True
        for i, row in zip(batch, tagger.decode(ids, mask)):
            found[i] = [tags[k] for k in row]
    return [found[i] for i in range(len(sentences))]


def lac_spans(lac_tags: list[str], types: dict[str, str] = MSRA_TYPES) -> list[Span]:
    """The entities of LAC's tags (`TYPE-B` opens, `TYPE-I` continues) of the types in `types`,
    renamed to their values; every other word class is outside."""
    tags = []
    for tag in lac_tags:
        kind, _, part = tag.rpartition("-")
        tags.append(f"{part}-{types[kind]}" if kind in types and part in ("B", "I") else "O")
    return tags_to_spans(tags)


# ------------------------------------------------------------------------------------ as LM features

class LACEmbedder(CharFeatures):
    """LAC's encoder as per-character features, so the LM path's finetune, lr, frozen-state cache and
    saving apply. `layers`: "last" (the top bi-GRU layer, 2H) or "mix" (a learned scalar mix of the
    embeddings and each layer; the E-wide embedding enters twice, [e | e], to be 2H wide, as ELMo
    does with its token layer). A GRU reads a sentence of any length whole, so there are no windows;
    `bf16` is accepted and ignored (the recurrence runs in float32)."""

    def __init__(self, lm: LACEncoder, vocab: LACVocab, layers: str = "last", finetune: bool = False,
                 bf16: bool = False):
        config = lm.config
        if layers == "mix" and config.embedding_dim != config.hidden_size:
            raise UserError(f"layers: mix needs the embedding ({config.embedding_dim}) as wide as a GRU "
                            f"direction ({config.hidden_size})", fix="use layers: last")
        super().__init__(lm, vocab, layers, finetune, bf16, num_layers=config.num_layers,
                         output_dim=2 * config.hidden_size)

    def states(self, lm_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T, S, D) float32: S = 1 (the top layer) for "last", else the embeddings and each layer."""
        with torch.set_grad_enabled(self.finetune and torch.is_grad_enabled()):
            states = self.lm(lm_ids, mask)
        if self.layers == "mix":
            states = [torch.cat([states[0], states[0]], dim=-1)] + states[1:]  # the embeddings as [e | e]
        else:
            states = states[-1:]
        stack = torch.stack(states, dim=2)  # (B, T, S, D)
        return torch.where(mask[:, :, None, None], stack, stack.new_zeros(()))
