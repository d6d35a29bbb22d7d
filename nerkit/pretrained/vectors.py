"""Static vectors: normalise rows, measure how much of a vocabulary they cover, and check a
configured width against a file's. Their files are read and written by nerkit.data.word2vec (the
names below are imported from there, so that `nerkit.pretrained.vectors` offers the whole of it).

Everything here works on plain numpy arrays; turning vectors into embedding tables is the training
build's job, and training them is nerkit.tools.resources.vectors'.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from nerkit.data.word2vec import Vectors
from nerkit.errors import UserError


def check_dim(vectors: Vectors, expected: int | None, setting: str) -> None:
    """Refuse a configured dimension (`setting`, e.g. `embeddings.char_dim`) that is not the file's."""
    if expected is not None and expected != vectors.dim:
        raise UserError(
            f"the vector file has dimension {vectors.dim}, but the config's {setting} is {expected}",
            where=vectors.path,
            fix=f"set {setting} to {vectors.dim} (or leave it out: the dimension is read from the file)",
        )



# ---- arithmetic ---------------------------------------------------------------------------------


def normalize_rows(matrix: np.ndarray) -> np.ndarray:
    """Each row scaled to unit length; a zero row stays zero (TENER and FLAT's StaticEmbedding
    divide by norm + 1e-12 the same way)."""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)  # (N, 1)
    return matrix / np.where(norms > 0, norms, 1.0).astype(np.float32)


@dataclass(frozen=True)
class Coverage:
    types: int
    types_found: int
    occurrences: int
    occurrences_found: int

    @property
    def type_rate(self) -> float:
        return self.types_found / self.types if self.types else 0.0

    @property
    def occurrence_rate(self) -> float:
        return self.occurrences_found / self.occurrences if self.occurrences else 0.0

    def __str__(self) -> str:
        return (f"types {self.types_found:,}/{self.types:,} ({100 * self.type_rate:.2f}%), "
                f"occurrences {self.occurrences_found:,}/{self.occurrences:,} ({100 * self.occurrence_rate:.2f}%)")


def coverage(counts: Counter, words: Iterable[str]) -> Coverage:
    """How many token types of a corpus (`counts`: token -> occurrences) have a vector, and how many
    of their occurrences."""
    vocabulary = words if isinstance(words, (set, frozenset, dict)) else set(words)
    found = [n for token, n in counts.items() if token in vocabulary and n > 0]
    return Coverage(sum(1 for n in counts.values() if n > 0), len(found),
                    sum(n for n in counts.values() if n > 0), sum(found))


