"""Entity-level scoring: strict span match (same start, end and type), overall and per type.

This is the only scoring code: training's dev F1 and `nerkit eval` both call `score`. Spans are
read from tags as conlleval reads them, so the figures equal conlleval's on the same file.

Nested gold (entities that overlap: nerkit.data.nesting) is counted exactly, each sentence's
entities a set of (start, end, type), so a span with two types is two entities; the figures are
then also split into NESTING classes: `nested`, the gold entities that share a character with
another gold entity and the predictions that share a character with one of those, and `flat`, the
rest (a correct prediction falls in its gold entity's class). A flat gold corpus has no split.
"""

from __future__ import annotations

from nerkit.data.nesting import nested_entities
from nerkit.data.tags import Span

NESTING = ("nested", "flat")


def nesting_class(gold: list[Span], nested: set[Span] | None = None):
    """A function from an entity (gold or predicted) of a sentence with these `gold` entities to
    its NESTING class; `nested`: the sentence's nested gold entities, when known."""
    nested = nested_entities(gold) if nested is None else nested
    if not nested:
        return lambda span: "flat"
    return lambda span: "nested" if any(span.start < g.end and g.start < span.end for g in nested) else "flat"


def _prf(correct: int, predicted: int, gold: int) -> dict:
    p = correct / predicted if predicted else 0.0
    r = correct / gold if gold else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"precision": p, "recall": r, "f1": f}


def score(gold: list[list[Span]], predicted: list[list[Span]]) -> dict:
    """`{"precision", "recall", "f1", "per_type": {T: {"precision", "recall", "f1", "support"}}}`
    with fractions in [0, 1]; `support` is the number of gold entities of the type."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    counts: dict[str, list[int]] = {}  # type -> [correct, predicted, gold]
    split = {k: [0, 0, 0] for k in NESTING}  # the same by nesting class
    any_nested = False
    for g_spans, p_spans in zip(gold, predicted):
        g_set, p_set = set(g_spans), set(p_spans)
        nested = nested_entities(list(g_set))
        any_nested = any_nested or bool(nested)
        kind = nesting_class(list(g_set), nested)
        for s in g_set:
            counts.setdefault(s.type, [0, 0, 0])[2] += 1
            split[kind(s)][2] += 1
        for s in p_set:
            c, k = counts.setdefault(s.type, [0, 0, 0]), split[kind(s)]
            c[1] += 1
            k[1] += 1
            if s in g_set:
                c[0] += 1
                k[0] += 1
    totals = [sum(c[i] for c in counts.values()) for i in range(3)]
    result = _prf(*totals)
    result["per_type"] = {t: {**_prf(*c), "support": c[2]} for t, c in sorted(counts.items())}
    result["counts"] = {"correct": totals[0], "predicted": totals[1], "gold": totals[2]}
    if any_nested:  # a flat gold corpus's metrics are as they were
        result["nesting"] = {k: {**_prf(*c), "support": c[2],
                                 "counts": {"correct": c[0], "predicted": c[1], "gold": c[2]}} for k, c in split.items()}
    return result


CALIBRATION_BINS = 10  # equal-width bins of the score in a reliability table
# Fewer gold entities than this, or predicted, and a score map fitted on them (a temperature, a span
# threshold) says more about the file than about the model: `nerkit calibrate` refuses unless its
# caller lowers the bar (--min-entities).
MIN_CALIBRATION_ENTITIES = 100
THRESHOLDS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)


def calibration(gold: list[list[Span]], predicted: list[list[Span]], bins: int = CALIBRATION_BINS) -> dict:
    """How honest the predicted spans' scores are, a prediction being right when its span and type
    match a gold entity exactly: `bins`, the reliability table (per equal-width score bin: count,
    mean score, share right); `ece`, the expected calibration error (the bins' |share right - mean
    score| weighted by their counts); `brier`, the mean squared gap between score and rightness;
    and `thresholds`, precision, recall and F1 of the spans kept at each score threshold."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    pairs = []  # (score, right)
    for g_spans, p_spans in zip(gold, predicted):
        g_set = set(g_spans)
        for s in set(p_spans):
            if s.score is None:
                raise ValueError("calibration needs scored predictions (predict_tokens(..., scores=True))")
            pairs.append((s.score, s in g_set))
    table = [[0, 0.0, 0] for _ in range(bins)]  # count, summed score, right
    for value, right in pairs:
        row = table[min(int(value * bins), bins - 1)]
        row[0] += 1
        row[1] += value
        row[2] += right
    total = len(pairs)
    gold_count = sum(len(set(g)) for g in gold)
    return {
        "entities": total,
        "ece": sum(abs(right - summed) for _, summed, right in table) / total if total else 0.0,
        "brier": sum((value - right) ** 2 for value, right in pairs) / total if total else 0.0,
        "bins": [{"low": k / bins, "high": (k + 1) / bins, "count": n, "mean_score": summed / n if n else None,
                  "accuracy": right / n if n else None} for k, (n, summed, right) in enumerate(table)],
        "thresholds": [{"threshold": t, **_prf(sum(r for v, r in pairs if v >= t), sum(1 for v, _ in pairs if v >= t),
                                               gold_count)} for t in THRESHOLDS],
    }


