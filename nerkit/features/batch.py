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
    lm_ids: torch.Tensor | None = None  # (B, T)
    lm_states: torch.Tensor | None = None  # (B, T, S, D) float32

    def to(self, device) -> "Batch":
        return Batch(**{k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
                        for k, v in self.__dict__.items()})


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
    if examples[0].lm_states is not None:
        states = examples[0].lm_states
        batch.lm_states = torch.zeros(len(examples), width, *states.shape[1:])  # (B, T, S, D) float32
        for b, e in enumerate(examples):
            batch.lm_states[b, :len(e)] = e.lm_states
    elif examples[0].lm_ids is not None:
        batch.lm_ids = _pad([e.lm_ids for e in examples], width)
    return batch


def collate_padded(examples: list[Example], max_rows: int, max_width: int = 0) -> Batch:
    """A prediction batch whose shape comes from a bounded set (`padded_examples`, whose rule the
    ONNX runtime's numpy batches follow too). The mask keeps every padding position out of the results."""
    return collate(*padded_examples(examples, max_rows, max_width))
