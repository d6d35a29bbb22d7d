"""The Transformer encoder, with a switch for how attention sees positions (`attention`):

* `absolute`: the vanilla Transformer (Vaswani et al. 2017), sinusoids of the absolute positions added
  to the input and scaled dot-product attention; the baseline TENER improves on.
* `tener`, `xl`, `shaw`: no absolute positions; every pair of characters is scored by its signed
  distance, as TENER (Yan et al. 2019), Transformer-XL (Dai et al. 2019) or Shaw et al. (2018) do
  (the switches of each are in `relative.VARIANTS`).

Either way: a projection of the embeddings to d_model, then post-norm blocks (`attention.py`).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from nerkit.config import TransformerOptions
from nerkit.model.encoders.attention import (
    MultiHeadAttention,
    SinusoidTable,
    encoder_layers,
)
from nerkit.model.encoders.base import LatticeWords
from nerkit.model.encoders.relative import VARIANTS, relative_attention


class Transformer(nn.Module):
    uses_lattice = False

    def __init__(self, input_dim: int, config: TransformerOptions, word_dim: int = 0):
        super().__init__()
        d_model = config.n_heads * config.head_dim
        self.input_projection = nn.Linear(input_dim, d_model)
        if config.attention == "absolute":
            self.positions = SinusoidTable(d_model)
            make_attention = lambda: MultiHeadAttention(  # noqa: E731
                config.n_heads, config.head_dim, config.attn_dropout,
                key_projection=config.key_projection is not False, scale=config.scale is not False)
        else:
            self.positions = None  # every position signal comes from the relative terms
            variant = VARIANTS[config.attention]
            for name in ("key_projection", "scale"):  # None keeps the paper's choice
                if getattr(config, name) is not None:
                    variant = dataclasses.replace(variant, **{name: getattr(config, name)})
            make_attention = lambda: relative_attention(  # noqa: E731
                variant, config.n_heads, config.head_dim, config.attn_dropout,
                max_distance=config.max_relative_distance)
        self.layers = encoder_layers(make_attention, d_model, config.ff_ratio, config.dropout, config.num_layers)
        self.output_dim = d_model

    def forward(self, x: torch.Tensor, mask: torch.Tensor, lattice: LatticeWords | None = None) -> torch.Tensor:
        # x (B, T, D), mask (B, T) bool, left-aligned, so position t is the t-th character; no lattice.
        x = self.input_projection(x)  # (B, T, d_model)
        if self.positions is not None:
            x = x + self.positions(0, x.size(1), like=x)
        for layer in self.layers:
            x = layer(x, mask)
        return x.masked_fill(~mask[..., None], 0.0)  # padding reads as zeros, as from the BiLSTM