def format_calibration(found: dict) -> str:
    """`calibration` as two tables: the reliability bins, then P/R/F1 by threshold."""
    rows = [("score", "entities", "mean score", "right")]
    for b in found["bins"]:
        rows.append((f"{b['low']:.1f}-{b['high']:.1f}", str(b["count"]),
                     "" if b["mean_score"] is None else f"{b['mean_score']:.3f}",
                     "" if b["accuracy"] is None else f"{b['accuracy']:.3f}"))
    rows.append(("all", str(found["entities"]), f"ECE {found['ece']:.4f}", f"Brier {found['brier']:.4f}"))
    by_threshold = [("min score", "precision", "recall", "f1")]
    by_threshold += [(f"{t['threshold']:.2f}", f"{100 * t['precision']:.2f}", f"{100 * t['recall']:.2f}",
                      f"{100 * t['f1']:.2f}") for t in found["thresholds"]]
    return _rule_table(rows) + "\n\n" + _rule_table(by_threshold, total=False)


# Upper bounds of the length buckets, in characters. Sentences: MSRA's test set has sentences far longer
# than its training split, which are read in windows (data.max_len, often 250); entities: one
# character, two (most names), and on to the long organisation names.
SENTENCE_BOUNDS = (50, 100, 250)
ENTITY_BOUNDS = (1, 2, 3, 4, 6, 10)


def length_buckets(bounds: tuple[int, ...]) -> list[tuple[str, int, int | None]]:
    """(label, above, up to) per bucket: 1 to bounds[0], ..., above bounds[-1] (up to None)."""
    edges = [0, *bounds, None]
    return [(f">{lo}" if hi is None else str(hi) if hi == lo + 1 else f"{lo + 1}-{hi}", lo, hi)
            for lo, hi in zip(edges, edges[1:])]


def by_length(gold: list[list[Span]], predicted: list[list[Span]], lengths: list[int],
              sentence_bounds: tuple[int, ...] = SENTENCE_BOUNDS, entity_bounds: tuple[int, ...] = ENTITY_BOUNDS) -> dict:
    """Where the errors lie by length (`nerkit eval --by-length`): `sentence`, `score` of the
    sentences of each length bucket (`lengths`: each sentence's characters), then of every sentence
    up to the last bound (those read without a window when it is data.max_len); `entity`, `score`
    of the gold and predicted entities of each length (a right prediction has its gold entity's
    length, so each bucket's precision and recall are its own). Empty buckets are left out."""
    if not len(gold) == len(predicted) == len(lengths):
        raise ValueError(f"{len(gold)} gold sentences, {len(predicted)} predicted, {len(lengths)} lengths")
    sentence = []
    for label, lo, hi in [*length_buckets(sentence_bounds), (f"1-{sentence_bounds[-1]}", 0, sentence_bounds[-1])]:
        idx = [i for i, n in enumerate(lengths) if lo < n and (hi is None or n <= hi)]
        if idx:
            found = score([gold[i] for i in idx], [predicted[i] for i in idx])
            sentence.append({"length": label, "sentences": len(idx), "characters": sum(lengths[i] for i in idx),
                             **_totals(found)})
    entity = []
    for label, lo, hi in length_buckets(entity_bounds):
        def within(spans: list[Span]) -> list[Span]:
            return [s for s in spans if lo < s.end - s.start and (hi is None or s.end - s.start <= hi)]

        found = score([within(g) for g in gold], [within(p) for p in predicted])
        if found["counts"]["gold"] or found["counts"]["predicted"]:
            entity.append({"length": label, **_totals(found)})
    return {"sentence": sentence, "entity": entity}


def _totals(found: dict) -> dict:
    return {"gold": found["counts"]["gold"], "predicted": found["counts"]["predicted"],
            **{k: found[k] for k in ("precision", "recall", "f1")}}


def format_by_length(found: dict) -> str:
    """`by_length` as two tables: by sentence length, then by entity length."""
    def prf(row: dict) -> tuple[str, ...]:
        return (str(row["gold"]), str(row["predicted"]),
                *(f"{100 * row[k]:.2f}" for k in ("precision", "recall", "f1")))

    sentences = [("sentence length", "sentences", "characters", "gold", "predicted", "precision", "recall", "f1")]
    sentences += [(r["length"], str(r["sentences"]), str(r["characters"]), *prf(r)) for r in found["sentence"]]
    entities = [("entity length", "gold", "predicted", "precision", "recall", "f1")]
    entities += [(r["length"], *prf(r)) for r in found["entity"]]
    return _rule_table(sentences, total=True) + "\n\n" + _rule_table(entities, total=False)


ERROR_KINDS = ("correct", "wrong_type", "wrong_boundary", "wrong_both", "missed", "spurious")


