"""Batches: examples padded into tensors with a bool mask (`collate`; for prediction, to one of a few
shapes: `collate_padded`), and length-bucketed batch order (`bucketed_batches`) so that a batch holds
sentences of similar lengths."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from nerkit.features.featurizer import Example


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


def padded_size(n: int) -> int:
    """`n` rounded up to the next size of the form 2^k or 3 * 2^k (1, 2, 3, 4, 6, 8, 12, 16, 24, 32,
    48, 64, 96, 128, 192, 256, ...): less than half again as large, and two sizes per doubling."""
    if n <= 2:
        return max(n, 1)
    power = 1 << (n - 1).bit_length()  # the least power of two >= n
    return power * 3 // 4 if power * 3 // 4 >= n else power


def collate_padded(examples: list[Example], max_rows: int, max_width: int = 0) -> Batch:
    """A prediction batch whose shape comes from a bounded set, so that what a native library
    keeps per shape (oneDNN's primitive cache, the allocator's blocks) stops growing with the input:
    the rows rounded up by `padded_size`, never past `max_rows`, with copies of the last example
    (whose results the caller drops); the length rounded up likewise, never past `max_width` (0:
    no limit) unless an example is longer; a lattice's words rounded up too. The mask keeps every
    padding position out of the results."""
    rows = len(examples)
    examples = examples + examples[-1:] * (max(rows, min(padded_size(rows), max_rows)) - rows)
    longest = max(len(e) for e in examples)
    width = padded_size(longest) if not max_width else max(longest, min(padded_size(longest), max_width))
    words = padded_size(max(len(e.word_ids) for e in examples)) if examples[0].word_ids is not None else 0
    return collate(examples, width, words)


def bucketed_batches(lengths: list[int], batch_size: int, rng: random.Random | None = None,
                     bucket_factor: int = 50) -> list[list[int]]:
    """Index batches of similar lengths (little padding). With `rng`, the order is shuffled:
    examples within pools of `bucket_factor` batches, then the batches themselves."""
    order = list(range(len(lengths)))
    if rng is not None:
        rng.shuffle(order)
    pool = batch_size * bucket_factor
    batches = []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start:start + pool], key=lambda i: lengths[i])
        batches.extend(chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size))
    if rng is not None:
        rng.shuffle(batches)
    return batches
