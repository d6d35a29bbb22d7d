"""The attention core every Transformer encoder here shares: sinusoids of integer positions, multi-head
self-attention whose logits take a pluggable position term (absolute, relative, or FLAT's lattice
distances), and the post-norm block. Nothing here knows a particular paper; `relative.py` and
`flat.py` supply the position terms and `transformer.py` and `flat.py` stack the blocks."""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from nerkit.model.rotary import rotate


@dataclass
class NodeSpans:
    """Head and tail character positions of every node of a flat lattice (characters first, then
    words): (B, L) long each, tails inclusive. The first `chars` nodes are characters, whose head is
    their tail. Attention passes it through to its position term (FLAT's); others ignore it."""

    heads: torch.Tensor
    tails: torch.Tensor
    chars: int = 0


def sinusoid(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Vaswani's encoding of integer positions (negative ones too): (N,) -> (N, dim), interleaved as
    P[2m] = sin(p / 10000^(2m/dim)), P[2m+1] = cos(p / 10000^(2m/dim)). Computed in float64."""
    inv_freq = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
    angles = positions.to(torch.float64)[:, None] * inv_freq  # (N, dim/2)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # (N, dim)


class SinusoidTable(nn.Module):
    """Sinusoids of the positions -radius..radius, computed once and regrown when a longer input
    arrives, so lengths never seen in training work. The master copy is float64 on the CPU (a float32
    table cast up would be off by 1e-7) and is cast to the input's dtype, then device, on first use
    there. Plain attributes, not buffers: a pure function of `dim`, never saved with the model."""

    def __init__(self, dim: int, radius: int = 256):
        super().__init__()
        if dim % 2:  # the config checks this for every encoder; a direct caller gets a plain error
            raise ValueError(f"sinusoidal positions need an even width, got {dim}")
        self.dim = dim
        self.radius = radius
        self.table = sinusoid(torch.arange(-radius, radius + 1), dim)  # (2 * radius + 1, dim) float64
        self._cast = self.table  # the table as the last input's dtype and device

    def forward(self, start: int, end: int, like: torch.Tensor) -> torch.Tensor:
        """Rows for the positions start, ..., end - 1, as `like`'s dtype and device: (end - start, dim)."""
        if torch.compiler.is_exporting():  # an ONNX graph (`nerkit export`) computes them for any length
            return sinusoid(torch.arange(start, end, device=like.device), self.dim).to(like.dtype)
        needed = max(-start, end - 1)
        if needed > self.radius:
            # Grow geometrically so that a slowly lengthening stream of inputs does not recompute every time.
            self.radius = max(needed, 2 * self.radius)
            self.table = sinusoid(torch.arange(-self.radius, self.radius + 1), self.dim)
            self._cast = self.table
        if (self._cast.dtype, self._cast.device) != (like.dtype, like.device):
            # dtype first: some devices (MPS) hold no float64.
            self._cast = self.table.to(dtype=like.dtype).to(like.device)
        return self._cast[start + self.radius : end + self.radius]


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention whose logits are a content score plus, optionally, position scores
    from a pluggable `positions` module:

        logit_ij = s * ( (q_i + u) . k_j  +  positions.logits(q)_ij )       (a) + (c)  +  (b) + (d)
        out_i    = W_o [ sum_j softmax_j(logit_ij) v_j  +  positions.values(weights)_i ]

    with q = W_q x, k = W_k x (or x itself when `key_projection` is off, as TENER does), v = W_v x and
    s = 1/sqrt(head_dim) when `scale` is on. The vanilla Transformer uses (a) alone; the relative
    encoders add the global content bias u (`content_bias`) and a `RelativePositions` module; RoPE
    (`rotary`) rotates q and k by their positions before (a).

    Memory (Transformer-XL's segment recurrence): given `memory` (B, M, d_model), the states of the
    M positions just before x, keys and values run over [memory ; x] while queries are x's alone, so
    the logits are (B, H, L, M + L) and query i sits at position M + i of that sequence.

    The seam for FLAT: `positions` is any module with `logits(q, spans) -> (B, H, L, L)` (terms that
    depend on where i and j are) and `values(weights) -> (B, H, L, head_dim) | None` (a value-side
    position term, or None). FLAT supplies one built from its four lattice distances and reuses
    (a), (c), masking, softmax and the output projection from here unchanged.

    q, k, v projections carry no bias so that the terms stay separate: a query bias b would add the
    content score b . k_j, which is exactly what u is for.
    """

    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        attn_dropout: float,
        key_projection: bool = True,
        content_bias: bool = False,
        scale: bool = True,
        positions: nn.Module | None = None,
        rotary: bool = False,
    ):
        super().__init__()
        d_model = n_heads * head_dim
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.query = nn.Linear(d_model, d_model, bias=False)
        self.key = nn.Linear(d_model, d_model, bias=False) if key_projection else None
        self.value = nn.Linear(d_model, d_model, bias=False)
        self.output = nn.Linear(d_model, d_model)
        self.content_bias = (  # u
            nn.Parameter(nn.init.xavier_normal_(torch.empty(n_heads, head_dim))) if content_bias else None
        )
        self.positions = positions
        self.rotary = rotary
        if rotary and head_dim % 2:
            raise ValueError(f"rotary positions need an even head_dim, got {head_dim}")
        self.scale = 1.0 / math.sqrt(head_dim) if scale else 1.0
        self.dropout = nn.Dropout(attn_dropout)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, L, d)

    def logits(self, x: torch.Tensor, spans: NodeSpans | None = None, memory: torch.Tensor | None = None) -> torch.Tensor:
        """Pre-softmax scores of every (query i, key j) pair, scaled, before masking: (B, H, L, L), or
        (B, H, L, M + L) over [memory ; x]."""
        context = x if memory is None else torch.cat([memory, x], dim=1)  # (B, K, d_model), K = M + L
        q = self._split_heads(self.query(x))  # (B, H, L, d)
        k = self._split_heads(self.key(context) if self.key is not None else context)  # (B, H, K, d)
        if self.rotary:
            keys = k.size(2)
            # The RoPE paper's pairing, (2m, 2m + 1): what these encoders' saved weights were trained with.
            k = rotate(k, torch.arange(keys, device=x.device), pairing="interleaved")
            queries = torch.arange(keys - x.size(1), keys, device=x.device)  # queries end the sequence
            q = rotate(q, queries, pairing="interleaved")
        content_q = q if self.content_bias is None else q + self.content_bias[:, None, :]
        # In place from here on: backward needs none of these (B, H, L, K) intermediates, and at
        # L = 400 each one is tens of MiB.
        logits = content_q @ k.transpose(-1, -2)  # (B, H, L, K): (a) + (c)
        if self.positions is None:
            return logits.mul_(self.scale)
        terms = (self.positions.logits(q, spans) if memory is None  # (B, H, L, K): (b) + (d)
                 else self.positions.logits(q, spans, key_length=k.size(2)))
        if getattr(self.positions, "after_scale", False):  # a bias added to the scaled scores (ALiBi)
            return logits.mul_(self.scale).add_(terms)
        return logits.add_(terms).mul_(self.scale)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, spans: NodeSpans | None = None,
                memory: torch.Tensor | None = None, memory_mask: torch.Tensor | None = None) -> torch.Tensor:
        # x (B, L, d_model), mask (B, L) bool; memory (B, M, d_model) and memory_mask (B, M) bool, or None.
        logits = self.logits(x, spans, memory)  # (B, H, L, K)
        key_mask = mask if memory is None else torch.cat([memory_mask, mask], dim=1)  # (B, K)
        # A finite large negative rather than -inf: padding keys get exactly zero weight in every real
        # row, and an all-padding row (a padded query of an empty sentence) stays finite (uniform).
        logits.masked_fill_(~key_mask[:, None, None, :], torch.finfo(logits.dtype).min)
        weights = self.dropout(logits.softmax(dim=-1))  # (B, H, L, K)
        context = x if memory is None else torch.cat([memory, x], dim=1)  # (B, K, d_model)
        out = weights @ self._split_heads(self.value(context))  # (B, H, L, d)
        if self.positions is not None:
            value_positions = self.positions.values(weights)  # (B, H, L, d) or None
            if value_positions is not None:
                out = out + value_positions
        batch, length, _ = x.shape
        return self.output(out.transpose(1, 2).reshape(batch, length, -1))  # (B, L, d_model)


@contextmanager
def recorded_attention(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Inside the block, every forward pass of each `MultiHeadAttention` in `model` appends its
    attention weights, the softmax output, (B, H, L, L), to the yielded list, in the order the
    modules run (layer by layer). A forward hook on the module's attention dropout reads them as they
    pass, so the attention's arithmetic is untouched; call it in eval mode, where that dropout is
    the identity and what is recorded is exactly what weighs the values."""
    weights: list[torch.Tensor] = []
    hooks = [module.dropout.register_forward_hook(lambda _m, inputs, _out: weights.append(inputs[0].detach()))
             for module in model.modules() if isinstance(module, MultiHeadAttention)]
    try:
        yield weights
    finally:
        for hook in hooks:
            hook.remove()


class EncoderLayer(nn.Module):
    """Post-norm block (Vaswani; TENER's `after_norm`):
    x = LN(x + drop(attention(x))), then x = LN(x + drop(feed_forward(x)))."""

    def __init__(self, attention: MultiHeadAttention, d_model: int, ff_dim: int, dropout: float):
        super().__init__()
        self.attention = attention
        self.attention_norm = nn.LayerNorm(d_model)
        self.feed_forward = nn.Sequential(
            nn.Linear(d_model, ff_dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ff_dim, d_model)
        )
        self.feed_forward_norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, spans: NodeSpans | None = None,
                memory: torch.Tensor | None = None, memory_mask: torch.Tensor | None = None) -> torch.Tensor:
        attended = self.attention(x, mask, spans, memory, memory_mask)  # (B, L, d_model)
        x = self.attention_norm(x + self.dropout(attended))  # (B, L, d_model)
        return self.feed_forward_norm(x + self.dropout(self.feed_forward(x)))  # (B, L, d_model)


def feed_forward_dim(d_model: int, ff_ratio: float) -> int:
    return max(1, round(ff_ratio * d_model))


def encoder_layers(make_attention, d_model: int, ff_ratio: float, dropout: float, num_layers: int) -> nn.ModuleList:
    """`num_layers` post-norm blocks, each with its own attention from `make_attention()`."""
    ff_dim = feed_forward_dim(d_model, ff_ratio)
    return nn.ModuleList(EncoderLayer(make_attention(), d_model, ff_dim, dropout) for _ in range(num_layers))
