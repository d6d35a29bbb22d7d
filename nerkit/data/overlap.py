"""Unlabelled text against labelled sentences: which lines of a text overlap an evaluation set, so that
a language model adapted to the text (`nerkit lm adapt --exclude`) has never read a dev or test
sentence. People's Daily's unlabelled January 1998 text is where the People's Daily NER splits were
cut from, and a task's own training text holds MSRA's carved dev set unless it is taken out.

A line overlaps a set when it contains one of the set's sentences whole, or is itself contained in
one of them; sentences and lines shorter than `min_chars` (a dateline, a bare name) are not compared,
since they recur everywhere without meaning that the line is the sentence. Whitespace is ignored on
both sides (corpora are read character by character; raw text keeps its spaces).

The search slides a window of `min_chars` characters over each line and looks it up in two tables:
the first `min_chars` characters of every sentence (to find a sentence the line contains), and every
`min_chars`-gram of every sentence (a line inside a sentence starts with one of them); a hit is then
checked in full. Time is linear in the text, memory in the sentences."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

MIN_CHARS = 8


def _squeeze(text: str) -> str:
    return "".join(text.split())


@dataclass
class OverlapReport:
    """One labelled set against the text: its sentences (of at least `min_chars`), how many of them the
    text holds, and how many lines of the text were taken out because of it."""
    name: str
    sentences: int
    found: int = 0
    lines_removed: int = 0

    def to_dict(self) -> dict:
        return {"set": self.name, "sentences": self.sentences, "found_in_text": self.found,
                "lines_removed": self.lines_removed}


class OverlapIndex:
    """The sentences of one labelled set, ready to be looked for in lines of text."""

    def __init__(self, sentences: list[str], min_chars: int = MIN_CHARS):
        self.min_chars = min_chars
        self.sentences = sorted({s for s in map(_squeeze, sentences) if len(s) >= min_chars})
        self.by_start: dict[str, list[int]] = defaultdict(list)  # first min_chars characters -> sentence ids
        self.grams: set[str] = set()  # every min_chars-gram of every sentence
        for i, sentence in enumerate(self.sentences):
            self.by_start[sentence[:min_chars]].append(i)
            self.grams.update(sentence[k:k + min_chars] for k in range(len(sentence) - min_chars + 1))
        self.joined = "\n".join(self.sentences)  # to confirm that a line lies inside one sentence

    def contained(self, line: str) -> list[int]:
        """The ids of the sentences that `line` contains whole."""
        line, k, found = _squeeze(line), self.min_chars, []
        for start in range(len(line) - k + 1):
            for i in self.by_start.get(line[start:start + k], ()):
                if line.startswith(self.sentences[i], start):
                    found.append(i)
        return found

    def inside(self, line: str) -> bool:
        """Whether `line` (at least min_chars long) lies inside one of the sentences."""
        line = _squeeze(line)
        return len(line) >= self.min_chars and line[:self.min_chars] in self.grams and line in self.joined


def remove_overlaps(lines: list[str], sets: dict[str, list[str]],
                    min_chars: int = MIN_CHARS) -> tuple[list[str], list[OverlapReport]]:
    """`lines` without those that overlap any of `sets` (name -> sentences), and a report per set. A
    line that overlaps several sets counts as removed in each."""
    indexes = {name: OverlapIndex(sentences, min_chars) for name, sentences in sets.items()}
    reports = {name: OverlapReport(name, len(index.sentences)) for name, index in indexes.items()}
    seen = {name: set() for name in sets}
    kept = []
    for line in lines:
        overlapping = False
        for name, index in indexes.items():
            contained = index.contained(line)
            seen[name].update(contained)
            if contained or index.inside(line):
                reports[name].lines_removed += 1
                overlapping = True
        if not overlapping:
            kept.append(line)
    for name, report in reports.items():
        report.found = len(seen[name])
    return kept, list(reports.values())
