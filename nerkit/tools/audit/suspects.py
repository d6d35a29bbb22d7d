"""What a fold model disputes in a sentence it never saw, from exact span probabilities: each labelled
entity's probability p (exactly that span with that type), and the spans the labels lack with theirs.

Every piece of evidence is on one scale, the model's probability that the labels are wrong there. A
suspect is evidence at or above its kind's threshold:
- "missing": a span overlapping no labelled entity (an omission, judged at `missing_threshold`,
  which may be lower: a model trained on labels that leave names out learns to leave them out too);
  its evidence is the probability that some entity the labels lack covers its characters
  (`unlabelled_mass`), since a model unsure of a name's boundaries or type may still be sure it is
  there, and the proposal is the likeliest such span;
- "type": a span of another type over a labelled entity's characters (the same span, or an
  overlapping one of another type), its evidence its probability;
- "boundary": an overlapping span of the labelled entity's type with other ends, likewise;
- "unsupported": a labelled entity with a character that no entity of its type covers, with that
  probability at or above the threshold, and no proposal over it (a spurious annotation, or one
  whose fix the model cannot name). Not 1 - p, p the entity's own probability: a model unsure of a
  correct name's exact ends spreads p over the variants, each of which still covers the name's
  characters with its type, and 1 - p would call it an error.
No suspect touches a region nobody annotated (`Sentence.unknown`): the labels say nothing there.

A sentence's suspicion score (`SCORES`):
- `entity`, confident learning's reading of the labels per character (Northcutt et al., JAIR 2021):
  for each character its labelled class (O, or the type of the labelled entity over it) and the
  model's probability of that class, its self-confidence (for one inside a labelled entity, that
  some entity of its type covers it; for one labelled O, P(O)): per character from a CRF's exact
  marginals, from the spans' summed probabilities for a span head. Each is compared with its class's
  threshold, the mean self-confidence over the corpus's characters of that class (`class_thresholds`,
  over every fold's held-out sentences), as a margin in log-odds, logit(1 - p) - logit(1 - t), and
  the sentence's score is its largest margin. cleanlab's token ranking reads the same probabilities
  with one bar for every class (the lowest self-confidence); with a bar per class, an O character
  the model gives a 10% chance of a name stands out as much as a name it gives 70%: O is read with
  near certainty (t about 0.98) and names are not (about 0.7), and fold models trained on labels that
  leave names out under-predict the names left out. The thresholds come from the corpus's own
  out-of-sample probabilities, so nothing is tuned to a corpus;
- `path`, log P(the model's best labelling) - log P(the given labelling), how much likelier the
  model finds its own reading of the whole sentence than the labels' (0 where they agree), which
  adds up every disagreement, confident or not.
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
NO_EVIDENCE = -100.0  # the `entity` score of a sentence with nothing annotated, below any margin (|logit| < 40)


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


def unlabelled_mass(cells: list[Span], labelled: list[Span], length: int) -> list[float]:
    """Per character, the probability that an entity the labels lack covers it: the summed
    probability of the spans over it that overlap no labelled entity. Exact for a CRF, whose spans
    over one character exclude each other (one path, one entity there); for the span head's
    independent spans, capped below 1. What an omission's evidence is: a model that spreads a
    name's probability over its possible boundaries and types (each below the bar) can still be
    sure that some name is there."""
    mass = [0.0] * length
    for cell in cells:
        if not any(overlaps(cell, s) for s in labelled):
            for t in range(cell.start, cell.end):
                mass[t] += cell.score
    return [min(m, 1 - 1e-16) for m in mass]


def covered_mass(cells: list[Span], length: int) -> list[float]:
    """Per character, the probability that some entity covers it (the summed probability of the
    spans over it, exact for a CRF, capped below 1)."""
    mass = [0.0] * length
    for cell in cells:
        for t in range(cell.start, cell.end):
            mass[t] += cell.score
    return [min(m, 1 - 1e-16) for m in mass]


def find_suspects(labelled: list[Span], cells: list[Span], known: list[bool], threshold: float = THRESHOLD,
                  missing_threshold: float | None = None, chars=None,
                  types: list[str] = ()) -> tuple[list[Suspect], list[tuple[int, float]]]:
    """A sentence's suspects, most confident first, and its characters' self-confidences (see the
    module's docstring; `sentence_score` ranks by them). `labelled`: the labelled entities, each
    scored with the model's probability (an unscored one, which the model could not judge, is left
    alone); `cells`: spans the labels lack, with theirs; `known`: per character, whether it is
    annotated; `chars`: where the model has them (a CRF's marginals), per character the probability
    of O and of each of `types`, (T, 1 + types), exact where the cells' sums leave out the spans
    below EVIDENCE_FLOOR."""
    missing_threshold = threshold if missing_threshold is None else missing_threshold
    judged = [c for c in cells if c.score is not None and not touches_unknown(c, known) and c not in labelled]
    unlabelled = unlabelled_mass(judged, labelled, len(known))
    proposals: list[tuple[float, Span, str, Span | None, float]] = []
    for cell in judged:
        kind, disputed = kind_of(cell, labelled)
        bar = missing_threshold if kind == "missing" else threshold
        evidence = max(unlabelled[cell.start:cell.end]) if kind == "missing" else cell.score
        if evidence >= bar:
            proposals.append((logit(evidence) - logit(bar), cell, kind, disputed, evidence))
    suspects, taken = [], []
    for margin, cell, kind, disputed, evidence in sorted(
            proposals, key=lambda p: (-p[0], -p[1].score, p[1].start, p[1].end, p[1].type)):
        if any(overlaps(cell, other) for other in taken):  # the likelier reading of those characters
            continue
        taken.append(cell)
        suspects.append(Suspect(kind, disputed, cell, evidence))
    # per character: a labelled one that no entity of its type covers, an O one that some entity covers
    spans = judged + [e for e in labelled if e.score is not None]
    if chars is None:
        outside_p = [1.0 - m for m in covered_mass(spans, len(known))]  # P(O) at each character
    else:
        outside_p = [float(row[0]) for row in chars]
    confidences: dict[int, tuple[int, float]] = {t: (0, outside_p[t]) for t in range(len(known))
                                                 if known[t] and not any(e.start <= t < e.end for e in labelled)}
    for entity in labelled:
        if entity.score is None:
            continue
        cls = 1 + list(types).index(entity.type) if entity.type in types else -1  # -1: a type the model lacks
        if chars is None:
            typed = covered_mass([c for c in spans if c.type == entity.type and overlaps(c, entity)], len(known))
        else:
            typed = [float(row[cls]) if cls >= 0 else 0.0 for row in chars]
        for t in range(entity.start, entity.end):
            if known[t]:
                confidences[t] = (cls, min(confidences.get(t, (cls, 1.0))[1], typed[t]))
        lowest = min(typed[entity.start:entity.end])
        evidence = 1.0 - lowest
        if evidence >= threshold and not any(overlaps(entity, cell) for cell in taken):
            suspects.append(Suspect("unsupported", entity, None, evidence))
    suspects.sort(key=lambda s: (-s.score, KINDS.index(s.kind)))
    return suspects, [confidences[t] for t in sorted(confidences)]


def class_thresholds(confidences: list[list[tuple[int, float]]], classes: int) -> list[float]:
    """Confident learning's per-class thresholds: for O (0) and each type (1 + its index), the mean
    self-confidence over the characters labelled with it, in every judged sentence; THRESHOLD for a
    class no character holds."""
    sums, counts = [0.0] * classes, [0] * classes
    for sentence in confidences:
        for cls, p in sentence:
            if cls >= 0:
                sums[cls] += p
                counts[cls] += 1
    return [sums[c] / counts[c] if counts[c] else THRESHOLD for c in range(classes)]


def sentence_score(confidences: list[tuple[int, float]], thresholds: list[float]) -> float:
    """The `entity` score: the largest margin, logit(1 - p) - logit(1 - t), of a character's
    self-confidence p below its class's threshold t (a type the model lacks counts as t = THRESHOLD);
    logit(1 - p) = -logit(p) keeps a p of 1e-20 apart from one of 1e-10. A sentence with nothing
    annotated scores as the least suspect."""
    return max((-logit(p) + logit(thresholds[cls] if cls >= 0 else THRESHOLD) for cls, p in confidences),
               default=NO_EVIDENCE)


def proposed_labels(labelled: list[Span], suspects: list[Suspect]) -> list[Span]:
    """The sentence's entities as the model would have them: the labelled ones, each suspect's fix
    applied (a missing entity added, an unsupported one removed, a type or boundary replaced)."""
    disputed = {s.labelled for s in suspects if s.labelled is not None}
    kept = [e for e in labelled if e not in disputed]
    added = [s.proposed for s in suspects if s.proposed is not None]
    return sorted({*kept, *added}, key=lambda s: (s.start, s.end, s.type))
