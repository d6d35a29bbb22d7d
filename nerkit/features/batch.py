"""Batches: examples padded into tensors with a bool mask (`collate`; for prediction, to one of a few
shapes: `collate_padded`). Length-bucketed batch order (`bucketed_batches`, so that a batch holds
sentences of similar lengths) and the padded shapes are nerkit.features.padding's, torch-free."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nerkit.features.featurizer import Example
from nerkit.features.padding import (  # noqa: F401 (re-exported: batching's torch-free rules)
    bucketed_batches,
    padded_examples,
)


@dataclass
class Batch:
    char_ids: torch.Tensor  # (B, T)
    bichar_ids: torch.Tensor  # (B, T)
    mask: torch.Tensor  # (B, T) bool, True at real characters, left-aligned
    tag_ids: torch.Tensor | None = None  # (B, T)
    word_ids: torch.Tensor | None = None  # (B, W)
    word_heads: torch.Tensor | None = None  # (B, W)
    word_tails: torch.Tensor | None = None  # (B, W)
    word_mask: torch.Tensor | None = None  # (B, W) bool
    lm_ids: torch.Tensor | None = None  # (B, T); (B, N, T) for N stacked sources
    # (B, T, S, D) float32; stacked sources: a tuple of N such (B, T, S_k, D_k), None where a source runs
    lm_states: torch.Tensor | tuple[torch.Tensor | None, ...] | None = None
    # A segment batch of document streams (nerkit.training.streams): each CRF sequence in it, as
    # (row, start, length), and the rows whose document starts here (their memory is dropped).
    pieces: torch.Tensor | None = None  # (N, 3) long
    resets: torch.Tensor | None = None  # (B,) bool
    spans: torch.Tensor | None = None  # (N, 4) long: the span head's gold, as (row, type, start, width - 1)
    known: torch.Tensor | None = None  # (B, T) bool: the annotated characters; None when every one is
    allowed: torch.Tensor | None = None  # (B, T, K) bool: the tags each character may take (a corpus labelled for some types)
    teacher: torch.Tensor | None = None  # (B, T, K) float32: a source model's marginals (zeros: no target there)
    unsure: torch.Tensor | None = None  # (N, 4) long: span cells that are no negative, as `spans`

    def to(self, device) -> "Batch":
        return Batch(**{k: _to(v, device) for k, v in self.__dict__.items()})


def _to(value, device):
    """A tensor, or a tuple of them (stacked sources' states), on `device`."""
    if isinstance(value, tuple):
        return tuple(_to(v, device) for v in value)
    return value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value


def _pad(rows: list[list[int]], width: int) -> torch.Tensor:
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long)


def collate(examples: list[Example], width: int = 0, words: int = 0) -> Batch:
    """The examples padded to the longest, or to `width` characters and `words` lattice words when
    those are larger."""
    width = max(1, width, max(len(e) for e in examples))
    lengths = torch.tensor([len(e) for e in examples])
    mask = torch.arange(width)[None, :] < lengths[:, None]
    batch = Batch(
        char_ids=_pad([e.char_ids for e in examples], width),
        bichar_ids=_pad([e.bichar_ids for e in examples], width),
        mask=mask,
        tag_ids=_pad([e.tag_ids for e in examples], width) if examples[0].tag_ids is not None else None,
    )
    if examples[0].word_ids is not None:
        words = max(1, words, max(len(e.word_ids) for e in examples))
        counts = torch.tensor([len(e.word_ids) for e in examples])
        batch.word_ids = _pad([e.word_ids for e in examples], words)
        batch.word_heads = _pad([e.word_heads for e in examples], words)
        batch.word_tails = _pad([e.word_tails for e in examples], words)
        batch.word_mask = torch.arange(words)[None, :] < counts[:, None]
    first = examples[0]
    if first.spans is not None:
        rows = [(b, *span) for b, e in enumerate(examples) for span in e.spans]
        batch.spans = torch.tensor(rows, dtype=torch.long).reshape(-1, 4)  # (N, 4)
    if any(e.known is not None for e in examples):  # partial labels: padding counts as known
        batch.known = torch.tensor([(e.known or [True] * len(e)) + [True] * (width - len(e)) for e in examples])
    if first.allowed is not None:  # padding allows every tag (it is masked out)
        batch.allowed = torch.ones(len(examples), width, first.allowed.size(1), dtype=torch.bool)
        for b, e in enumerate(examples):
            batch.allowed[b, :len(e)] = e.allowed
    if first.teacher is not None:
        batch.teacher = torch.zeros(len(examples), width, first.teacher.size(1))
        for b, e in enumerate(examples):
            batch.teacher[b, :len(e)] = e.teacher.float()
    if first.unsure is not None:
        rows = [(b, *cell) for b, e in enumerate(examples) for cell in e.unsure]
        batch.unsure = torch.tensor(rows, dtype=torch.long).reshape(-1, 4)  # (N, 4)
    if first.lm_states is not None:
        batch.lm_states = _lm_states([e.lm_states for e in examples], width)
    if first.lm_ids is not None and not _all_cached(first.lm_states):
        batch.lm_ids = _lm_ids([e.lm_ids for e in examples], width)
    return batch


def _lm_ids(rows: list, width: int) -> torch.Tensor:
    """(B, T) language-model ids; (B, N, T) when each row is a tuple of N stacked sources' ids."""
    if isinstance(rows[0], tuple):
        return torch.stack([_pad([r[k] for r in rows], width) for k in range(len(rows[0]))], dim=1)  # (B, N, T)
    return _pad(rows, width)  # (B, T)


def _lm_states(rows: list, width: int):
    """Cached layer states padded to (B, T, S, D) float32; for stacked sources a tuple, one per
    source (None where the source has none)."""
    if isinstance(rows[0], tuple):
        return tuple(_lm_states([r[k] for r in rows], width) if rows[0][k] is not None else None
                     for k in range(len(rows[0])))
    padded = torch.zeros(len(rows), width, *rows[0].shape[1:])  # (B, T, S, D) float32
    for b, states in enumerate(rows):
        padded[b, :len(states)] = states
    return padded


def _all_cached(states) -> bool:
    """Whether cached states stand in for every source, so that no LM ids are needed."""
    if isinstance(states, tuple):
        return all(s is not None for s in states)
    return states is not None


def collate_padded(examples: list[Example], max_rows: int, max_width: int = 0) -> Batch:
    """A prediction batch whose shape comes from a bounded set (`padded_examples`: torch's native
    caches keep one entry per shape). The mask keeps every padding position out of the results."""
    return collate(*padded_examples(examples, max_rows, max_width))
