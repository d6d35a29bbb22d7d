"""Relative-position attention: TENER (Yan et al. 2019), with the attention of Transformer-XL
(Dai et al. 2019) or Shaw et al. (2018) as options, and the two relative schemes later models settled
on: rotary embeddings (RoPE, Su et al. 2021) and ALiBi's distance-proportional biases (Press et al.
2022; here symmetric, |i - j|, since NER reads both ways). Absolute sinusoids tell attention how far apart two
characters are but not which comes first (P_i . P_{i+k} = P_i . P_{i-k}), and the projections in
attention blur even the distance; NER needs both (a word after "in" is likely a place, one before it is
not). Scoring each pair by its signed distance i - j gives attention distance and direction directly.

One attention module serves them all (`MultiHeadAttention` from attention.py plus a position module
here); the variants differ only in the switches listed in `VARIANTS`. The encoder that stacks it is
`Transformer` in transformer.py (a relative `attention`: nerkit.config.RELATIVE_ATTENTIONS names them). Every scheme here
depends on i - j alone, so each works with Transformer-XL's memory: a query at position M + i of
[memory ; segment] scores key j by the distance M + i - j.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from nerkit.model.encoders.attention import MultiHeadAttention, SinusoidTable


@dataclass(frozen=True)
class Variant:
    key_projection: bool  # keys are W_k x (xl, shaw) or x itself (tener)
    scale: bool  # logits divided by sqrt(head_dim)
    learned_table: bool  # learned rows for distances clipped to [-k, k] (shaw) vs sinusoids of every distance
    position_projection: bool  # W_{k,R} maps d_model-wide sinusoids to per-head position keys (xl)
    global_biases: bool  # u (content) and v (position)
    value_positions: bool  # a^V_ij added to the values (shaw)
    rotary: bool = False  # q and k rotated by their positions (rope); no position table
    alibi: bool = False  # a fixed bias -m_h |i - j| per head (alibi); no position table


# As in each paper, one per name of nerkit.config.RELATIVE_ATTENTIONS. `key_projection` and `scale`
# can be overridden from the config.
VARIANTS = {
    # score = Q_t K_j + Q_t R_{t-j} + u K_j + v R_{t-j}; K = x unprojected, R of width head_dim, unscaled.
    "tener": Variant(
        key_projection=False, scale=False, learned_table=False,
        position_projection=False, global_biases=True, value_positions=False,
    ),
    # score = (q W_kE x_j + q W_kR R_{i-j} + u W_kE x_j + v W_kR R_{i-j}) / sqrt(d); R of width d_model.
    "xl": Variant(
        key_projection=True, scale=True, learned_table=False,
        position_projection=True, global_biases=True, value_positions=False,
    ),
    # score = q (W_k x_j + a^K_ij) / sqrt(d); out = sum_j alpha_ij (W_v x_j + a^V_ij).
    "shaw": Variant(
        key_projection=True, scale=True, learned_table=True,
        position_projection=False, global_biases=False, value_positions=True,
    ),
    # score = rot(q_i, i) . rot(W_k x_j, j) / sqrt(d): the rotation by i - j is all the position there is.
    "rope": Variant(
        key_projection=True, scale=True, learned_table=False,
        position_projection=False, global_biases=False, value_positions=False, rotary=True,
    ),
    # score = q_i . W_k x_j / sqrt(d) - m_h |i - j|, slopes m_h = 2^(-8h/H), h = 1..H.
    "alibi": Variant(
        key_projection=True, scale=True, learned_table=False,
        position_projection=False, global_biases=False, value_positions=False, alibi=True,
    ),
}


class RelativePositions(nn.Module):
    """The position terms of relative attention for every (query i, key j), from a table with one row
    per distance i - j:

        logits(q)_ij   = (q_i + v) . R_{i-j}          (b) + (d)  (v only with `position_bias`)
        values(w)_i    = sum_j w_ij A_{i-j}           Shaw's value term (only with `value_positions`)

    R is a sinusoid of the distance (width head_dim, shared by the heads; or width d_model projected
    per head by W_{k,R} with `projection`), or a learned row for the distance clipped to [-k, k].

    Efficiency: queries meet the table once, (B, H, L, T) with T = 2L-1 distances (2k+1 for a learned
    table), and a gather picks each pair's distance, (B, H, L, L). The value term goes the other way:
    attention weights are summed into distance buckets with scatter_add, then times the (T, d) table.
    Nothing of shape (L, L, d) is ever built.

    Distances are i - j throughout (TENER's and XL's R_{t-j}); Shaw writes w_{clip(j-i)}, which is the
    same learned table read in reverse.
    """

    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        *,
        learned_table: bool,
        max_distance: int = 16,
        projection: bool = False,
        position_bias: bool = False,
        value_positions: bool = False,
    ):
        super().__init__()
        if learned_table and projection:
            raise ValueError("a learned table needs no projection: its rows are already free parameters")
        d_model = n_heads * head_dim
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.max_distance = max_distance if learned_table else None
        if learned_table:
            if max_distance < 1:  # the config checks this for users
                raise ValueError(f"max_relative_distance must be at least 1, got {max_distance}")
            rows = 2 * max_distance + 1
            self.sinusoids = None
            self.key_table = nn.Parameter(nn.init.xavier_normal_(torch.empty(rows, head_dim)))  # a^K
            self.value_table = (  # a^V
                nn.Parameter(nn.init.xavier_normal_(torch.empty(rows, head_dim))) if value_positions else None
            )
        else:
            if value_positions:
                raise ValueError("value-side positions need a learned table")
            self.sinusoids = SinusoidTable(d_model if projection else head_dim)
            self.key_table = None
            self.value_table = None
        self.projection = nn.Linear(d_model, d_model, bias=False) if projection else None  # W_{k,R}
        self.position_bias = (  # v
            nn.Parameter(nn.init.xavier_normal_(torch.empty(n_heads, head_dim))) if position_bias else None
        )

    def distance_index(self, length: int, device: torch.device, key_length: int | None = None) -> torch.Tensor:
        """Table row of each (i, j): (L, K) long, K = key_length (default L), the queries being the last
        L of the K positions. Rows run over distances -(L-1)..(K-1) (sinusoids) or -k..k (learned,
        clipped)."""
        keys = key_length or length
        distance = distances(length, keys, device)  # (L, K): i - j
        if self.max_distance is not None:
            return distance.clamp(-self.max_distance, self.max_distance) + self.max_distance
        return distance + (length - 1)

    def key_rows(self, length: int, like: torch.Tensor, key_length: int | None = None) -> torch.Tensor:
        """Position keys per table row: (1 or H, T, d)."""
        if self.key_table is not None:
            return self.key_table[None]  # (1, 2k+1, d): shared by the heads
        table = self.sinusoids(-(length - 1), key_length or length, like)  # (L+K-1, d or d_model)
        if self.projection is None:
            return table[None]  # (1, L+K-1, d)
        keys = self.projection(table)  # (L+K-1, d_model)
        return keys.view(-1, self.n_heads, self.head_dim).transpose(0, 1)  # (H, L+K-1, d)

    def logits(self, q: torch.Tensor, spans=None, key_length: int | None = None) -> torch.Tensor:
        # q (B, H, L, d); no spans needed: distances come from the character positions.
        batch, heads, length, _ = q.shape
        keys = key_length or length
        position_q = q if self.position_bias is None else q + self.position_bias[:, None, :]  # (B, H, L, d)
        by_distance = position_q @ self.key_rows(length, q, keys).transpose(-1, -2)  # (B, H, L, T)
        index = self.distance_index(length, q.device, keys).expand(batch, heads, length, keys)
        return by_distance.gather(-1, index)  # (B, H, L, K)

    def values(self, weights: torch.Tensor) -> torch.Tensor | None:
        # weights (B, H, L, K) -> (B, H, L, d): sum_j w_ij A_{i-j} = sum_r (sum_{j in bucket r} w_ij) A_r.
        if self.value_table is None:
            return None
        batch, heads, length, keys = weights.shape
        index = self.distance_index(length, weights.device, keys).expand(batch, heads, length, keys)
        buckets = weights.new_zeros(batch, heads, length, self.value_table.size(0))  # (B, H, L, 2k+1)
        buckets = buckets.scatter_add(-1, index, weights)
        return buckets @ self.value_table  # (B, H, L, d)


def distances(length: int, key_length: int, device: torch.device) -> torch.Tensor:
    """i - j for the L queries that end a sequence of K keys: (L, K) long. With K = L, the square of
    every pair; with memory, query i is at position K - L + i."""
    queries = torch.arange(key_length - length, key_length, device=device)
    return queries[:, None] - torch.arange(key_length, device=device)[None, :]


class ALiBiPositions(nn.Module):
    """ALiBi's position term: logits(q)_ij = -m_h |i - j| with the geometric slopes m_h = 2^(-8h/H)
    of the paper (h = 1..H), fixed, not learned; no value term. Nothing to save: a function of H. It
    is added to the scaled scores, as in the paper (`after_scale`)."""

    after_scale = True

    def __init__(self, n_heads: int):
        super().__init__()
        self.slopes = [2.0 ** (-8.0 * h / n_heads) for h in range(1, n_heads + 1)]

    def logits(self, q: torch.Tensor, spans=None, key_length: int | None = None) -> torch.Tensor:
        length = q.size(2)
        far = distances(length, key_length or length, q.device).abs().to(q.dtype)  # (L, K)
        slopes = torch.tensor(self.slopes, dtype=q.dtype, device=q.device)  # (H,)
        return -(slopes[:, None, None] * far)[None]  # (1, H, L, K)

    def values(self, weights: torch.Tensor) -> None:
        return None


def relative_attention(
    variant: Variant, n_heads: int, head_dim: int, attn_dropout: float, max_distance: int = 16
) -> MultiHeadAttention:
    """The one multi-head relative attention, configured as `variant` says."""
    if variant.rotary or variant.alibi:
        return MultiHeadAttention(
            n_heads, head_dim, attn_dropout, key_projection=variant.key_projection, scale=variant.scale,
            positions=ALiBiPositions(n_heads) if variant.alibi else None, rotary=variant.rotary,
        )
    positions = RelativePositions(
        n_heads,
        head_dim,
        learned_table=variant.learned_table,
        max_distance=max_distance,
        projection=variant.position_projection,
        position_bias=variant.global_biases,
        value_positions=variant.value_positions,
    )
    return MultiHeadAttention(
        n_heads,
        head_dim,
        attn_dropout,
        key_projection=variant.key_projection,
        content_bias=variant.global_biases,
        scale=variant.scale,
        positions=positions,
    )
