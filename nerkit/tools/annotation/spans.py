"""`nerkit data select --unit span`: the spans of a pool's texts that a CRF model is least sure of,
each a question a person answers by labelling just that span, written as a partial annotation
(the rest of its text unknown) that is training data once corrected.

The candidates of a text, from the CRF's exact probabilities at the calibrated temperature:
- each entity the model predicts, with uncertainty 1 - p, p the probability that exactly that span
  carries exactly that type (`CRF.entity_probabilities`): the probability that the pre-annotation is
  wrong;
- each maximal run of characters outside every predicted entity whose marginal probability of lying
  inside some entity, q = 1 - P(O), is at least LOW: a name the model may have missed, with
  uncertainty the largest q of the run, the probability that "no entity here" is wrong at its most
  doubtful character (a lower bound of it being wrong somewhere in the run). Both kinds are thus
  on one scale, the probability that the span's pre-annotation is wrong. There is no upper bound on
  q: a character the marginals put inside an entity while the best path says O is where the model
  is most likely wrong, not least. Whitespace is trimmed from a run's ends (it never edges an entity);
- candidates that overlap or touch are merged into one span, its uncertainty the highest of them: a
  predicted entity and a doubtful run beside it are one question (where does this name end?), and
  a person labels whole names anyway.
The `n` most uncertain spans of the pool are chosen (`random`: a seeded draw among the same
candidates, the baseline). A text's chosen spans make one task: one record per text, with the
model's entities inside them as the pre-annotation and every region outside them unknown, so the
spans of one sentence reach training together rather than as copies of the text that each call
the other's span unknown.

A span head is refused: its spans' probabilities are independent, with no per-character marginal
to find a missed name by, so its candidates would not mean what these do; `--unit sentence` ranks
it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from nerkit.data.tags import Span
from nerkit.errors import UserError

# A character outside the predicted entities joins a candidate when the model gives it at least this
# probability of lying inside an entity: below it, the model is 95% sure nothing is there, and a lower
# bound lets runs grow through ordinary context, which a person would then label for nothing.
LOW = 0.05


@dataclass(frozen=True)
class Candidate:
    """A span of text `text` (an index into the pool) to ask about, [start, end), and the
    probability that the model's pre-annotation of it is wrong."""

    text: int
    start: int
    end: int
    uncertainty: float


def candidate_spans(entities: list[Span], inside: list[float], text: str = "",
                    low: float = LOW) -> list[tuple[int, int, float]]:
    """One text's candidates (see the module's docstring) as (start, end, uncertainty), merged, in
    order: `entities` the predicted ones with their scores (an unscored one is taken as unsure
    through and through), `inside` each character's probability of lying inside an entity, `text`
    its characters (whitespace trimmed from the runs' ends)."""
    pieces = [(s.start, s.end, 1.0 - (s.score if s.score is not None else 0.0)) for s in entities]
    covered = [False] * len(inside)
    for s in entities:
        covered[s.start:s.end] = [True] * (s.end - s.start)
    run: list[int] = []
    for t in range(len(inside) + 1):
        if t < len(inside) and not covered[t] and inside[t] >= low:
            run.append(t)
            continue
        while run and text[run[-1]:run[-1] + 1].isspace():
            run.pop()
        while run and text[run[0]:run[0] + 1].isspace():
            run.pop(0)
        if run:
            pieces.append((run[0], run[-1] + 1, max(inside[k] for k in run)))
        run = []
    merged: list[list] = []
    for start, end, uncertainty in sorted(pieces):
        if merged and start <= merged[-1][1]:  # overlapping or touching: one question
            merged[-1][1] = max(merged[-1][1], end)
            merged[-1][2] = max(merged[-1][2], uncertainty)
        else:
            merged.append([start, end, uncertainty])
    return [(start, end, min(max(u, 0.0), 1.0)) for start, end, u in merged]


def require_marginals(pipe) -> None:
    """A span head cannot choose spans (the module's docstring says why): one line, exit 2."""
    if not pipe.head.supports_marginals:
        raise UserError(f"--unit span needs a CRF's marginals; this model's head is model.head: "
                        f"{pipe.config.model.head}", fix="use --unit sentence, or a model trained with model.head: crf")


def inside_probabilities(pipe, texts: list[str], batch_size: int = 64, window: int | None = None) -> list[list[float]]:
    """Per text, per character, the CRF's marginal probability that it lies inside some entity
    (1 - P(O)), at the model's calibrated temperature. A text longer than the window takes each
    character from the window that holds it most centrally (the earlier on a tie), the rule that
    chooses which window's entity is kept (`central_spans`)."""
    outside = pipe.tags.index("O")
    best = [[(-1, 0, 0.0)] * len(text) for text in texts]  # (margin, -window start, probability)
    for rows, emissions, mask, _ in pipe.decoded_windows(texts, batch_size, window):
        marginals = pipe.model.head.crf.marginals(emissions, mask, pipe.score_temperature)  # (B, T, K)
        inside = (1.0 - marginals[:, :, outside]).tolist()  # (B, T)
        for (i, start), row, length in zip(rows, inside, mask.sum(1).tolist()):
            for k in range(length):
                seen = (min(k, length - 1 - k), -start, row[k])
                if seen[:2] > best[i][start + k][:2]:
                    best[i][start + k] = seen
    return [[p for _, _, p in found] for found in best]


def within(start: int, end: int, known: list[bool] | None) -> bool:
    """Whether every character of [start, end) is already annotated."""
    return known is not None and all(known[start:end])


def select_spans(pipe, texts: list[str], n: int | None, strategy: str = "uncertainty", seed: int = 0,
                 batch_size: int = 64, window: int | None = None,
                 known: list[list[bool] | None] | None = None) -> tuple[list[Candidate], list[list[Span]]]:
    """The `n` spans of `texts` to ask about next (None: every candidate), the least sure first
    (`uncertainty`) or a seeded draw among the same candidates (`random`), and each text's predicted
    entities (scored). `known`:
    per text, the characters already annotated (None: none), where no candidate lying wholly inside
    them is asked again."""
    require_marginals(pipe)
    entities = pipe.predict_tokens(texts, batch_size, window, scores=True)
    inside = inside_probabilities(pipe, texts, batch_size, window)
    candidates = [Candidate(i, start, end, uncertainty)
                  for i, (text, found, probabilities) in enumerate(zip(texts, entities, inside))
                  for start, end, uncertainty in candidate_spans(found, probabilities, text)
                  if not within(start, end, known[i] if known else None)]
    n = len(candidates) if n is None else min(n, len(candidates))
    if strategy == "random":
        return random.Random(seed).sample(candidates, n), entities
    candidates.sort(key=lambda c: (-c.uncertainty, c.text, c.start))
    return candidates[:n], entities


def span_task(text: str, entities: list[Span], spans: list[tuple[int, int]]) -> tuple[list[Span], list[tuple[int, int]]]:
    """One text's task for its chosen `spans` (disjoint, apart, in order): the predicted entities
    inside them (the pre-annotation a person corrects) and the unknown regions, every region
    outside them."""
    inside = [e for e in entities if any(a <= e.start and e.end <= b for a, b in spans)]
    unknown, at = [], 0
    for a, b in spans:
        if a > at:
            unknown.append((at, a))
        at = b
    if at < len(text):
        unknown.append((at, len(text)))
    return inside, unknown
