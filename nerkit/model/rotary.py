"""Rotary position embeddings (RoPE, Su et al. 2021), the one rotation the relative-attention
encoders and the span head share: pairs of a vector's numbers turned by angles proportional to the
position, so that the product of a rotated query and key depends on positions only through their
distance. The two users pair the numbers differently (see `Pairing`), which is part of what their
saved weights mean."""

from __future__ import annotations

from typing import Literal

import torch

# Which numbers of a vector of width d form pair m (m < d/2), each turned by p / 10000^(2m/d):
# "interleaved", (x[2m], x[2m+1]), as the RoPE paper writes it (the Transformer encoders'
# `rotary`); "halves", (x[m], x[m + d/2]), as GlobalPointer's code does (the span head). The two
# are the same rotation of a permuted vector, but a trained projection learnt the pairing it was
# trained with: a model must be read with its own.
Pairing = Literal["interleaved", "halves"]


def rotate(x: torch.Tensor, positions: torch.Tensor, pairing: Pairing) -> torch.Tensor:
    """x (..., N, d), d even, with vector n rotated by its position positions[n] (N,). The angles
    are computed in float64 (exact enough at any length), then cast to x's dtype."""
    dim = x.size(-1)
    inv_freq = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=x.device) / dim)  # (d/2,)
    angles = positions.to(torch.float64)[:, None] * inv_freq  # (N, d/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)  # (N, d/2)
    if pairing == "interleaved":
        first, second = x[..., 0::2], x[..., 1::2]  # (..., N, d/2)
        return torch.stack([first * cos - second * sin, first * sin + second * cos], dim=-1).flatten(-2)
    if pairing == "halves":
        first, second = x[..., : dim // 2], x[..., dim // 2:]  # (..., N, d/2)
        return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)  # (..., N, d)
    raise ValueError(f"pairing {pairing!r}: 'interleaved' or 'halves'")
