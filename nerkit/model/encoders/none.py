"""No encoder: the embeddings go straight to the emission layer. With language-model features this
is the usual "LM + CRF" tagger (`encoder.name: none`)."""

from __future__ import annotations

import torch
from torch import nn

from nerkit.config import NoEncoderOptions
from nerkit.model.encoders.base import LatticeWords


class NoEncoder(nn.Module):
    uses_lattice = False

    def __init__(self, input_dim: int, config: NoEncoderOptions, word_dim: int = 0):
        super().__init__()
        self.output_dim = input_dim

    def forward(self, x: torch.Tensor, mask: torch.Tensor, lattice: LatticeWords | None = None) -> torch.Tensor:
        return x.masked_fill(~mask[..., None], 0.0)  # (B, T, D), padding as zeros
