"""The annotator that `nerkit bench loop` simulates with the gold labels: what each unit of annotation
asks (a whole sentence, or a span of one: `nerkit data select --unit`), how the gold answers it, what
the answers cost a person, and the training sentences they make. Each loop's labels are saved as
JSON after every round's choice, so a stopped loop resumes where it was.

The cost is counted in characters a person labels, plus QUERY_COST characters for each question,
under one rule for both units: a sentence is one question of its own length, a span one question of
its answered region's length (every character of it, even one an earlier answer had labelled: a
person relabels what is put before them). QUERY_COST stands for the context a person reads before
answering a span: the few characters on each side that decide a Chinese name's edges (a name of 2-4
characters, a word or two either side), which a sentence-level annotator reads as part of the
sentence anyway. Settles et al. (2008, "Active learning with real annotation costs") found a
sentence's annotation time grows with its length on top of a fixed cost per sentence; 10
characters, about two words either side of the span, is our estimate of that fixed part, not a
measurement. Each record keeps the characters and the questions apart, so the cost under any other
fixed cost is characters + k x questions.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, replace
from pathlib import Path

from nerkit.data.records import Sentence, unknown_regions
from nerkit.data.tags import Span
from nerkit.files import atomic_write_text

QUERY_COST = 10  # characters of context read per question (see the module's docstring)


def widen(start: int, end: int, gold: list[Span]) -> tuple[int, int]:
    """The region [start, end) as a person answers it: widened to cover every gold entity that
    crosses its edges (a person labels whole names), until none does."""
    changed = True
    while changed:
        changed = False
        for span in gold:
            if span.start < end and start < span.end and (span.start < start or span.end > end):
                start, end, changed = min(start, span.start), max(end, span.end), True
    return start, end


def known_mask(length: int, regions) -> list[bool]:
    """Per character, whether one of `regions` ((start, end) pairs) covers it."""
    known = [False] * length
    for start, end in regions:
        known[start:end] = [True] * (end - start)
    return known


def partial_sentence(sentence: Sentence, regions) -> Sentence:
    """`sentence` as the answers to `regions` (each widened: no gold entity crosses an edge) label
    it: its gold entities inside them, every other character unknown (its tag an O placeholder)."""
    known = known_mask(len(sentence), regions)
    tags = [tag if k else "O" for tag, k in zip(sentence.tags, known)]
    entities = None if sentence.entities is None else [s for s in sentence.entities if all(known[s.start:s.end])]
    return replace(sentence, tags=tags, entities=entities, unknown=unknown_regions(known))


def question_cost(characters: int, questions: int, query_cost: int) -> int:
    return characters + query_cost * questions


class SentenceLabels:
    """The sentence-level loop's labels: the training sentences labelled whole, in the order
    chosen (`start` at random, then `add` a round). State: OUT/state/STRATEGY-sSEED.json."""

    unit = "sentence"

    def __init__(self, train: list[Sentence], options, strategy: str, seed: int, state_dir: Path):
        self.train, self.options, self.strategy, self.seed = train, options, strategy, seed
        self.state_file = state_dir / f"{strategy}-s{seed}.json"
        self.labelled = start_sample(len(train), options.start, seed)
        if self.state_file.is_file():
            self.labelled = json.loads(self.state_file.read_text(encoding="utf-8"))["labelled"]

    def size(self, round_: int) -> int:
        return self.options.start + self.options.add * round_

    def chosen(self, round_: int) -> bool:
        """Whether the labels of `round_` have been chosen (by the model of the round before)."""
        return len(self.labelled) >= self.size(round_)

    def training(self, round_: int) -> list[Sentence]:
        return [self.train[i] for i in self.labelled[:self.size(round_)]]

    def tally(self, round_: int) -> dict:
        size = self.size(round_)
        characters = sum(len(self.train[i]) for i in self.labelled[:size])
        return {"sentences": size, "characters": characters, "queries": size,
                "cost": question_cost(characters, size, self.options.query_cost)}

    def choose(self, pipe, round_: int) -> None:
        """Round `round_`'s sentences, chosen by `pipe` (the model of the round before) from the rest."""
        from nerkit.tools.annotation.select import select

        size = self.size(round_ - 1)
        rest = sorted(set(range(len(self.train))) - set(self.labelled[:size]))
        picked = select(pipe, [self.train[i].text for i in rest], self.options.add, self.strategy,
                        self.seed * 1000 + round_ - 1)
        self.labelled = self.labelled[:size] + [rest[k] for k in picked]
        atomic_write_text(self.state_file, json.dumps({"labelled": self.labelled, "options": asdict(self.options)}) + "\n")


