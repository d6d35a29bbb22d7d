"""Batching without torch: which examples go together (`bucketed_batches` for torch's batches,
`budgeted_batches` for ONNX Runtime's), the few shapes a torch prediction batch is padded to
(`padded_examples`), and a batch as padded numpy arrays (`collate_arrays`) for a runtime that does
not load torch (the ONNX runtime). nerkit.features.batch builds torch tensors by the same rules."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np

from nerkit.shapes import padded_size

if TYPE_CHECKING:
    from nerkit.features.featurizer import Example


def padded_examples(examples: list[Example], max_rows: int, max_width: int = 0) -> tuple[list[Example], int, int]:
    """A prediction batch's shape from a bounded set, so that what a native library keeps per shape
    (oneDNN's primitive cache, the allocator's blocks) stops growing with the input: the rows rounded
    up by `padded_size`, never past `max_rows`, with copies of the last example (whose results the
    caller drops); the length rounded up likewise, never past `max_width` (0: no limit) unless an
    example is longer; a lattice's words rounded up too. Returns (examples, width, words)."""
    rows = len(examples)
    examples = examples + examples[-1:] * (max(rows, min(padded_size(rows), max_rows)) - rows)
    longest = max(len(e) for e in examples)
    width = padded_size(longest) if not max_width else max(longest, min(padded_size(longest), max_width))
    words = padded_size(max(len(e.word_ids) for e in examples)) if examples[0].word_ids is not None else 0
    return examples, width, words


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


def budgeted_batches(lengths: list[int], max_rows: int, max_chars: int) -> list[list[int]]:
    """Index batches in length order, each of at most `max_rows` examples and, padded to its longest,
    at most `max_chars` characters (an example longer than that is a batch alone): many short texts
    go together and long ones few at a time, so a runtime that takes any shape (ONNX Runtime) pads
    little and reads each batch in few steps."""
    batches: list[list[int]] = []
    batch: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if batch and (len(batch) >= max_rows or (len(batch) + 1) * lengths[i] > max_chars):
            batches.append(batch)
            batch = []
        batch.append(i)
    if batch:
        batches.append(batch)
    return batches


def _pad(rows: list[list[int]], width: int) -> np.ndarray:
    padded = np.zeros((len(rows), width), dtype=np.int64)
    for b, row in enumerate(rows):
        padded[b, :len(row)] = row
    return padded


def collate_arrays(examples: list[Example], width: int = 0, words: int = 0) -> dict[str, np.ndarray]:
    """What `nerkit.features.batch.collate` gives, as int64 / bool numpy arrays by the same names
    (char_ids, bichar_ids, mask; word_ids, word_heads, word_tails, word_mask for a lattice; lm_ids
    for a language model), padded to the longest or to `width` and `words` when those are larger."""
    width = max(1, width, max(len(e) for e in examples))
    lengths = np.array([len(e) for e in examples])
    arrays = {"char_ids": _pad([e.char_ids for e in examples], width),
              "bichar_ids": _pad([e.bichar_ids for e in examples], width),
              "mask": np.arange(width)[None, :] < lengths[:, None]}
    if examples[0].word_ids is not None:
        words = max(1, words, max(len(e.word_ids) for e in examples))
        counts = np.array([len(e.word_ids) for e in examples])
        arrays["word_ids"] = _pad([e.word_ids for e in examples], words)
        arrays["word_heads"] = _pad([e.word_heads for e in examples], words)
        arrays["word_tails"] = _pad([e.word_tails for e in examples], words)
        arrays["word_mask"] = np.arange(words)[None, :] < counts[:, None]
    if examples[0].lm_ids is not None:
        arrays["lm_ids"] = _pad([e.lm_ids for e in examples], width)
    return arrays
