"""The span head (GlobalPointer, Su et al. 2021): per entity type, start and end projections of the
encoder's output, both rotated by rotary position embeddings (RoPE), so that the score of span
(s, e) of type k, q_k(s) . k_k(e) / sqrt(d), depends on the two positions only through e - s. Only
the band start <= end < start + max_width is computed: time and memory O(types x length x width).
Each type adds a learnt bias, started at the log-odds of `PRIOR`. Its loss is Su's multi-label
categorical cross-entropy over the spans of each (sentence, type), summed over the types and
averaged over the sentences."""

from __future__ import annotations

import math

import torch
from torch import nn

from nerkit.model.rotary import rotate

# Each span's probability when the head starts: its types' biases start at the log-odds of it
# (-6.9). Started at 0, a band of a thousand spans a sentence, nearly all negative, spends the first
# epochs pushing every score down; started near where the negatives end, the loss is the positives'
# from the first step (docs/notebook/span.md: on 3,000 CMeEE sentences, 5.5-5.8 points of dev F1 at
# the dev threshold in each of epochs 1-3, 2.4 in the 4th; a bias started at 0 gained nothing).
PRIOR = 1e-3


def band_valid(mask: torch.Tensor, max_width: int) -> torch.Tensor:
    """(B, T, W) bool: the band cells whose end lies inside the sentence (mask (B, T), left-aligned).
    `nerkit.model.span_decode.band_valid` is its numpy copy, for the runtime without torch."""
    T = mask.size(1)
    ends = torch.arange(T, device=mask.device)[:, None] + torch.arange(max_width, device=mask.device)[None, :]
    return ends[None] < mask.sum(1)[:, None, None]  # (B, T, W)


def band_known(known: torch.Tensor, max_width: int) -> torch.Tensor:
    """(B, T, W) bool: the band cells every character of which is annotated (`known` (B, T); a cell
    past the end counts as known, `band_valid` leaves it out anyway)."""
    T = known.size(1)
    unknown = torch.nn.functional.pad((~known).long().cumsum(1), (1, 0))  # (B, T + 1): unknown before t
    starts = torch.arange(T, device=known.device)[:, None]  # (T, 1)
    ends = (starts + torch.arange(max_width, device=known.device)[None, :] + 1).clamp(max=T)  # (T, W)
    return (unknown[:, ends] - unknown[:, starts]) == 0  # (B, T, W)


