"""A ranking measured against known errors (the benchmark of `nerkit data audit`): precision in the
top k, recall at k, and the area under the precision-recall curve as average precision (the mean,
over the errors, of the precision at each one's rank; an error the ranking never reaches adds 0),
the form scikit-learn's `average_precision_score` computes for a ranking without ties; and which
suspect finds which planted change."""

from __future__ import annotations

from nerkit.tools.audit.noise import Change
from nerkit.tools.audit.suspects import Suspect


def precision_at(hits: list[bool], k: int) -> float:
    """The share of errors among the first `k` of a ranking (`hits`: whether each, in ranked order, is
    one); a ranking shorter than k counts what it has over k."""
    return sum(hits[:k]) / k if k else 0.0


def recall_at(hits: list[bool], k: int, positives: int) -> float:
    return sum(hits[:k]) / positives if positives else 0.0


def average_precision(hits: list[bool], positives: int | None = None) -> float:
    """The area under the precision-recall curve of a ranking: the mean over the `positives` errors
    (default: those in the ranking) of the precision at each one's rank."""
    positives = sum(hits) if positives is None else positives
    if not positives:
        return 0.0
    found, total = 0, 0.0
    for rank, hit in enumerate(hits, 1):
        if hit:
            found += 1
            total += found / rank
    return total / positives


def ranking_scores(hits: list[bool], positives: int, ks: tuple[int, ...] = (10, 50, 100, 500)) -> dict:
    """Precision at each k of `ks` no longer than the ranking, precision and recall at k = the number
    of errors (R-precision: there they are equal when the ranking covers everything) and AUPRC."""
    scores = {f"precision_at_{k}": round(precision_at(hits, k), 4) for k in ks if k <= len(hits)}
    scores.update(positives=positives, recall_at_positives=round(recall_at(hits, positives, positives), 4),
                  auprc=round(average_precision(hits, positives), 4))
    return scores


def finds(suspect: Suspect, change: Change) -> bool:
    """Whether a suspect points at a planted change: the entity it disputes is the one the change
    made (retyped, moved or spurious), or the entity it proposes is the one the change took away
    (deleted, retyped or moved: the truth restored)."""
    if change.after is not None and suspect.labelled is not None and suspect.labelled == change.after:
        return True
    return change.before is not None and suspect.proposed is not None and suspect.proposed == change.before
