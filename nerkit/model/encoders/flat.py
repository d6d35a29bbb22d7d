"""FLAT, the Flat-Lattice Transformer (Li et al., ACL 2020): characters and the lexicon words matched
in the sentence are one flat sequence of nodes, each with a head and a tail character position, and
attention sees every pair of nodes through four relative distances between their heads and tails.

The attention is `MultiHeadAttention` from attention.py with `LatticePositions` (below) as its
position term; this file holds only what is FLAT's own: the nodes, the fused distances and the
memory-bounded way of scoring them.
"""

from __future__ import annotations

import torch
from torch import nn

from nerkit.config import FLATOptions
from nerkit.model.encoders.attention import (
    MultiHeadAttention,
    NodeSpans,
    SinusoidTable,
    encoder_layers,
)
from nerkit.model.encoders.base import LatticeWords

# Which of the four head/tail distances each fusion feeds to W_r, in this order (the column blocks of
# W_r follow it): the paper's eq. (8) uses all four; the official code's default (`ff_two`) only
# head-head and tail-tail.
# The distances each fusion (encoder.fusion, nerkit.config.FUSIONS) combines.
FUSIONS = {
    "four": ("hh", "ht", "th", "tt"),
    "two": ("hh", "tt"),
}


class LatticePositions(nn.Module):
    """FLAT's position term of attention, for every (query node i, key node j):

        d_hh = head_i - head_j,  d_ht = head_i - tail_j,  d_th = tail_i - head_j,  d_tt = tail_i - tail_j
        R_ij = ReLU(W_r [P(d_hh); P(d_ht); P(d_th); P(d_tt)] + b_r)            (fusion `four`, eq. 8)
        R_ij = ReLU(W_r [P(d_hh); P(d_tt)] + b_r)                              (fusion `two`)
        logits(q)_ij = (q_i + v) . W_R^h R_ij   per head h                    (b) + (d) of eq. 11

    with P the d_model-wide sinusoid of a distance. Nothing of shape (L, L, k * d_model) is built:

    * W_r = [W_hh | W_ht | W_th | W_tt] acts on a concatenation, so W_r [P_a; P_b; ...] = W_a P_a +
      W_b P_b + ...; each block of W_r is applied once to the 2S - 1 possible distances
      (A_k = table @ W_k^T), and a pair's pre-activation is a sum of gathered rows of the A_k.
    * (q_i + v) . W_R^h R_ij = ((W_R^h)^T (q_i + v)) . R_ij: the queries are moved into R's space
      once, (B, L, H, d_model), instead of projecting every R_ij into every head.
    * R is built for `chunk` query rows at a time and dropped once they are scored (`BlockScores`),
      and rebuilt block by block in the backward pass rather than kept.

    W_R has no bias: a bias b would add (q_i + v) . b, the same for every key j of a query, which
    softmax cancels (the official code has one; it changes nothing).
    """

    def __init__(self, n_heads: int, head_dim: int, fusion: str, chunk: int):
        super().__init__()
        if fusion not in FUSIONS or chunk < 0:  # the config checks both for users: this is for direct callers
            raise ValueError(f"fusion must be one of {', '.join(FUSIONS)} and chunk >= 0, not {fusion!r}, {chunk}")
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
        """W_k P(d) for every fused distance k and every d in -(span-1)..span-1, with b_r added to the
        first k's rows: (K, 2 span - 1, d_model)."""
        table = self.sinusoids(-(span - 1), span, like=like)  # (2S-1, d_model)
        d_model = table.size(-1)
        blocks = self.fusion.weight.view(d_model, len(self.distances), d_model)  # (out, K, in)
        rows = torch.einsum("ri,oki->kro", table, blocks)  # (K, 2S-1, d_model)
        # b_r once per pair: into the first table, from which every pair gathers exactly one row.
        return torch.cat([(rows[0] + self.fusion.bias)[None], rows[1:]])

    def logits(self, q: torch.Tensor, spans: NodeSpans) -> torch.Tensor:
        # q (B, H, L, d): the projected queries, without biases.
        heads = q.size(1)
        exporting = torch.compiler.is_exporting()
        # Every head and tail lies in 0..span-1, so every distance in -(span-1)..span-1. A traced graph
        # cannot read the positions, but every one is below the number of characters.
        span = spans.chars if exporting else int(torch.maximum(spans.heads.max(), spans.tails.max())) + 1
        rows = self.distance_rows(span, q)  # (K, 2S-1, d_model)
        position_q = q + self.position_bias[:, None, :]  # (B, H, L, d): q + v
        w_r = self.projection.weight.view(heads, self.head_dim, -1)  # (H, d, d_model): W_R^h
        moved_q = torch.einsum("bhld,hdm->blhm", position_q, w_r)  # (B, L, H, d_model): (W_R^h)^T (q + v)
        pairs = tuple((name[0], name[1]) for name in self.distances)
        if exporting:  # one operator, which the ONNX export writes as a loop over the query nodes
            ends = {"h": spans.heads, "t": spans.tails}
            query_rows = torch.stack([ends[query_end] + (span - 1) for query_end, _ in pairs])  # (K, B, L)
            key_rows = torch.stack([ends[key_end] for _, key_end in pairs])  # (K, B, L)
            return lattice_scores(moved_q, rows, query_rows, key_rows)
        # Under autocast the einsums give half precision and b_r's row float32: the block gathers and
        # accumulates into buffers of one dtype, the queries'.
        rows = rows.to(moved_q.dtype)
        return BlockScores.apply(moved_q, rows, spans.heads, spans.tails, spans.chars, pairs, self.chunk)

    def values(self, weights: torch.Tensor) -> None:
        return None  # FLAT adds no position term to the values


