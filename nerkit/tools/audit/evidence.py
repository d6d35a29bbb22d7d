"""What a fold model says of the sentences it never saw: every span's exact probability of being an
entity of each type, read off as each labelled entity's probability and the spans the labels lack
(nerkit.tools.audit.suspects turns them into suspects), the log-ratio of the model's best labelling
to the given one, and per character the probability of each type (cleanlab's input).

Where they come from, by what the head can do (its traits, never its name):
- a head with marginals (the CRF): `CRF.span_log_probabilities`, the probability that exactly that
  segment is one entity of that type, from the forward and backward scores; the path score from
  `CRF.allowed_log_probabilities` (the labelled path, or with partial labels every path through
  them) against the best path's; per character the marginals summed by type;
- a head with a threshold (the span head): each span's own probability (its band, with the score
  map calibration fitted), spans above the threshold being its decision; the path score from the
  independent per-span probabilities over the annotated cells; no per-character distribution.
A text longer than the model's window is read in its overlapping windows: each span is judged by
the window that holds it most centrally (the rule prediction stitches by), its path score summed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from nerkit.data.records import Sentence
from nerkit.data.tags import Span, spans_to_tags
from nerkit.tools.audit.suspects import EVIDENCE_FLOOR

PATH_CAP = 1e4  # a labelling the model gives no probability at all (a type it never saw): this far behind


@dataclass
class Evidence:
    """One sentence as a fold model sees it: its labelled entities, each scored with the model's
    probability (0 for a type the model never saw; None where it cannot judge: an entity wider than
    its span head reads, or cut by every window), the spans the labels lack with probability
    EVIDENCE_FLOOR or more, the path log-ratio, and per character the probability of O and of each
    type (None for a span head)."""

    labelled: list[Span]
    cells: list[Span]
    path: float
    char_probabilities: np.ndarray | None  # (T, 1 + types), O first


def flat_labels(spans: list[Span]) -> list[Span]:
    """The labelled entities a tag path can hold: the longest of each overlap (data.flat: outer)."""
    from nerkit.data.nesting import nested, project

    return project(spans, "outer") if nested(spans) else spans


def sentence_evidence(pipe, sentences: list[Sentence], batch_size: int = 64, window: int | None = None,
                      max_width: int | None = None) -> list[Evidence]:
    """Each sentence's `Evidence` under `pipe` (see the module's docstring). `max_width`: the widest
    span scored by a CRF (default: the widest labelled entity, at least span.max_width)."""
    types = pipe.types
    if pipe.head.supports_marginals and max_width is None:
        widest = max((s.end - s.start for sent in sentences for s in sent.spans()), default=1)
        max_width = max(pipe.config.span.max_width, widest)
    labelled = [{s: (-1, None) for s in sent.spans()} for sent in sentences]  # span -> (margin, probability)
    cells: list[dict] = [{} for _ in sentences]
    paths = [0.0] * len(sentences)
    chars = [np.zeros((len(s), len(types) + 1)) for s in sentences] if pipe.head.supports_marginals else None
    char_margin = [[-1] * len(s) for s in sentences]
    tokens = [s.tokens for s in sentences]
    for pieces, batch in pipe.window_batches(tokens, batch_size, window):
        lengths = batch.mask.sum(1).tolist()
        windows = [(sentences[i], a, b) for i, a, b in pieces]
        if pipe.head.supports_marginals:
            probs, path, by_type = crf_evidence(pipe, batch, windows, max_width)
        else:
            probs, path, by_type = span_head_evidence(pipe, batch, windows)
        for row, ((i, a, b), length) in enumerate(zip(pieces, lengths)):
            paths[i] += path[row]
            for span, (margin, _) in labelled[i].items():
                if a <= span.start and span.end <= b and (span.end - span.start) <= probs.shape[3]:
                    seen = min(span.start - a, b - span.end)
                    if seen > margin:
                        k = types.index(span.type) if span.type in types else None
                        p = float(probs[row, k, span.start - a, span.end - span.start - 1]) if k is not None else 0.0
                        labelled[i][span] = (seen, p)
            ks, starts, widths = np.nonzero(probs[row, :, :length] >= EVIDENCE_FLOOR)
            for k, s, w in zip(ks.tolist(), starts.tolist(), widths.tolist()):
                span = Span(a + s, a + s + w + 1, types[k])
                if span.end > b:
                    continue
                seen = min(s, length - (s + w + 1))
                if span not in labelled[i] and seen > cells[i].get(span, (-1, 0.0))[0]:
                    cells[i][span] = (seen, float(probs[row, k, s, w]))
            if by_type is not None:
                for t in range(length):
                    seen = min(t, length - 1 - t)
                    if seen > char_margin[i][a + t]:
                        char_margin[i][a + t] = seen
                        chars[i][a + t] = by_type[row, t]
    out = []
    for i, sent in enumerate(sentences):
        scored = [Span(s.start, s.end, s.type, p) for s, (_, p) in labelled[i].items()]
        found = sorted((Span(s.start, s.end, s.type, p) for s, (_, p) in cells[i].items()),
                       key=lambda s: (s.start, s.end, s.type))
        out.append(Evidence(scored, found, min(paths[i], PATH_CAP), chars[i] if chars is not None else None))
    return out


def window_labels(sent: Sentence, a: int, b: int) -> tuple[list[Span], list[bool]]:
    """The labelled entities lying whole in window [a, b), offsets in the window, and which of its
    characters are annotated (those of an entity that the window cuts count as unknown there)."""
    known = sent.known()[a:b]
    inside = []
    for s in sent.spans():
        if a <= s.start and s.end <= b:
            inside.append(Span(s.start - a, s.end - a, s.type))
        elif s.start < b and a < s.end:
            for t in range(max(s.start, a), min(s.end, b)):
                known[t - a] = False
    return inside, known


def crf_evidence(pipe, batch, windows, max_width: int):
    """A CRF's evidence of a batch of windows: span probabilities (B, types, T, W), each row's path
    log-ratio, and per character O's and each type's probability (B, T, 1 + types)."""
    crf = pipe.model.head.crf
    temperature = pipe.score_temperature
    emissions = pipe.model.emissions(batch)  # (B, T, K)
    mask = batch.mask
    width = min(max_width, emissions.size(1))
    probs = crf.span_log_probabilities(emissions, mask, width, temperature).exp().cpu().numpy()
    tags = pipe.tags
    allowed = torch.zeros(emissions.shape, dtype=torch.bool, device=emissions.device)
    for row, (sent, a, b) in enumerate(windows):
        spans, known = window_labels(sent, a, b)
        spans = [s for s in flat_labels(spans) if s.type in pipe.types]
        labels = spans_to_tags(b - a, spans, pipe.scheme)
        for t, (tag, k) in enumerate(zip(labels, known)):
            if k:
                allowed[row, t, tags.index(tag)] = True
            else:
                allowed[row, t] = True
        if len({s.type for s in sent.spans()} - set(pipe.types)):
            allowed[row] = False  # a type the model has no tag for: the labelling has no probability
    allowed |= ~mask.bool()[..., None]
    labelled = crf.allowed_log_probabilities(emissions, mask, allowed, temperature)  # (B,)
    best = crf.decode(emissions, mask)
    one_hot = torch.zeros_like(allowed)
    for row, path in enumerate(best):
        one_hot[row, torch.arange(len(path)), torch.tensor(path, dtype=torch.long)] = True
    one_hot |= ~mask.bool()[..., None]
    decided = crf.allowed_log_probabilities(emissions, mask, one_hot, temperature)
    path = (decided - labelled).clamp(min=0.0, max=PATH_CAP).tolist()
    marginals = crf.marginals(emissions, mask, temperature).cpu().numpy()  # (B, T, K)
    by_type = np.zeros(marginals.shape[:2] + (len(pipe.types) + 1,))
    for j, tag in enumerate(tags):
        column = 0 if tag == "O" else 1 + pipe.types.index(tag.split("-", 1)[1])
        by_type[:, :, column] += marginals[:, :, j]
    return probs, path, by_type


def span_head_evidence(pipe, batch, windows):
    """A span head's evidence of a batch of windows: span probabilities (B, types, T, W) and each row's
    path log-ratio over its annotated cells; no per-character distribution."""
    from nerkit.model.span import band_known, band_valid

    head = pipe.model.head
    band = head.band(pipe.model.hidden(batch), score_map=pipe.span_score_map).double()  # (B, K, T, W)
    probs = torch.sigmoid(band)
    width = band.size(-1)
    targets = torch.zeros(band.shape, dtype=torch.bool, device=band.device)
    known = torch.ones(batch.mask.shape, dtype=torch.bool, device=band.device)
    for row, (sent, a, b) in enumerate(windows):
        spans, window_known = window_labels(sent, a, b)
        known[row, :len(window_known)] = torch.tensor(window_known, dtype=torch.bool)
        for s in spans:
            if s.type in pipe.types and s.end - s.start <= width:
                targets[row, pipe.types.index(s.type), s.start, s.end - s.start - 1] = True
    cells = band_valid(batch.mask, width) & band_known(known, width)  # (B, T, W)
    decided = band > torch.logit(torch.tensor(pipe.threshold, dtype=band.dtype))
    log_p = torch.nn.functional.logsigmoid(band)
    log_q = torch.nn.functional.logsigmoid(-band)
    decided_lp = torch.where(decided, log_p, log_q)
    labelled_lp = torch.where(targets, log_p, log_q)
    path = ((decided_lp - labelled_lp).masked_fill(~cells[:, None], 0.0).flatten(1).sum(1))
    return probs.cpu().numpy(), path.clamp(min=0.0, max=PATH_CAP).tolist(), None
