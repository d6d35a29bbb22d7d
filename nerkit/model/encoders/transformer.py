"""The Transformer encoder, with a switch for how attention sees positions (`attention`):

* `absolute`: the vanilla Transformer (Vaswani et al. 2017), sinusoids of the absolute positions added
  to the input and scaled dot-product attention; the baseline TENER improves on.
* `learned`: a learned row per absolute position added to the input instead (BERT's way).
* `tener`, `xl`, `shaw`, `rope`, `alibi`: no absolute positions; every pair of characters is scored by
  its signed distance, as TENER (Yan et al. 2019), Transformer-XL (Dai et al. 2019), Shaw et al.
  (2018), rotary embeddings or ALiBi do (the switches of each are in `relative.VARIANTS`).

Either way: a projection of the embeddings to d_model, then post-norm blocks (`attention.py`).

With `memory` (relative attentions only), a text longer than `segment` characters is read segment
by segment as Transformer-XL reads a document: each layer attends over the `memory` positions before
the segment as well as the segment, from a cache of that layer's inputs to the previous segments that
no gradient flows into. Attention then costs O(T (segment + memory)) instead of O(T^2).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from nerkit.config import ABSOLUTE_ATTENTIONS, TransformerOptions
from nerkit.model.encoders.attention import (
    MultiHeadAttention,
    SinusoidTable,
    encoder_layers,
)
from nerkit.model.encoders.base import LatticeWords
from nerkit.model.encoders.relative import VARIANTS, relative_attention

# One layer's memory: the states (B, M, d_model) of the M positions before the next segment, and
# which of them are real characters (B, M) bool.
Memory = tuple[torch.Tensor, torch.Tensor]


class Transformer(nn.Module):
    uses_lattice = False

    def __init__(self, input_dim: int, config: TransformerOptions, word_dim: int = 0):
        super().__init__()
        d_model = config.n_heads * config.head_dim
        self.input_projection = nn.Linear(input_dim, d_model)
        self.positions = None  # absolute positions added to the input, if any
        self.learned_positions = None
        if config.attention in ABSOLUTE_ATTENTIONS:
            if config.attention == "absolute":
                self.positions = SinusoidTable(d_model)
            else:
                self.learned_positions = nn.Embedding(config.max_positions, d_model)
            make_attention = lambda: MultiHeadAttention(  # noqa: E731
                config.n_heads, config.head_dim, config.attn_dropout,
                key_projection=config.key_projection is not False, scale=config.scale is not False)
        else:
            variant = VARIANTS[config.attention]
            for name in ("key_projection", "scale"):  # None keeps the paper's choice
                if getattr(config, name) is not None:
                    variant = dataclasses.replace(variant, **{name: getattr(config, name)})
            make_attention = lambda: relative_attention(  # noqa: E731
                variant, config.n_heads, config.head_dim, config.attn_dropout,
                max_distance=config.max_relative_distance)
        self.layers = encoder_layers(make_attention, d_model, config.ff_ratio, config.dropout, config.num_layers)
        self.memory = config.memory
        self.segment = config.segment
        self.output_dim = d_model

    def forward(self, x: torch.Tensor, mask: torch.Tensor, lattice: LatticeWords | None = None) -> torch.Tensor:
        # x (B, T, D), mask (B, T) bool, left-aligned, so position t is the t-th character; no lattice.
        if not self.memory or x.size(1) <= self.segment:
            return self.encode(x, mask)[0]
        outputs, memory = [], None
        for start in range(0, x.size(1), self.segment):
            piece = slice(start, start + self.segment)
            out, memory = self.encode(x[:, piece], mask[:, piece], memory)
            outputs.append(out)
        return torch.cat(outputs, dim=1)  # (B, T, d_model)

    def encode(self, x: torch.Tensor, mask: torch.Tensor, memory: list[Memory] | None = None,
               keep: int | None = None) -> tuple[torch.Tensor, list[Memory] | None]:
        """One segment, Transformer-XL's step (`forward` runs it over a text; document training and
        streamed prediction call it directly): x (B, L, D), mask (B, L), and each layer's memory of
        what came before (None: the start of every row's text). Returns the segment's output
        (B, L, d_model), padding as zeros, and the memory for the next segment: per layer, the last
        `memory` of [its memory ; its input here], detached (the paper's stop-gradient), or None
        when memory is off. With `keep`, only the first `keep` positions are the segment and go
        into the memory; the rest are a look-ahead that the next segment reads again."""
        x = self.input_projection(x)  # (B, L, d_model)
        if self.positions is not None:
            x = x + self.positions(0, x.size(1), like=x)
        if self.learned_positions is not None:
            if x.size(1) > self.learned_positions.num_embeddings:
                raise ValueError(f"learned positions end at {self.learned_positions.num_embeddings}, "
                                 f"the input has {x.size(1)}")
            x = x + self.learned_positions.weight[: x.size(1)]
        kept = [] if self.memory else None
        for k, layer in enumerate(self.layers):
            state, state_mask = memory[k] if memory else (None, None)
            if kept is not None:
                kept.append(_remember(state, state_mask, x[:, :keep], mask[:, :keep], self.memory))
            x = layer(x, mask, None, state, state_mask)
        return x.masked_fill(~mask[..., None], 0.0), kept  # padding reads as zeros, as from the BiLSTM


def forget(memory: list[Memory] | None, rows: torch.Tensor | None) -> list[Memory] | None:
    """`memory` with the rows where `rows` (B,) bool is True emptied: every position masked, so the
    next segment of those rows attends to nothing before it, as at the start of a text (a new
    document starts in that row while the others read on)."""
    if memory is None or rows is None or not bool(rows.any()):
        return memory
    return [(states, state_mask & ~rows[:, None]) for states, state_mask in memory]  # (B, M, d), (B, M)


def _remember(state: torch.Tensor | None, state_mask: torch.Tensor | None, x: torch.Tensor, mask: torch.Tensor,
               size: int) -> Memory:
    """The last `size` real positions of [state ; x], without gradient: what the next segment attends
    to. They are right-aligned (a row's padding, if any, comes first), so the last of them sits just
    before the next segment's first character whatever each row's segment length was: relative
    distances, counted by index across [memory ; segment], stay true for streams read side by side."""
    if state is not None:
        x, mask = torch.cat([state, x], dim=1), torch.cat([state_mask, mask], dim=1)  # (B, M + L, d), (B, M + L)
    if not bool(mask[:, -1].all()):  # some row ends in padding: move it to the front, keeping the order
        order = torch.sort(mask.to(torch.int8), dim=1, stable=True).indices  # (B, M + L): padding, then real
        x, mask = x.gather(1, order[..., None].expand_as(x)), mask.gather(1, order)
    return x[:, -size:].detach(), mask[:, -size:]