@torch.library.custom_op("nerkit::lattice_scores", mutates_args=())
def lattice_scores(moved_q: torch.Tensor, rows: torch.Tensor, query_rows: torch.Tensor,
                   key_rows: torch.Tensor) -> torch.Tensor:
    """`LatticePositions.logits` as one operator for an ONNX export (`nerkit.tools.onnx.export` writes it as
    a Scan over the query nodes, so memory stays that of one query row): score[b, h, i, j] =
    moved_q[b, i, h] . ReLU(sum_k rows[k, query_rows[k, b, i] - key_rows[k, b, j]]). moved_q (B, L, H, M),
    rows (K, R, M), query_rows and key_rows (K, B, L) long. This eager body is the formula, all pairs at once."""
    index = query_rows[:, :, :, None] - key_rows[:, :, None, :]  # (K, B, L, L)
    relative = sum(rows[k][index[k]] for k in range(rows.size(0))).relu()  # (B, L, L, M)
    return torch.einsum("bihm,bijm->bhij", moved_q, relative)  # (B, H, L, L)


@lattice_scores.register_fake
def _lattice_scores_shape(moved_q, rows, query_rows, key_rows):
    batch, length, n_heads, _ = moved_q.shape
    return moved_q.new_empty(batch, n_heads, length, length)


