"""`nerkit calibrate` on a span-head model: choose the threshold (the probability above which a span
is predicted) that maximises micro F1 on a dev set, and keep it in the model directory (nerkit.json's
`span_threshold`), where prediction, evaluation, the server and an export made afterwards read it.

GlobalPointer's default threshold, 0.5 (logit 0), is no more than a default: a head trained on
many more negative spans than positive ones tends to predict too few. The band logits are
computed once, every span above the lowest threshold tried is kept with its logit, and each
threshold of `GRID` decodes from those (windows stitched and `span.flat` applied as prediction
does), so the F1 at each is exactly what `nerkit eval` reports at that threshold.
"""

from __future__ import annotations

import logging
from pathlib import Path

from nerkit.errors import UserError
from nerkit.inference.evaluate import score
from nerkit.inference.model_dir import SPAN_THRESHOLD, update_meta
from nerkit.inference.pipeline import Pipeline
from nerkit.model.span_decode import band_cut, threshold_spans, with_probabilities

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
        band = pipe.model.span_band(batch).float().cpu().numpy()  # (B, K, T, W)
        for (i, a, b), logits in zip(pieces, band):
            found[i, a, b] = threshold_spans(logits, b - a, cut)
    pieces = sorted(found)
    return pieces, [found[p] for p in pieces]


def f1_at(pipe: Pipeline, token_lists: list, gold: list, pieces: list, found: list, threshold: float) -> dict:
    """The scores (`nerkit.inference.evaluate.score`) of the spans above `threshold`, stitched as
    prediction stitches them."""
    cut = band_cut(threshold)
    decoded = [with_probabilities([s for s in spans if s[3] > cut]) for spans in found]
    return score(gold, pipe.stitched_spans(token_lists, pieces, decoded, scores=False))


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
    pipe.span_threshold = chosen
    return {"threshold": chosen, "data": where, "gold": by_threshold[chosen]["counts"]["gold"],
            "before": {"threshold": previous, **brief(by_threshold[previous])},
            "after": {"threshold": chosen, **brief(by_threshold[chosen])},
            "grid": {str(t): round(by_threshold[t]["f1"], 6) for t in GRID}}


def calibrate_threshold(pipe: Pipeline, model_dir: Path, sentences: list, where: str, batch_size: int = 128,
                        window: int | None = None) -> dict:
    """Choose the span threshold of MODEL_DIR (loaded as `pipe`) that maximises micro F1 on the gold
    SENTENCES (a dev set, never the test set; `where` names them), write it into
    MODEL_DIR/nerkit.json, and return it with the F1 at every threshold of `GRID` and the dev scores
    before and after."""
    result = choose_threshold(pipe, sentences, where, batch_size, window)
    meta_path = update_meta(model_dir, SPAN_THRESHOLD, result["threshold"])
    log.info(f"span threshold {result['before']['threshold']:g} -> {result['threshold']:g} on {where}: dev F1 "
             f"{100 * result['before']['f1']:.2f} -> {100 * result['after']['f1']:.2f}; wrote {meta_path}")
    return result
