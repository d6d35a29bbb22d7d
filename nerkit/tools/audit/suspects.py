"""What a fold model disputes in a sentence it never saw, from exact span probabilities: each labelled
entity's probability p (exactly that span with that type), and the spans the labels lack with theirs.

Every piece of evidence is on one scale, the model's probability that the labels are wrong there:
1 - p for a labelled entity, p for a span the labels lack. A suspect is evidence at or above its
kind's threshold:
- "missing": a span overlapping no labelled entity (an omission, judged at `missing_threshold`,
  which may be lower: a model trained on labels that leave names out learns to leave them out too);
- "type": a span of another type over a labelled entity's characters (the same span, or an
  overlapping one of another type);
- "boundary": an overlapping span of the labelled entity's type with other ends;
- "unsupported": a labelled entity with 1 - p at or above the threshold and no proposal over it (a
  spurious annotation, or one whose fix the model cannot name).
No suspect touches a region nobody annotated (`Sentence.unknown`): the labels say nothing there.

A sentence's suspicion score (`SCORES`): `entity`, the largest margin of any evidence over its kind's
threshold in log-odds (logit(e) - logit(threshold)), so that the sentence holding the single most
confident dispute comes first and a lower missing threshold raises omissions as it admits them;
`path`, log P(the model's best labelling) - log P(the given labelling), how much likelier the model
finds its own reading of the whole sentence than the labels' (0 where they agree), which adds up
every disagreement, confident or not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nerkit.data.tags import Span

KINDS = ("missing", "unsupported", "type", "boundary")
SCORES = ("entity", "path")  # the sentence suspicion scores; the first is the default
THRESHOLD = 0.5  # the evidence that makes a suspect: the model finds the labels' reading less likely than not
# Evidence below this is not kept: a span this unlikely says nothing a reviewer would act on.
EVIDENCE_FLOOR = 1e-4


@dataclass(frozen=True)
class Suspect:
    """One dispute: its kind (KINDS), the labelled entity and the proposed one (either may be None),
    each with the model's probability as its score, and the evidence that the labels are wrong."""

    kind: str
    labelled: Span | None
    proposed: Span | None
    score: float

    def to_dict(self, text: str) -> dict:
        return {"kind": self.kind, "score": round(self.score, 6),
                "labelled": self.labelled.to_dict(text) if self.labelled else None,
                "proposed": self.proposed.to_dict(text) if self.proposed else None}


def logit(p: float) -> float:
    """log(p / (1 - p)), finite: p is kept within what a float64 tells apart from 0 and 1, so that a
    labelled entity of probability 1e-30 still outranks one of 1e-20 (its evidence, 1 - p, is 1.0 for
    both; logit(1 - p) = -logit(p) keeps them apart)."""
    p = min(max(p, 1e-300), 1 - 1e-16)
    return math.log(p) - math.log1p(-p)


def overlaps(a: Span, b: Span) -> bool:
    return a.start < b.end and b.start < a.end


def touches_unknown(span: Span, known: list[bool]) -> bool:
    return not all(known[span.start:span.end])


def kind_of(cell: Span, labelled: list[Span]) -> tuple[str, Span | None]:
    """A span the labels lack, against the labelled entities: its kind and the labelled entity it
    disputes (the most overlapping; None for "missing")."""
    over = [s for s in labelled if overlaps(s, cell)]
    if not over:
        return "missing", None
    best = max(over, key=lambda s: (min(s.end, cell.end) - max(s.start, cell.start), s.type == cell.type, -s.start))
    if (best.start, best.end) == (cell.start, cell.end) or best.type != cell.type:
        return "type", best
    return "boundary", best


def find_suspects(labelled: list[Span], cells: list[Span], known: list[bool], threshold: float = THRESHOLD,
                  missing_threshold: float | None = None) -> tuple[list[Suspect], float]:
    """A sentence's suspects, most confident first, and its `entity` score (see the module's
    docstring). `labelled`: the labelled entities, each scored with the model's probability (an
    unscored one, which the model could not judge, is left alone); `cells`: spans the labels lack,
    with theirs; `known`: per character, whether it is annotated."""
    missing_threshold = threshold if missing_threshold is None else missing_threshold
    best = logit(EVIDENCE_FLOOR) - logit(max(threshold, missing_threshold))  # a sentence with no evidence at all
    proposals: list[tuple[float, Span, str, Span | None]] = []
    for cell in cells:
        if cell.score is None or touches_unknown(cell, known) or cell in labelled:
            continue
        kind, disputed = kind_of(cell, labelled)
        bar = missing_threshold if kind == "missing" else threshold
        margin = logit(cell.score) - logit(bar)
        best = max(best, margin)
        if cell.score >= bar:
            proposals.append((margin, cell, kind, disputed))
    suspects, taken = [], []
    for margin, cell, kind, disputed in sorted(proposals, key=lambda p: (-p[0], p[1].start, p[1].end, p[1].type)):
        if any(overlaps(cell, other) for other in taken):  # the likelier reading of those characters
            continue
        taken.append(cell)
        suspects.append(Suspect(kind, disputed, cell, cell.score))
    for entity in labelled:
        if entity.score is None:
            continue
        evidence = 1.0 - entity.score
        best = max(best, -logit(entity.score) - logit(threshold))
        if evidence >= threshold and not any(overlaps(entity, cell) for cell in taken):
            suspects.append(Suspect("unsupported", entity, None, evidence))
    suspects.sort(key=lambda s: (-s.score, KINDS.index(s.kind)))
    return suspects, best


def proposed_labels(labelled: list[Span], suspects: list[Suspect]) -> list[Span]:
    """The sentence's entities as the model would have them: the labelled ones, each suspect's fix
    applied (a missing entity added, an unsupported one removed, a type or boundary replaced)."""
    disputed = {s.labelled for s in suspects if s.labelled is not None}
    kept = [e for e in labelled if e not in disputed]
    added = [s.proposed for s in suspects if s.proposed is not None]
    return sorted({*kept, *added}, key=lambda s: (s.start, s.end, s.type))