class BlockScores(torch.autograd.Function):
    """score[b, h, i, j] = moved_q[b, i, h] . R_ij for every pair (B, H, L, L), with R built for one
    block of query rows against one kind of key node (characters, then words) at a time, in buffers
    that every block reuses. Where the query or key nodes are characters, distances that coincide
    (d_hh = d_ht when j is a character, ...) share one gather from the sum of their tables.

    This is activation checkpointing written out: backward saves only the inputs and rebuilds each
    block's R. Not `torch.utils.checkpoint` around each block, because on the CPU that fragmented
    glibc's heap (a batch of ten 400-character sentences grew to 9 GB resident with blocks of 4 rows)
    and paid fresh page faults for every block over 32 MiB (gathers 5x slower); the buffers here are
    allocated once per pass."""

    @staticmethod
    def forward(ctx, moved_q, rows, heads, tails, chars, pairs, chunk):
        # moved_q (B, L, H, M), rows (K, 2S-1, M), heads and tails (B, L) long; chars: leading character
        # nodes; pairs: (query end, key end) of each fused distance, "h" or "t"; chunk: rows per block.
        ctx.save_for_backward(moved_q, rows, heads, tails)
        ctx.chars, ctx.pairs, ctx.chunk = chars, pairs, chunk
        batch, length, n_heads, _ = moved_q.shape
        out = moved_q.new_empty(batch, n_heads, length, length)
        buffers = _Buffers(moved_q, rows, chunk, len(pairs))
        tables = _SharedTables(rows)
        for queries, keys, groups in _blocks(length, chars, chunk, pairs):
            relative = buffers.relative(tables.rows(groups), heads, tails, queries, keys, groups)  # (B, c, n, M)
            count = batch * relative.size(1)
            query_rows = moved_q[:, queries].reshape(count, n_heads, -1)  # (B c, H, M)
            scores = torch.bmm(relative.view(count, relative.size(2), -1), query_rows.transpose(1, 2),
                               out=buffers.scores(relative.shape))  # (B c, n, H)
            out[:, :, queries, keys] = scores.view(*relative.shape[:3], n_heads).permute(0, 3, 1, 2)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        # grad_out (B, H, L, L) -> gradients of moved_q (B, L, H, M) and rows (K, 2S-1, M).
        moved_q, rows, heads, tails = ctx.saved_tensors
        batch, length, n_heads, width = moved_q.shape
        grad_q = torch.zeros_like(moved_q)
        buffers = _Buffers(moved_q, rows, ctx.chunk, len(ctx.pairs))
        tables = _SharedTables(rows)
        for queries, keys, groups in _blocks(length, ctx.chars, ctx.chunk, ctx.pairs):
            relative = buffers.relative(tables.rows(groups), heads, tails, queries, keys, groups)  # rebuilt
            shape = relative.shape  # (B, c, n, M)
            count = shape[0] * shape[1]
            grad_scores = grad_out[:, :, queries, keys].permute(0, 2, 3, 1)  # (B, c, n, H)
            grad_q[:, queries] += grad_scores.transpose(-1, -2) @ relative  # (B, c, H, M)
            grad_relative = torch.bmm(  # (B c, n, M): d score / d R_ij
                grad_scores.reshape(count, shape[2], n_heads),
                moved_q[:, queries].reshape(count, n_heads, width),
                out=buffers.spare(shape).view(count, shape[2], width),
            )
            grad_relative.mul_(relative.view_as(grad_relative).sign_())  # ReLU passes gradient where R > 0
            flat = grad_relative.view(-1, width)
            grad_tables = tables.grad(groups)
            for g in range(len(groups)):  # every pair's gradient to the table row it gathered
                grad_tables[g].index_add_(0, buffers.index[g, : flat.size(0)], flat)
        return grad_q, tables.grad_rows(), None, None, None, None, None


def _blocks(length: int, chars: int, chunk: int, pairs):
    """(query rows, key nodes, groups) to score: query blocks of at most `chunk` rows that do not mix
    characters and words, each against the character keys and then the word keys. `groups` lists the
    distinct (query end, key end) among `pairs` once a character's tail is read as its head, with the
    fused distances that fall into each."""
    chunk = chunk or length
    cuts = sorted({0, min(chars, length), length})
    kinds = [(slice(a, b), a < chars) for a, b in zip(cuts, cuts[1:]) if b > a]
    for query_span, query_is_char in kinds:
        for start in range(query_span.start, query_span.stop, chunk):
            queries = slice(start, min(start + chunk, query_span.stop))
            for keys, key_is_char in kinds:
                groups: dict[tuple[str, str], list[int]] = {}
                for k, (query_end, key_end) in enumerate(pairs):
                    ends = ("h" if query_is_char else query_end, "h" if key_is_char else key_end)
                    groups.setdefault(ends, []).append(k)
                yield queries, keys, tuple((ends, tuple(ks)) for ends, ks in groups.items())


class _SharedTables:
    """The rows of distances that share a gather, summed (cached per group), and their gradients,
    handed back to each fused distance at the end."""

    def __init__(self, rows: torch.Tensor):
        self.source = rows  # (K, 2S-1, M)
        self._rows: dict = {}
        self._grads: dict = {}

    def rows(self, groups) -> list[torch.Tensor]:
        for _, ks in groups:
            if ks not in self._rows:
                self._rows[ks] = self.source[list(ks)].sum(0)  # (2S-1, M)
        return [self._rows[ks] for _, ks in groups]

    def grad(self, groups) -> list[torch.Tensor]:
        for _, ks in groups:
            if ks not in self._grads:
                self._grads[ks] = torch.zeros_like(self.source[0])
        return [self._grads[ks] for _, ks in groups]

    def grad_rows(self) -> torch.Tensor:
        grad = torch.zeros_like(self.source)  # (K, 2S-1, M)
        for ks, g in self._grads.items():
            grad[list(ks)] += g  # a shared gather's gradient reaches each summed table in full
        return grad


