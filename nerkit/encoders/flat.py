"""FLAT, the Flat-Lattice Transformer (Li et al., ACL 2020): characters and the lexicon words matched
in the sentence are one flat sequence of nodes, each with a head and a tail character position, and
attention sees every pair of nodes through four relative distances between their heads and tails.

The attention is `MultiHeadAttention` from transformer.py with `LatticePositions` (below) as its
position term; this file holds only what is FLAT's own: the nodes, the fused distances and the
memory-bounded way of scoring them.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from nerkit.encoders.transformer import EncoderLayer, MultiHeadAttention, SinusoidTable, feed_forward_dim
from nerkit.errors import ConfigError

# Which of the four head/tail distances each fusion feeds to W_r, in this order (the column blocks of
# W_r follow it): the paper's eq. (8) uses all four; the official code's default (`ff_two`) only
# head-head and tail-tail.
FUSIONS = {
    "four": ("hh", "ht", "th", "tt"),
    "two": ("hh", "tt"),
}


@dataclass
class NodeSpans:
    """Head and tail character positions of every node (characters first, then words): (B, L) long
    each, tails inclusive; a character's head and tail are its own position."""

    heads: torch.Tensor
    tails: torch.Tensor


class LatticePositions(nn.Module):
    """FLAT's position term of attention, for every (query node i, key node j):

        d_hh = head_i - head_j,  d_ht = head_i - tail_j,  d_th = tail_i - head_j,  d_tt = tail_i - tail_j
        R_ij = ReLU(W_r [P(d_hh); P(d_ht); P(d_th); P(d_tt)] + b_r)            (fusion `four`, eq. 8)
        R_ij = ReLU(W_r [P(d_hh); P(d_tt)] + b_r)                              (fusion `two`)
        logits(q)_ij = (q_i + v) . W_R^h R_ij   per head h                    (b) + (d) of eq. 11

    with P the d_model-wide sinusoid of a distance. Nothing of shape (L, L, k * d_model) is built:

    * W_r = [W_hh | W_ht | W_th | W_tt] acts on a concatenation, so W_r [P_a; P_b; ...] = W_a P_a +
      W_b P_b + ...; each block is applied once to the table of the 2P - 1 possible distances
      (A_k = table @ W_k^T), and a pair's pre-activation is a sum of gathered rows of A_k, plus b_r.
    * (q_i + v) . W_R^h R_ij = ((W_R^h)^T (q_i + v)) . R_ij: the queries are moved into R's space
      once, (B, H, L, d_model), instead of projecting every R_ij into every head.
    * Query rows are processed in blocks of `chunk`, so at most (B, chunk, L, d_model) of R exists at
      a time; while autograd records, each block is checkpointed and rebuilt in the backward pass
      rather than kept, so memory stays bounded by one block plus the (B, H, L, L) attention itself.

    W_R has no bias: a bias b would add (q_i + v) . b, the same for every key j of a query, which
    softmax cancels (the official code has one; it changes nothing).
    """

    def __init__(self, n_heads: int, head_dim: int, fusion: str, chunk: int):
        super().__init__()
        if fusion not in FUSIONS:
            close = difflib.get_close_matches(fusion, list(FUSIONS), n=1)
            raise ConfigError(
                f"unknown position fusion {fusion!r}",
                fix=f"did you mean {close[0]!r}?" if close else f"choose one of {', '.join(FUSIONS)}",
            )
        if chunk < 0:
            raise ConfigError(f"attention_chunk must be >= 0, got {chunk}", fix="use 0 (no blocks) or e.g. 64")
        d_model = n_heads * head_dim
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.distances = FUSIONS[fusion]
        self.chunk = chunk
        self.sinusoids = SinusoidTable(d_model)
        self.fusion = nn.Linear(len(self.distances) * d_model, d_model)  # W_r, b_r
        self.projection = nn.Linear(d_model, d_model, bias=False)  # W_R, every head's rows stacked
        self.position_bias = nn.Parameter(nn.init.xavier_normal_(torch.empty(n_heads, head_dim)))  # v

    def distance_rows(self, span: int, like: torch.Tensor) -> torch.Tensor:
        """W_k P(d) + (b_r for the first k) for every fused distance k and every d in -(span-1)..span-1:
        (K, 2 span - 1, d_model)."""
        table = self.sinusoids(-(span - 1), span, like=like)  # (2S-1, d_model)
        d_model = table.size(-1)
        blocks = self.fusion.weight.view(d_model, len(self.distances), d_model)  # (out, K, in)
        rows = torch.einsum("ri,oki->kro", table, blocks)  # (K, 2S-1, d_model)
        # b_r once per pair: into the first table, from which every pair gathers exactly one row.
        return torch.cat([(rows[0] + self.fusion.bias)[None], rows[1:]])

    def logits(self, q: torch.Tensor, spans: NodeSpans) -> torch.Tensor:
        # q (B, H, L, d): the projected queries, without biases.
        batch, heads, length, _ = q.shape
        # Every head and tail lies in 0..span-1, so every distance in -(span-1)..span-1.
        span = int(torch.maximum(spans.heads.max(), spans.tails.max())) + 1
        rows = self.distance_rows(span, q)  # (K, 2S-1, d_model)
        position_q = q + self.position_bias[:, None, :]  # (B, H, L, d): q + v
        w_r = self.projection.weight.view(heads, self.head_dim, -1)  # (H, d, d_model): W_R^h
        moved_q = torch.einsum("bhld,hdm->blhm", position_q, w_r)  # (B, L, H, d_model): (W_R^h)^T (q + v)
        chunk = self.chunk or length
        blocks = []
        for start in range(0, length, chunk):
            block = slice(start, min(start + chunk, length))
            args = (moved_q[:, block], rows, spans.heads[:, block], spans.tails[:, block], spans.heads, spans.tails)
            if torch.is_grad_enabled():
                # Keep only the inputs; the (B, chunk, L, d_model) intermediates are rebuilt in backward.
                blocks.append(checkpoint(self.block_logits, *args, use_reentrant=False))
            else:
                blocks.append(self.block_logits(*args))
        return torch.cat(blocks, dim=2)  # (B, H, L, L)

    def block_logits(self, moved_q: torch.Tensor, rows: torch.Tensor, query_heads: torch.Tensor,
                     query_tails: torch.Tensor, key_heads: torch.Tensor, key_tails: torch.Tensor) -> torch.Tensor:
        """Position logits of a block of query rows: moved_q (B, c, H, d_model), query spans (B, c),
        key spans (B, L) -> (B, H, c, L)."""
        offset = (rows.size(1) - 1) // 2  # row of distance 0
        ends = {"h": (query_heads, key_heads), "t": (query_tails, key_tails)}
        fused = None
        for k, name in enumerate(self.distances):
            query_end, key_end = ends[name[0]][0], ends[name[1]][1]
            index = query_end[:, :, None] - key_end[:, None, :] + offset  # (B, c, L): table row of each pair
            gathered = nn.functional.embedding(index, rows[k])  # (B, c, L, d_model)
            fused = gathered if fused is None else fused.add_(gathered)
        relative = fused.relu_()  # (B, c, L, d_model): R_ij
        # For each query i: (L, d_model) @ (d_model, H), every key against every head at once. In this
        # order the gradient of R comes out contiguous, and ReLU's backward streams through it.
        scores = relative @ moved_q.transpose(-1, -2)  # (B, c, L, H)
        return scores.permute(0, 3, 1, 2)  # (B, H, c, L)

    def values(self, weights: torch.Tensor) -> None:
        return None  # FLAT adds no position term to the values


