"""RoPE (nerkit.model.rotary), the one rotation the relative-attention encoders and the span head
share (issue 56, section 4): each pairing against the formula term by term, and the two pairings as
the same rotation of a permuted vector, so that neither user's saved weights change meaning."""

from __future__ import annotations

import math

import pytest
import torch

from nerkit.model.rotary import rotate


def rotate_naive(vector: list[float], position: int, pairs: list[tuple[int, int]]) -> list[float]:
    """Pair m, (a, b) of `pairs`, turned by position * 10000^(-2m/d)."""
    out = list(vector)
    for m, (i, j) in enumerate(pairs):
        angle = position * 10000.0 ** (-2 * m / len(vector))
        a, b = vector[i], vector[j]
        out[i], out[j] = a * math.cos(angle) - b * math.sin(angle), a * math.sin(angle) + b * math.cos(angle)
    return out


PAIRS = {"interleaved": lambda d: [(2 * m, 2 * m + 1) for m in range(d // 2)],
         "halves": lambda d: [(m, m + d // 2) for m in range(d // 2)]}


@pytest.mark.parametrize("pairing", sorted(PAIRS))
def test_each_pairing_equals_the_formula_term_by_term(pairing):
    x = torch.randn(2, 5, 6, dtype=torch.float64)  # (heads, N, d)
    positions = torch.tensor([0, 3, 4, 9, 700])
    got = rotate(x, positions, pairing)
    for h in range(2):
        for n, p in enumerate(positions.tolist()):
            expected = rotate_naive(x[h, n].tolist(), p, PAIRS[pairing](6))
            assert got[h, n].tolist() == pytest.approx(expected, abs=1e-12)


def test_halves_is_the_interleaved_rotation_of_a_permuted_vector():
    d = 8
    x = torch.randn(3, 7, d)
    positions = torch.arange(7)
    interleave = torch.tensor([i for m in range(d // 2) for i in (m, m + d // 2)])  # halves -> interleaved order
    torch.testing.assert_close(rotate(x, positions, "halves")[..., interleave],
                               rotate(x[..., interleave], positions, "interleaved"))
    assert not torch.allclose(rotate(x, positions, "halves"), rotate(x, positions, "interleaved"))


def test_an_unknown_pairing_is_refused():
    with pytest.raises(ValueError, match="pairing"):
        rotate(torch.zeros(1, 2), torch.arange(1), "pairs")