class _Buffers:
    """Working memory for one pass over the blocks: the pre-activation / R of a block, a spare of the
    same size (one gathered distance, later R's gradient), each pair's table row per gather, and a
    block's scores. Sized for the largest block; each block uses views of the front."""

    def __init__(self, moved_q: torch.Tensor, rows: torch.Tensor, chunk: int, fused: int):
        batch, length, n_heads, width = moved_q.shape
        pairs = batch * min(chunk or length, length) * length
        self.width, self.n_heads = width, n_heads
        self.pre = moved_q.new_empty(pairs * width)
        self._spare = moved_q.new_empty(pairs * width)
        self._scores = moved_q.new_empty(pairs * n_heads)
        self.index = torch.empty(fused, pairs, dtype=torch.long, device=moved_q.device)
        self.offset = (rows.size(1) - 1) // 2  # the row of distance 0

    def spare(self, shape) -> torch.Tensor:
        return self._spare[: shape[0] * shape[1] * shape[2] * self.width]

    def scores(self, shape) -> torch.Tensor:
        count = shape[0] * shape[1]
        return self._scores[: count * shape[2] * self.n_heads].view(count, shape[2], self.n_heads)

    def relative(self, tables, heads, tails, queries: slice, keys: slice, groups) -> torch.Tensor:
        """R_ij = ReLU(sum_g table_g[d_g(i, j)]) for the query rows `queries` against the key nodes
        `keys`: (B, c, n, M), in `pre`; leaves each pair's table row per group in `index`."""
        batch = heads.size(0)
        shape = (batch, queries.stop - queries.start, keys.stop - keys.start)
        count = shape[0] * shape[1] * shape[2]
        ends = {"h": heads, "t": tails}
        pre = self.pre[: count * self.width].view(count, self.width)
        gathered = self.spare(shape).view(count, self.width)
        for g, ((query_end, key_end), _) in enumerate(groups):
            index = self.index[g, :count]
            torch.sub(ends[query_end][:, queries, None], ends[key_end][:, None, keys], out=index.view(shape))
            index.add_(self.offset)  # distance -> table row
            torch.index_select(tables[g], 0, index, out=pre if g == 0 else gathered)
            if g:
                pre.add_(gathered)
        return pre.relu_().view(*shape, self.width)


class FLAT(nn.Module):
    """Characters (Linear from the embedder's width) and lattice words (Linear from word_dim) become
    d_model-wide nodes [chars (T); words (W)]; self-attention layers run over all of them; the
    character nodes' outputs are returned for the CRF. Padding nodes (short sentences' characters in
    the middle of the sequence, missing words at the end) are masked as keys, so they never reach a
    real node.

    The block is nerkit's post-norm Transformer layer, as the paper describes. Where the official code
    differs by its defaults: it has no output projection W_o (`attn_ff` off), no dropout on the
    attention sublayer's output, and its "add" step (`Layer_Process`, post "an") adds the sublayer's
    output to itself rather than to the sublayer's input, so in effect it has no residual connection."""

    uses_lattice = True

    def __init__(self, input_dim: int, config: FLATOptions, word_dim: int = 0):
        super().__init__()
        d_model = config.n_heads * config.head_dim
        self.char_projection = nn.Linear(input_dim, d_model)
        self.word_projection = nn.Linear(word_dim, d_model)
        self.layers = encoder_layers(
            lambda: MultiHeadAttention(
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
            d_model, config.ff_ratio, config.dropout, config.num_layers,
        )
        self.output_dim = d_model

    def forward(self, x: torch.Tensor, mask: torch.Tensor, lattice: LatticeWords | None = None) -> torch.Tensor:
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
        spans = NodeSpans(heads, tails, chars=length)
        for layer in self.layers:
            nodes = layer(nodes, node_mask, spans)  # (B, L, d_model)
        return nodes[:, :length].masked_fill(~mask[..., None], 0.0)  # (B, T, d_model)
