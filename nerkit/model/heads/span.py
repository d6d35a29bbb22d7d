"""The span head as a component: GlobalPointer's band of span scores (nerkit.model.span), decoded in
numpy as an export decodes it (nerkit.model.span_decode): every span above a probability threshold,
nested and overlapping allowed, each with its own probability."""

from __future__ import annotations

import torch

from nerkit.config import HEAD_TRAITS
from nerkit.data.tags import split_tag
from nerkit.features.batch import Batch
from nerkit.model.decoded import Found
from nerkit.model.heads.base import Head
from nerkit.model.span import SpanHead, band_valid, decision_log_probability
from nerkit.model.span_decode import band_cut, decode_band


class GlobalPointerHead(Head):
    traits = HEAD_TRAITS["span"]

    def __init__(self, config, input_dim: int, tags: list[str]):
        super().__init__(config, input_dim, tags)
        sc = config.span
        self.types = sorted({split_tag(t)[1] for t in tags if t != "O"})
        self.span = SpanHead(input_dim, len(self.types), sc.size, sc.max_width, sc.dropout)
        self.threshold = sc.threshold  # span.flat is the predictor's, after windows are stitched
        self.negative_sampling = sc.negative_sampling  # in training only

    def band(self, hidden: torch.Tensor, diagonals: bool = False,
             score_map: tuple[float, float] | None = None) -> torch.Tensor:
        """The band logits (B, K, T, W) (`SpanHead`; `diagonals`: as an ONNX export computes them),
        with `score_map` (scale, shift) applied when calibration fitted one."""
        band = self.span(hidden, diagonals)
        if score_map is not None:
            scale, shift = score_map
            band = band * scale + shift
        return band

    def loss(self, hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The multi-label loss over the gold spans `batch.spans`, averaged over (sentence, type);
        no negative from an unknown region (`batch.known`) nor from a span of a type nothing says
        anything of (`batch.unsure`), or sampled negatives (span.negative_sampling)."""
        return self.span.loss(hidden, batch.mask, batch.spans, batch.known, self.negative_sampling, batch.unsure)

    @torch.no_grad()
    def grow_from(self, old: "GlobalPointerHead",
                  score_map: tuple[float, float] | None = None) -> dict[str, torch.Tensor]:
        """`Head.grow_from`: each old type's start and end projections and bias copied exactly (with
        `score_map` (scale, shift), its start projection times scale and its bias mapped, the band
        the map gave); a new type's start projection and bias as the head initialises them and its
        end projection zero, so that each of its spans scores the bias alone, the prior's
        probability (PRIOR, far below any threshold), until training moves it (the start
        projection's gradient is the end's, zero at first; the end's is the start's, which is not)."""
        size, mine, theirs = self.span.size, self.span, old.span
        scale, shift = score_map or (1.0, 0.0)
        shared = self.nothing_shared()

        def rows(k: int, part: slice = slice(0, 2)) -> slice:  # type k's rows: its start (0) and end (1) projections
            return slice((2 * k + part.start) * size, (2 * k + part.stop) * size)

        for k_old, kind in enumerate(old.types):
            k = self.types.index(kind)
            mine.projection.weight[rows(k)] = theirs.projection.weight[rows(k_old)].to(mine.projection.weight)
            mine.projection.bias[rows(k)] = theirs.projection.bias[rows(k_old)].to(mine.projection.bias)
            mine.bias[k] = theirs.bias[k_old].to(mine.bias)
            for name in ("span.projection.weight", "span.projection.bias"):
                shared[name][rows(k)] = True
            shared["span.bias"][k] = True
            if score_map is not None:  # q . k / sqrt(d) + bias, mapped: (scale q) . k / sqrt(d) + (scale bias + shift)
                mine.projection.weight[rows(k, slice(0, 1))] *= scale
                mine.projection.bias[rows(k, slice(0, 1))] *= scale
                mine.bias[k] = mine.bias[k] * scale + shift
        for k, kind in enumerate(self.types):
            if kind not in old.types:
                mine.projection.weight[rows(k, slice(1, 2))] = 0.0
                mine.projection.bias[rows(k, slice(1, 2))] = 0.0
        return shared

    def decode_band(self, band: torch.Tensor, mask: torch.Tensor, threshold: float | None = None) -> list[list[Found]]:
        """The spans of band logits (B, K, T, W) above `threshold` (None: `span.threshold`), decoded in
        numpy as an export decodes them."""
        threshold = self.threshold if threshold is None else threshold
        return decode_band(band.float().cpu().numpy(), mask.sum(1).tolist(), threshold, flat=False)

    @torch.no_grad()
    def decode(self, hidden: torch.Tensor, mask: torch.Tensor, scores: bool = False, temperature: float = 1.0,
               threshold: float | None = None, score_map: tuple[float, float] | None = None) -> list[list[Found]]:
        """Every span above `threshold` (None: `span.threshold`), with its probability whatever
        `scores` says; span.flat's choice is made after windows are stitched."""
        return self.decode_band(self.band(hidden, score_map=score_map), mask, threshold)

    @torch.no_grad()
    def decision_log_probabilities(self, hidden: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0,
                                   threshold: float | None = None,
                                   score_map: tuple[float, float] | None = None) -> list[float]:
        """The log-probability of each sentence's decided set of spans (`decision_log_probability`)."""
        band = self.band(hidden, score_map=score_map)  # (B, K, T, W), on the scale of its scores
        cut = band_cut(self.threshold if threshold is None else threshold)
        return decision_log_probability(band, band_valid(mask, band.size(-1)), cut).tolist()

    def export_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """The band logits (B, K, T, W), one width at a time (no Python-side lengths); decoded in
        numpy beside the graph."""
        return self.span(hidden, diagonals=True)