class SpanLabels:
    """The span-level loop's labels: `start` random sentences labelled whole (the sentence loop's
    own start), then each round the spans the model is least sure of (`select_spans`), answered from
    gold, until the round's questions cost `round_cost` characters. State: OUT/state/span-STRATEGY-sSEED.json,
    the answered regions with the round that asked each."""

    unit = "span"

    def __init__(self, train: list[Sentence], options, strategy: str, seed: int, state_dir: Path):
        self.train, self.options, self.strategy, self.seed = train, options, strategy, seed
        self.state_file = state_dir / f"span-{strategy}-s{seed}.json"
        self.complete = start_sample(len(train), options.start, seed)
        self.answers: list[list[int]] = []  # [round, sentence, start, end] of each question answered
        self.chosen_rounds = 0
        if self.state_file.is_file():
            state = json.loads(self.state_file.read_text(encoding="utf-8"))
            self.complete, self.answers, self.chosen_rounds = state["complete"], state["answers"], state["chosen"]

    @property
    def round_cost(self) -> int:
        """What a round's questions may cost: `options.span_cost`, or by default what `add` sentences
        of the training split's mean length cost, so the two loops' rounds are alike on the cost axis."""
        if self.options.span_cost:
            return self.options.span_cost
        mean = sum(len(s) for s in self.train) / len(self.train)
        return round(self.options.add * (mean + self.options.query_cost))

    def chosen(self, round_: int) -> bool:
        return round_ <= self.chosen_rounds

    def regions(self, round_: int) -> dict[int, list[tuple[int, int]]]:
        """The regions answered up to `round_`, by sentence."""
        found: dict[int, list[tuple[int, int]]] = {}
        for asked, i, start, end in self.answers:
            if asked <= round_:
                found.setdefault(i, []).append((start, end))
        return found

    def training(self, round_: int) -> list[Sentence]:
        return [self.train[i] for i in self.complete] + \
            [partial_sentence(self.train[i], regions) for i, regions in sorted(self.regions(round_).items())]

    def tally(self, round_: int) -> dict:
        answers = [a for a in self.answers if a[0] <= round_]
        characters = sum(len(self.train[i]) for i in self.complete) + sum(end - start for _, _, start, end in answers)
        queries = len(self.complete) + len(answers)
        return {"sentences": len(self.complete), "partial": len({a[1] for a in answers}), "characters": characters,
                "queries": queries, "cost": question_cost(characters, queries, self.options.query_cost)}

    def choose(self, pipe, round_: int) -> None:
        """Round `round_`'s questions: the spans of the sentences not labelled whole that `pipe` (the
        model of the round before) is least sure of, asked in that order and answered from gold
        (`widen`), skipping any span an earlier answer covers, until the round's cost is spent."""
        from nerkit.tools.annotation.spans import select_spans, within

        complete = set(self.complete)
        pool = [i for i in range(len(self.train)) if i not in complete]
        known = {i: known_mask(len(self.train[i]), regions) for i, regions in self.regions(round_ - 1).items()}
        ranked, _ = select_spans(pipe, [self.train[i].text for i in pool], None, self.strategy,
                                 self.seed * 1000 + round_ - 1, known=[known.get(i) for i in pool])
        spent, budget = 0, self.round_cost
        for candidate in ranked:
            if spent >= budget:
                break
            i = pool[candidate.text]
            if within(candidate.start, candidate.end, known.get(i)):
                continue  # an answer of this round labelled it already
            start, end = widen(candidate.start, candidate.end, self.train[i].spans())
            self.answers.append([round_, i, start, end])
            known.setdefault(i, [False] * len(self.train[i]))[start:end] = [True] * (end - start)
            spent += question_cost(end - start, 1, self.options.query_cost)
        self.chosen_rounds = round_
        atomic_write_text(self.state_file, json.dumps({"complete": self.complete, "answers": self.answers,
                                                       "chosen": self.chosen_rounds,
                                                       "options": asdict(self.options)}) + "\n")


UNIT_LABELS = {"sentence": SentenceLabels, "span": SpanLabels}  # by nerkit.tools.annotation.select.UNITS


def start_sample(size: int, start: int, seed: int) -> list[int]:
    """Round 0's sentences: the same `start` random ones for every unit and strategy of a seed."""
    return random.Random(seed).sample(range(size), start)
