"""The span head's decoding, in numpy (no torch), shared by the tagger and the ONNX runtime: from a
band of logits (B, K, T, W) -- type k, start s, end s + w -- every span above a threshold (nested and
overlapping allowed), or with `flat` the non-overlapping set of them with the largest sum of log-odds."""

from __future__ import annotations

import bisect
import math

import numpy as np

# (start, end exclusive, type index, probability)
Found = tuple[int, int, int, float]


def logit(probability: float) -> float:
    """The log-odds a probability threshold stands for (0.5 -> 0); at 0 and 1, -inf and inf (every
    span kept, none kept): a steep calibration map can round a threshold on its scale to either."""
    if probability <= 0.0 or probability >= 1.0:
        return math.copysign(math.inf, probability - 0.5)
    return math.log(probability / (1.0 - probability))


def band_cut(threshold: float) -> float:
    """The logit a probability threshold stands for, as the float32 band compares with it (numpy
    casts a Python float to the array's float32): a span of logit x is kept when x > band_cut."""
    return float(np.float32(logit(threshold)))


def band_valid(mask: np.ndarray, max_width: int) -> np.ndarray:
    """(B, T, W) bool: the band cells whose end lies inside the sentence (mask (B, T), left-aligned).
    A deliberate second copy of `nerkit.model.span.band_valid`, same name, same arguments: this one
    serves the ONNX runtime, which runs without torch; tests/test_span_head.py holds the two equal."""
    T = mask.shape[1]
    ends = np.arange(T)[:, None] + np.arange(max_width)[None, :]  # (T, W)
    return ends[None] < np.asarray(mask).sum(1)[:, None, None]  # (B, T, W)


def threshold_spans(logits: np.ndarray, length: int, cut: float) -> list[tuple[int, int, int, float]]:
    """Every span of one sentence whose logit (K, T, W) is above `cut` (a logit: `band_cut` of a
    probability threshold), as (start, end exclusive, type, logit), ordered by start, end, type."""
    K, T, W = logits.shape
    valid = band_valid(np.arange(T)[None] < length, W)[0]  # (T, W)
    types, starts, widths = np.nonzero((logits > cut) & valid[None])
    found = [(int(s), int(s + w + 1), int(k), float(logits[k, s, w])) for k, s, w in zip(types, starts, widths)]
    return sorted(found)


def flat_choice(spans: list[tuple[int, int, int, float]], cut: float = 0.0) -> list[tuple[int, int, int, float]]:
    """The non-overlapping subset of `spans` (start, end exclusive, type, logit) with the largest
    sum of logit - `cut` (the logit of the threshold): weighted interval scheduling by dynamic
    programming, O(n log n). Under the head's independent per-span probabilities shifted so that the
    threshold reads 0.5 (a threshold below 0.5, chosen on dev, says the head's scores sit too low),
    that set is the most probable flat labelling (a span taken adds log p, one left adds log(1 - p):
    the difference is its shifted logit), so a span at or below the threshold is never taken, and at
    0.5 the weights are the logits. Ties keep the set without the later-ending span."""
    order = sorted(spans, key=lambda s: (s[1], s[0], s[2]))
    ends = [s[1] for s in order]
    best = [0.0] * (len(order) + 1)  # best[i]: the best sum over the first i spans by end
    before = [bisect.bisect_right(ends, s[0]) for s in order]  # spans ending at or before this one's start
    for i, span in enumerate(order):
        best[i + 1] = max(best[i], span[3] - cut + best[before[i]])
    chosen, i = [], len(order)
    while i > 0:
        if best[i] == best[i - 1]:
            i -= 1
        else:
            chosen.append(order[i - 1])
            i = before[i - 1]
    return sorted(chosen)


def decode_band(logits: np.ndarray, lengths, threshold: float, flat: bool) -> list[list[Found]]:
    """Each sentence's spans from the band logits (B, K, T, W) and its length: (start, end
    exclusive, type, probability), `threshold` a probability."""
    cut = band_cut(threshold)
    out = []
    for b, length in enumerate(lengths):
        found = threshold_spans(logits[b], int(length), cut)
        if flat:
            found = flat_choice(found, cut)
        out.append(with_probabilities(found))
    return out


def with_probabilities(spans: list[tuple[int, int, int, float]]) -> list[Found]:
    """Spans (start, end exclusive, type, logit) with their probability in place of the logit."""
    return [(s, e, k, 1.0 / (1.0 + math.exp(-x))) for s, e, k, x in spans]
