"""`nerkit calibrate` on a span-head model: choose the threshold (the probability above which a span
is predicted) that maximises micro F1 on a dev set, and keep it in the model directory (nerkit.json's
`span_threshold`), where prediction, evaluation, the server and an export made afterwards read it.

GlobalPointer's default threshold, 0.5 (logit 0), is no more than a default: a head trained on
many more negative spans than positive ones tends to predict too few. The band logits are
computed once, every span above the lowest threshold tried is kept with its logit, and each
threshold of `GRID` decodes from those (windows stitched and `span.flat` applied as prediction
does), so the F1 at each is exactly what `nerkit eval` reports at that threshold.

The head's own probabilities (the sigmoid of its scores) are not calibrated, Su's loss not being a
likelihood, so the spans predicted at the chosen threshold then fit Platt's map of the scores
(`platt_map`, kept as nerkit.json's `span_score_map`), and the threshold is carried onto the map's
scale: the same spans are predicted, with scores that say how often such a span is right (with
`span.flat` too: the flat choice among overlapping ones weighs each by its log-odds over the
threshold's, which a map of positive scale multiplies by that scale, so the choice stays).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from nerkit.data.tags import Span
from nerkit.errors import UserError
from nerkit.inference.evaluate import calibration, score
from nerkit.inference.model_dir import SCORE_MAP_KEYS, SPAN_SCORE_MAP, SPAN_THRESHOLD, score_map_json, update_meta
from nerkit.inference.pipeline import Pipeline
from nerkit.model.span_decode import band_cut, logit, threshold_spans, with_probabilities

log = logging.getLogger(__name__)

# 0.05 to 0.95 by 0.05: F1 is flat near its best threshold, so a finer grid would follow the dev
# set's noise rather than the model, and 19 decodes of the kept spans take little time.
GRID = [round(0.05 * k, 2) for k in range(1, 20)]


def band_candidates(pipe: Pipeline, token_lists: list, batch_size: int, window: int | None, floor: float):
    """The texts' windows (text index, start, end) as prediction reads them, in order, and each
    window's spans above the probability `floor` (start, end exclusive, type index, logit), from one
    pass of the model over them (batches trimmed, as `nerkit eval` reads a corpus)."""
    cut = band_cut(floor)
    found = {}
    for pieces, batch in pipe.window_batches(token_lists, batch_size, window, trim=True):
        band = pipe.mapped_band(pipe.model.head.band(pipe.model.hidden(batch)).float().cpu().numpy())  # (B, K, T, W)
        for (i, a, b), logits in zip(pieces, band):
            found[i, a, b] = threshold_spans(logits, b - a, cut)
    pieces = sorted(found)
    return pieces, [found[p] for p in pieces]


def spans_at(pipe: Pipeline, token_lists: list, pieces: list, found: list, threshold: float,
             scores: bool = False) -> list:
    """Each text's spans above `threshold`, stitched as prediction stitches them (with `scores`, each
    with its probability)."""
    cut = band_cut(threshold)
    decoded = [with_probabilities([s for s in spans if s[3] > cut]) for spans in found]
    return pipe.stitched_spans(token_lists, pieces, decoded, scores=scores, threshold=threshold)


def f1_at(pipe: Pipeline, token_lists: list, gold: list, pieces: list, found: list, threshold: float) -> dict:
    """The scores (`nerkit.inference.evaluate.score`) of the spans above `threshold`."""
    return score(gold, spans_at(pipe, token_lists, pieces, found, threshold))


def platt_map(logits: list[float], right: list[bool], steps: int = 50) -> tuple[float, float]:
    """(scale, shift) minimising the log loss of sigmoid(scale * x + shift) against `right`, by
    Newton's method, with Platt's smoothed targets ((N+ + 1) / (N+ + 2) for a right one, 1 / (N- + 2)
    for a wrong one), so that a set the logits separate still gets a finite map. (1, 0) when the
    fit is not a positive scale (a map must keep the spans' order)."""
    x, y = np.asarray(logits, dtype=np.float64), np.asarray(right, dtype=bool)
    positives, negatives = int(y.sum()), int((~y).sum())
    if not len(x) or not positives or not negatives:
        return 1.0, 0.0
    target = np.where(y, (positives + 1) / (positives + 2), 1 / (negatives + 2))
    features = np.stack([x, np.ones_like(x)], axis=1)  # (N, 2)
    weights = np.array([1.0, 0.0])
    for _ in range(steps):
        p = 0.5 * (1 + np.tanh(0.5 * (features @ weights)))  # the sigmoid, with no overflow for a far logit
        gradient = features.T @ (p - target)
        hessian = (features * (p * (1 - p))[:, None]).T @ features + 1e-9 * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        weights = weights - step
        if np.abs(step).max() < 1e-10:
            break
    scale, shift = float(weights[0]), float(weights[1])
    return (scale, shift) if scale > 0 and math.isfinite(scale) and math.isfinite(shift) else (1.0, 0.0)


def mapped_probability(p: float, scale: float, shift: float, is_logit: bool = False) -> float:
    """sigmoid(scale x logit(p) + shift), `p` given as its logit with `is_logit`, written with tanh so
    that no value overflows (a far one is 0.0 or 1.0)."""
    x = p if is_logit else logit(min(max(p, 1e-12), 1 - 1e-12))
    return 0.5 * (1 + math.tanh(0.5 * (scale * x + shift)))


def fit_scores(pipe: Pipeline, token_lists: list, gold: list, pieces: list, found: list, threshold: float) -> dict:
    """Platt's map of the span head's scores, fitted on the spans predicted at `threshold` (right
    when span and type match a gold entity), composed with the model's present map and set on
    `pipe` with the threshold on the new scale (the same spans predicted); its figures."""
    def score_logit(p: float) -> float:  # a span's score back to its logit (a score may round to 0 or 1)
        return logit(min(max(p, 1e-12), 1 - 1e-12))

    predicted = spans_at(pipe, token_lists, pieces, found, threshold, scores=True)
    right = [{(g.start, g.end, g.type) for g in truth} for truth in gold]
    pairs = [(score_logit(s.score), (s.start, s.end, s.type) in entities)
             for spans, entities in zip(predicted, right) for s in spans]
    scale, shift = platt_map([x for x, _ in pairs], [r for _, r in pairs])
    if not 0.0 < mapped_probability(threshold, scale, shift) < 1.0:
        # a map so steep that the threshold on its scale rounds to 0 or 1 would lose which spans it
        # keeps (a barely trained model's scores, or negative sampling's, can fit one): none is fitted
        scale, shift = 1.0, 0.0

    def mapped(p: float) -> float:  # a probability through the new map
        return mapped_probability(score_logit(p), scale, shift, is_logit=True)

    old_scale, old_shift = pipe.span_score_map or (1.0, 0.0)
    pipe.span_score_map = (scale * old_scale, scale * old_shift + shift)
    pipe.span_threshold = mapped(threshold)
    before = calibration(gold, predicted)
    after = calibration(gold, [[Span(s.start, s.end, s.type, mapped(s.score)) for s in spans] for spans in predicted])
    return {**score_map_json(pipe.span_score_map), "threshold": pipe.span_threshold, "spans": len(pairs),
            "ece_before": round(before["ece"], 6), "ece_after": round(after["ece"], 6)}


def best_threshold(f1: dict[float, float]) -> float:
    """The threshold of the best F1; on a tie the one nearest 0.5, then the higher (fewer spans)."""
    return min(f1, key=lambda t: (-f1[t], round(abs(t - 0.5), 6), -t))  # rounded: 0.45 and 0.55 tie


def choose_threshold(pipe: Pipeline, sentences: list, where: str, batch_size: int = 128,
                     window: int | None = None) -> dict:
    """The span threshold of `GRID` that maximises micro F1 on the gold SENTENCES (a dev set, never
    the test set; `where` names it in messages), with the F1 at every threshold and the scores at
    the model's present threshold ("before") and at the chosen one ("after"). Sets it on `pipe`."""
    gold = [s.spans() for s in sentences]
    if not any(gold):
        raise UserError("the gold file has no entities: no threshold is better than another on it", where=where,
                        fix="choose the threshold on a labelled dev set")
    token_lists = [s.tokens for s in sentences]
    previous = pipe.threshold
    pieces, found = band_candidates(pipe, token_lists, batch_size, window, min(GRID[0], previous))
    by_threshold = {t: f1_at(pipe, token_lists, gold, pieces, found, t) for t in sorted({*GRID, previous})}
    chosen = best_threshold({t: m["f1"] for t, m in by_threshold.items() if t in GRID})
    brief = lambda m: {k: m[k] for k in ("precision", "recall", "f1")} | {"predicted": m["counts"]["predicted"]}  # noqa: E731
    score_map = fit_scores(pipe, token_lists, gold, pieces, found, chosen)
    return {"threshold": chosen, "data": where, "gold": by_threshold[chosen]["counts"]["gold"], "score_map": score_map,
            "before": {"threshold": previous, **brief(by_threshold[previous])},
            "after": {"threshold": chosen, **brief(by_threshold[chosen])},
            "grid": {str(t): round(by_threshold[t]["f1"], 6) for t in GRID}}


def span_meta(result: dict) -> dict:
    """The nerkit.json keys of a `choose_threshold` result: the threshold and the score map, on one scale."""
    fitted = result["score_map"]
    return {SPAN_THRESHOLD: fitted["threshold"], SPAN_SCORE_MAP: {k: fitted[k] for k in SCORE_MAP_KEYS}}


def write_threshold(model_dir: Path, result: dict) -> dict:
    """Write a `choose_threshold` result (the threshold of best dev F1 and the map of the scores
    fitted at it) into MODEL_DIR/nerkit.json, say so, and return it."""
    meta_path = update_meta(model_dir, span_meta(result))
    fitted = result["score_map"]
    log.info(f"span threshold {result['before']['threshold']:g} -> {result['threshold']:g} on {result['data']}: dev F1 "
             f"{100 * result['before']['f1']:.2f} -> {100 * result['after']['f1']:.2f}; scores mapped by "
             f"sigmoid({fitted['scale']:.3f} x {fitted['shift']:+.3f}) (threshold {fitted['threshold']:.3f} on that "
             f"scale): ECE {fitted['ece_before']:.4f} -> {fitted['ece_after']:.4f} over {fitted['spans']:,} spans; "
             f"wrote {meta_path}")
    return result


def choice_on_dev(pipe: Pipeline, sentences: list, batch_size: int) -> dict:
    """Training's choice after an epoch: the threshold chosen on the dev SENTENCES from the head's
    own scores (whatever an earlier epoch chose), set on `pipe`; what training keeps of it (the
    nerkit.json keys, the grid's threshold `chosen` and the F1 at span.threshold, `f1_at_default`)."""
    pipe.span_threshold, pipe.span_score_map = None, None
    chosen = choose_threshold(pipe, sentences, "the dev split", batch_size)
    return {**span_meta(chosen), "chosen": chosen["threshold"], "f1_at_default": chosen["before"]["f1"]}


def adopt_choice(pipe: Pipeline, choice: dict, directory: Path) -> None:
    """Set a `choice_on_dev` on `pipe` and write it into DIRECTORY/nerkit.json."""
    pipe.span_threshold = choice[SPAN_THRESHOLD]
    pipe.span_score_map = tuple(choice[SPAN_SCORE_MAP][k] for k in SCORE_MAP_KEYS)
    update_meta(directory, {k: choice[k] for k in (SPAN_THRESHOLD, SPAN_SCORE_MAP)})
