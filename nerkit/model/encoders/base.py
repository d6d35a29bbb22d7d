"""What every encoder is: the `Encoder` interface, and `LatticeWords`, what a lattice encoder (FLAT)
receives beyond the characters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class LatticeWords:
    """The lexicon words matched in each sentence of a batch, embedded, with the character positions
    where each starts (head) and ends (tail, inclusive)."""

    words: torch.Tensor  # (B, W, D_word)
    heads: torch.Tensor  # (B, W) long
    tails: torch.Tensor  # (B, W) long, inclusive
    mask: torch.Tensor  # (B, W) bool


class Encoder(Protocol):
    """Built as `cls(input_dim, options, word_dim)` (`word_dim`: the lattice words' width, for an
    encoder that `uses_lattice`); maps the embedded characters x (B, T, input_dim) with their mask
    (B, T) bool, left-aligned, to (B, T, output_dim). Padding positions come out as zeros."""

    output_dim: int
    uses_lattice: bool

    def __call__(self, x: torch.Tensor, mask: torch.Tensor, lattice: LatticeWords | None = None) -> torch.Tensor: ...