@dataclass
class FLATConfig:
    # Defaults: the official code (LeeSureman/Flat-Lattice-Transformer, V0/flat_main.py) for MSRA.
    n_heads: int = 8
    head_dim: int = 20  # d_model = n_heads * head_dim = 160
    num_layers: int = 1
    ff_ratio: float = 3.0  # feed-forward width = ff_ratio * d_model = 480
    dropout: float = 0.15  # inside the feed-forward and on sublayer outputs (official ff_dropout)
    attn_dropout: float = 0.0  # on attention weights
    fusion: str = "four"  # four: the paper's [P_hh; P_ht; P_th; P_tt] | two: [P_hh; P_tt], the code's default
    key_projection: bool = False  # keys are the node vectors themselves, split into heads (official k_proj)
    scale: bool = False  # logits are not divided by sqrt(head_dim) (official `scaled`)
    attention_chunk: int = 64  # query rows per block of position scores (0 = all at once)


class FLAT(nn.Module):
    """Characters (Linear from the embedder's width) and lattice words (Linear from word_dim) become
    d_model-wide nodes [chars (T); words (W)]; self-attention layers run over all of them; the
    character nodes' outputs are returned for the CRF. Padding nodes (short sentences' characters in
    the middle of the sequence, missing words at the end) are masked as keys, so they never reach a
    real node."""

    Config = FLATConfig
    uses_lattice = True

    def __init__(self, input_dim: int, config: FLATConfig, word_dim: int):
        super().__init__()
        d_model = config.n_heads * config.head_dim
        ff_dim = feed_forward_dim(d_model, config.ff_ratio)
        self.char_projection = nn.Linear(input_dim, d_model)
        self.word_projection = nn.Linear(word_dim, d_model)
        self.layers = nn.ModuleList(
            EncoderLayer(
                MultiHeadAttention(
                    config.n_heads,
                    config.head_dim,
                    config.attn_dropout,
                    key_projection=config.key_projection,
                    content_bias=True,  # u
                    scale=config.scale,
                    positions=LatticePositions(
                        config.n_heads, config.head_dim, config.fusion, config.attention_chunk
                    ),
                ),
                d_model,
                ff_dim,
                config.dropout,
            )
            for _ in range(config.num_layers)
        )
        self.output_dim = d_model

    def forward(self, x: torch.Tensor, mask: torch.Tensor, lattice=None) -> torch.Tensor:
        # x (B, T, input_dim), mask (B, T) bool, left-aligned; lattice: words (B, W, word_dim),
        # heads/tails (B, W) long, mask (B, W) bool; None means no words.
        batch, length, _ = x.shape
        positions = torch.arange(length, device=x.device).expand(batch, length)  # (B, T)
        nodes = self.char_projection(x)  # (B, T, d_model)
        heads, tails, node_mask = positions, positions, mask
        if lattice is not None and lattice.words.size(1):
            nodes = torch.cat([nodes, self.word_projection(lattice.words)], dim=1)  # (B, L, d_model)
            heads = torch.cat([positions, lattice.heads], dim=1)  # (B, L)
            tails = torch.cat([positions, lattice.tails], dim=1)  # (B, L)
            node_mask = torch.cat([mask, lattice.mask], dim=1)  # (B, L)
        spans = NodeSpans(heads, tails)
        for layer in self.layers:
            nodes = layer(nodes, node_mask, spans)  # (B, L, d_model)
        return nodes[:, :length].masked_fill(~mask[..., None], 0.0)  # (B, T, d_model)