def errors(gold: list[list[Span]], predicted: list[list[Span]]) -> dict[str, dict[str, int]]:
    """What became of each gold entity, by its type: `correct` (same start, end and type),
    `wrong_type` (a prediction with its exact start and end but another type), `wrong_boundary` (an
    overlapping prediction of its type), `wrong_both` (only overlapping predictions of other types)
    or `missed` (no prediction overlaps it), taken in that order when several predictions touch it;
    and, by the predicted type, `spurious`: predictions that overlap no gold entity. Per type,
    correct + wrong_type + wrong_boundary + wrong_both + missed is the gold count."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    counts: dict[str, dict[str, int]] = {}
    for g_spans, p_spans in zip(gold, predicted):
        for span, kind in sentence_errors(g_spans, p_spans):
            counts.setdefault(span.type, dict.fromkeys(ERROR_KINDS, 0))[kind] += 1
    return dict(sorted(counts.items()))


def nesting_errors(gold: list[list[Span]], predicted: list[list[Span]]) -> dict[str, dict[str, int]] | None:
    """`errors` by NESTING class instead of by type (what a flat model misses of nested gold), or
    None for a flat gold corpus."""
    counts = {k: dict.fromkeys(ERROR_KINDS, 0) for k in NESTING}
    any_nested = False
    for g_spans, p_spans in zip(gold, predicted):
        nested = nested_entities(list(set(g_spans)))
        any_nested = any_nested or bool(nested)
        kind = nesting_class(g_spans, nested)
        for span, what in sentence_errors(g_spans, p_spans):
            counts[kind(span)][what] += 1
    return counts if any_nested else None


def sentence_errors(gold: list[Span], predicted: list[Span]) -> list[tuple[Span, str]]:
    """One sentence's part of `errors`: each gold entity with what became of it, then each
    spurious prediction with `spurious`, in order of position. `errors` counts these, and the HTML
    report (report.py) shows them, so the two never disagree."""
    g_set, p_set = set(gold), set(predicted)
    found = []
    for g in sorted(g_set, key=_position):
        touching = [p for p in p_set if _overlap(p, g)]
        if g in p_set:
            kind = "correct"
        elif any((p.start, p.end) == (g.start, g.end) for p in touching):
            kind = "wrong_type"
        elif any(p.type == g.type for p in touching):
            kind = "wrong_boundary"
        else:
            kind = "wrong_both" if touching else "missed"
        found.append((g, kind))
    found += [(p, "spurious") for p in sorted(p_set, key=_position) if not any(_overlap(p, g) for g in g_set)]
    return found


def _position(span: Span) -> tuple[int, int, str]:
    return span.start, span.end, span.type


def _overlap(a: Span, b: Span) -> bool:
    return a.start < b.end and b.start < a.end


def format_errors(counts: dict[str, dict[str, int]], by_nesting: dict[str, dict[str, int]] | None = None) -> str:
    """`errors` as a table: one row per type and a total, gold count first; with `by_nesting`
    (`nesting_errors`), a second table of the same by nesting class."""
    header = ("type", "gold", "correct", "wrong type", "wrong boundary", "wrong both", "missed", "spurious")
    total = {k: sum(c[k] for c in counts.values()) for k in ERROR_KINDS}
    rows = [header] + [(t, str(sum(c[k] for k in ERROR_KINDS[:5])), *(str(c[k]) for k in ERROR_KINDS))
                       for t, c in [*counts.items(), ("overall", total)]]
    if not by_nesting:
        return _rule_table(rows)
    split = [("entities", *header[1:])] + [(k, str(sum(c[w] for w in ERROR_KINDS[:5])), *(str(c[w]) for w in ERROR_KINDS))
                                           for k, c in by_nesting.items()]
    return _rule_table(rows) + "\n\n" + _rule_table(split, total=False)


def format_table(metrics: dict) -> str:
    """The scores by type and overall; for nested gold, then by nesting class (`score`'s "nesting")."""
    rows = [("type", "precision", "recall", "f1", "support")]
    for t, m in metrics["per_type"].items():
        rows.append((t, f"{100 * m['precision']:.2f}", f"{100 * m['recall']:.2f}", f"{100 * m['f1']:.2f}", str(m["support"])))
    rows.append(("overall", f"{100 * metrics['precision']:.2f}", f"{100 * metrics['recall']:.2f}",
                 f"{100 * metrics['f1']:.2f}", str(metrics["counts"]["gold"])))
    if "nesting" not in metrics:
        return _rule_table(rows)
    split = [("entities", *rows[0][1:])] + [
        (k, f"{100 * m['precision']:.2f}", f"{100 * m['recall']:.2f}", f"{100 * m['f1']:.2f}", str(m["support"]))
        for k, m in metrics["nesting"].items()]
    return _rule_table(rows) + "\n\n" + _rule_table(split, total=False)


def _rule_table(rows: list[tuple[str, ...]], total: bool = True) -> str:
    """Rows as aligned columns (the first left, the rest right), ruled under the header and, when
    the last row is a `total`, above it."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    if total:
        lines.insert(len(lines) - 1, "-" * len(lines[0]))
    return "\n".join(lines)