def sampled_negatives(targets: torch.Tensor, valid: torch.Tensor, rate: float,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, T, W) bool: negative sampling for entities nobody marked (Li et al., ICLR 2021): of each
    sentence's valid cells that are no marked entity of any type, ceil(rate x its length) drawn
    uniformly without replacement, the only ones that count as negatives. A name the annotation
    missed is then rarely drawn as a negative, since entities are sparse among a sentence's spans.
    targets (B, K, T, W); valid (B, T, W)."""
    B = valid.size(0)
    candidates = (valid & ~targets.any(1)).reshape(B, -1)  # (B, N)
    lengths = valid[:, :, 0].sum(1)  # (B,): a sentence's length is the count of its width-1 cells
    wanted = torch.ceil(rate * lengths.float()).long().clamp(max=candidates.sum(1))  # (B,)
    draws = torch.rand(candidates.shape, generator=generator, device=valid.device).masked_fill(~candidates, 2.0)
    ranks = draws.argsort(1).argsort(1)  # (B, N): each cell's place in its sentence's random order
    return (ranks < wanted[:, None]).reshape(valid.shape)


def multilabel_loss(logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor,
                    known: torch.Tensor | None = None) -> torch.Tensor:
    """Su's multi-label categorical cross-entropy, log(1 + sum_neg e^s) + log(1 + sum_pos e^-s), over
    the valid band cells of each (sentence, type), summed over the types and averaged over the
    sentences, as a CRF's likelihood is per sentence (averaged over (sentence, type) pairs, it learnt
    more slowly: docs/notebook/span.md). logits, targets (B, K, T, W); valid (B, T, W).

    Partial labels: `known` (B, T, W), `band_known`'s cells, or (B, K, T, W) per type; a cell with an
    unannotated character is no negative (nothing says it is not an entity), while an annotated
    entity stays a positive."""
    B, K = logits.shape[:2]
    s = logits.reshape(B, K, -1)  # (B, K, N)
    positive = targets.reshape(B, K, -1)
    outside = ~valid.reshape(B, 1, -1)
    unsure = outside if known is None else outside | ~known.reshape(B, known.size(1) if known.dim() == 4 else 1, -1)
    negatives = s.masked_fill(positive | unsure, float("-inf"))
    positives = (-s).masked_fill(~positive | outside, float("-inf"))
    zero = s.new_zeros(B, K, 1)  # the 1 in log(1 + ...)
    loss = torch.logsumexp(torch.cat([zero, negatives], -1), -1) + torch.logsumexp(torch.cat([zero, positives], -1), -1)
    return loss.sum(1).mean()  # (B, K) -> one number


def decision_log_probability(logits: torch.Tensor, valid: torch.Tensor, cut: float) -> torch.Tensor:
    """(B,): the log-probability, under the head's independent per-span probabilities (the sigmoid of
    each logit), of what it decides in each sentence: every span of logit above `cut` taken, every
    other valid cell left out. The span head's counterpart of a CRF's best-path probability.
    logits (B, K, T, W); valid (B, T, W)."""
    logits = logits.float()
    decided = torch.where(logits > cut, nn.functional.logsigmoid(logits), nn.functional.logsigmoid(-logits))
    return decided.masked_fill(~valid[:, None], 0.0).flatten(1).sum(1)


class SpanHead(nn.Module):
    def __init__(self, input_dim: int, num_types: int, size: int, max_width: int, dropout: float = 0.0,
                 prior: float = PRIOR):
        super().__init__()
        self.num_types, self.size, self.max_width = num_types, size, max_width
        self.dropout = nn.Dropout(dropout)
        self.projection = nn.Linear(input_dim, num_types * 2 * size)
        # (K,): added to each type's scores, started at the log-odds of `prior`
        self.bias = nn.Parameter(torch.full((num_types,), math.log(prior / (1 - prior))))
        self.register_load_state_dict_pre_hook(_no_bias_is_zero)

    def queries_keys(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotated start (query) and end (key) vectors, (B, K, T, D) each."""
        B, T, _ = h.shape
        qk = self.projection(self.dropout(h)).view(B, T, self.num_types * 2, self.size)  # (B, T, 2K, D)
        # GlobalPointer's pairing, (i, i + D/2): what the head's saved projections were trained with.
        qk = rotate(qk.transpose(1, 2), torch.arange(T, device=h.device), pairing="halves").transpose(1, 2)
        qk = qk.view(B, T, self.num_types, 2, self.size).permute(3, 0, 2, 1, 4)  # (2, B, K, T, D)
        return qk[0], qk[1]

    def forward(self, h: torch.Tensor, diagonals: bool = False) -> torch.Tensor:
        """The band logits (B, K, T, W): cell (k, s, w) scores span s..s+w of type k. Cells past a
        sentence's end hold numbers that mean nothing (`band_valid` says which are real). With
        `diagonals`, computed one width at a time (`by_diagonals`: what an ONNX export traces, its
        shapes never depending on the length in Python)."""
        q, k = self.queries_keys(h)  # (B, K, T, D)
        if diagonals:
            return self.by_diagonals(q, k)
        B, K, T, D = q.shape
        W = self.max_width
        # The starts in blocks of W: the ends of block i's spans lie in blocks i and i + 1, so one
        # batched product per block, (W, D) x (D, 2W), holds its whole band: twice the band's work in
        # one matrix product instead of W thin ones, and never the L x L matrix.
        blocks = -(-T // W)  # ceil(T / W)
        q = nn.functional.pad(q, (0, 0, 0, blocks * W - T)).view(B, K, blocks, W, D)
        k = nn.functional.pad(k, (0, 0, 0, (blocks + 1) * W - T)).view(B, K, blocks + 1, W, D)  # ends past T: zeros
        k = torch.cat([k[:, :, :-1], k[:, :, 1:]], dim=3)  # (B, K, blocks, 2W, D)
        scores = q @ k.transpose(-1, -2)  # (B, K, blocks, W, 2W): start i of the block, end j of the pair
        offsets = torch.arange(W, device=q.device)
        ends = (offsets[:, None] + offsets[None, :]).expand(B, K, blocks, W, W)  # start i, width w -> end i + w
        band = scores.gather(-1, ends).reshape(B, K, blocks * W, W)[:, :, :T]  # (B, K, T, W)
        return band / D ** 0.5 + self.bias[:, None, None]

    def by_diagonals(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """The band from rotated q, k (B, K, T, D), one diagonal of the L x L matrix per width:
        W thin products, slower on a CPU than `forward`'s blocks, the same numbers."""
        T, W = q.size(2), self.max_width
        k = nn.functional.pad(k, (0, 0, 0, W - 1))  # (B, K, T + W - 1, D): ends past T read zeros
        band = [(q * k[:, :, w:w + T]).sum(-1) for w in range(W)]  # W x (B, K, T)
        return torch.stack(band, dim=-1) / self.size ** 0.5 + self.bias[:, None, None]  # (B, K, T, W)

    def full(self, h: torch.Tensor) -> torch.Tensor:
        """Every (start, end) pair, (B, K, T, T): the L x L matrix the band is a part of (for tests)."""
        q, k = self.queries_keys(h)
        return torch.einsum("bksd,bked->bkse", q, k) / self.size ** 0.5 + self.bias[:, None, None]

    def targets(self, spans: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """(B, K, T, W) bool from gold spans (N, 4): row, type, start, width - 1; a span wider than
        the band cannot be scored and is left out."""
        targets = torch.zeros(shape, dtype=torch.bool, device=spans.device)
        spans = spans[spans[:, 3] < self.max_width]
        targets[spans[:, 0], spans[:, 1], spans[:, 2], spans[:, 3]] = True
        return targets

    def loss(self, h: torch.Tensor, mask: torch.Tensor, spans: torch.Tensor,
             known: torch.Tensor | None = None, negative_rate: float = 0.0,
             unsure: torch.Tensor | None = None) -> torch.Tensor:
        """`multilabel_loss` of the gold spans; `known` (B, T) bool: the annotated characters (None:
        all). With `negative_rate` (`sampled_negatives`) the negatives are a sample of the cells no
        entity marks, wherever they lie: unannotated regions are read as unlabelled, not unknown.
        `unsure` (N, 4), as `spans`: cells of one type that are no negative (a grown model's old
        entity that a new label overlaps, nerkit.training.grow)."""
        logits = self(h)  # (B, K, T, W)
        targets, valid = self.targets(spans, logits.shape), band_valid(mask, self.max_width)
        if negative_rate:
            cells = sampled_negatives(targets, valid, negative_rate)
        else:
            cells = None if known is None else band_known(known, self.max_width)
        if unsure is not None and len(unsure):
            cells = (valid if cells is None else cells)[:, None].expand(logits.shape).clone()  # (B, K, T, W)
            unsure = unsure[unsure[:, 3] < self.max_width]
            cells[unsure[:, 0], unsure[:, 1], unsure[:, 2], unsure[:, 3]] = False
        return multilabel_loss(logits, targets, valid, cells)


def _no_bias_is_zero(module: SpanHead, state: dict, prefix: str, *args) -> None:
    """load_state_dict's pre-hook: a head saved before it had biases scored with none, a bias of 0."""
    state.setdefault(prefix + "bias", torch.zeros(module.num_types))
