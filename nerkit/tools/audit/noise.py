"""The audit's noise protocol: known label errors planted in a corpus, seeded, so that a ranking can
be measured against them (`nerkit data corrupt`, `nerkit bench audit`).

Each entity, in corpus order, draws once: with probability `retype` it takes another type (drawn
uniformly among the corpus's other types), with `boundary` one of its ends moves by one or two
characters, out or in (drawn among the moves that leave it at least a character long, inside the
text, off whitespace, over no other entity and no unknown region; an entity with none is left as
it is), with `delete` it is removed (an omission). Then round(`spurious` x entities) spurious
entities are added, each in a drawn sentence at a drawn place that no entity or unknown region
touches, its length and type those of a drawn entity of the corpus (so they look like the real
ones). Every change is recorded: the sentence (its index among the corpus's sentences, and its
line), the kind (NOISE_KINDS), the entity before (None for a spurious one) and after (None for a
deleted one).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from nerkit.data.records import Sentence, span_sentence
from nerkit.data.tags import Span
from nerkit.errors import UserError

NOISE_KINDS = ("retype", "boundary", "delete", "spurious")
TRIES = 50  # places drawn for a spurious entity before that one is given up


@dataclass(frozen=True)
class NoiseRates:
    retype: float = 0.03
    boundary: float = 0.03
    delete: float = 0.03
    spurious: float = 0.01


@dataclass(frozen=True)
class Change:
    sentence: int
    kind: str
    before: Span | None
    after: Span | None

    def to_dict(self, sentences: list[Sentence]) -> dict:
        sent = sentences[self.sentence]
        return {"sentence": self.sentence, "line": sent.line or None, "kind": self.kind,
                "before": self.before.to_dict(sent.text) if self.before else None,
                "after": self.after.to_dict(sent.text) if self.after else None}


def free(span: Span, others: list[Span], known: list[bool], text: str) -> bool:
    """Whether `span` may be an entity beside `others`: inside the text, off whitespace at its ends,
    over no other entity and no unknown character."""
    if not (0 <= span.start < span.end <= len(text)):
        return False
    if text[span.start].isspace() or text[span.end - 1].isspace():
        return False
    return all(known[span.start:span.end]) and not any(o.start < span.end and span.start < o.end for o in others)


def moved(span: Span, others: list[Span], known: list[bool], text: str, rnd: random.Random) -> Span | None:
    moves = [(side, by) for side in ("start", "end") for by in (-2, -1, 1, 2)]
    rnd.shuffle(moves)
    for side, by in moves:
        new = Span(span.start + by, span.end, span.type) if side == "start" else Span(span.start, span.end + by, span.type)
        if free(new, others, known, text):
            return new
    return None


def corrupt(sentences: list[Sentence], rates: NoiseRates, seed: int) -> tuple[list[Sentence], list[Change]]:
    """The sentences with errors planted (see the module's docstring) and the changes made."""
    if rates.retype + rates.boundary + rates.delete > 1:
        raise UserError("--retype, --boundary and --delete share each entity's one draw: together at most 1",
                        fix="lower them")
    rnd = random.Random(seed)
    entities = [sent.spans() for sent in sentences]
    types = sorted({s.type for spans in entities for s in spans})
    changes: list[Change] = []
    for i, sent in enumerate(sentences):
        spans, known, text = list(entities[i]), sent.known(), sent.text
        for j, span in enumerate(list(spans)):
            draw = rnd.random()
            if draw < rates.retype:
                if len(types) > 1:
                    new = Span(span.start, span.end, rnd.choice([t for t in types if t != span.type]))
                    spans[spans.index(span)] = new
                    changes.append(Change(i, "retype", span, new))
            elif draw < rates.retype + rates.boundary:
                new = moved(span, [s for s in spans if s != span], known, text, rnd)
                if new is not None:
                    spans[spans.index(span)] = new
                    changes.append(Change(i, "boundary", span, new))
            elif draw < rates.retype + rates.boundary + rates.delete:
                spans.remove(span)
                changes.append(Change(i, "delete", span, None))
        entities[i] = spans
    originals = [s for spans in (sent.spans() for sent in sentences) for s in spans]
    for _ in range(round(rates.spurious * len(originals)) if originals else 0):
        for _ in range(TRIES):
            i = rnd.randrange(len(sentences))
            model = rnd.choice(originals)
            width = model.end - model.start
            text = sentences[i].text
            if len(text) < width:
                continue
            start = rnd.randrange(len(text) - width + 1)
            new = Span(start, start + width, model.type)
            if free(new, entities[i], sentences[i].known(), text) and all(
                    new.end <= s.start - 1 or s.end + 1 <= new.start for s in entities[i]):  # not touching either
                entities[i] = entities[i] + [new]
                changes.append(Change(i, "spurious", None, new))
                break
    noisy = []
    for sent, spans in zip(sentences, entities):
        spans = sorted(spans, key=lambda s: (s.start, s.end, s.type))
        if spans == sent.spans():
            noisy.append(sent)
        else:
            noisy.append(span_sentence(sent.text, spans, sent.line, sent.extra, sent.unknown))
    return noisy, changes


def read_truth(path: str | Path) -> list[Change]:
    """The changes `corrupt_file` wrote."""
    from nerkit.files import read_json_lines

    def span(value):
        return Span(value["start"], value["end"], value["type"]) if value else None

    return [Change(r["sentence"], r["kind"], span(r["before"]), span(r["after"]))
            for _, r in read_json_lines(path, "a change")]


def corrupt_file(source: str | Path, target: str | Path, truth: str | Path, rates: NoiseRates, seed: int,
                 limit: int = 0) -> dict[str, int]:
    """`nerkit data corrupt`: the corpus `source` (its first `limit` sentences, 0: all) with errors
    planted, written to `target` (JSON lines for .jsonl or .json, else CoNLL in the source's scheme),
    and every change to `truth`. Returns the count of each kind."""
    from nerkit.data.corpus import read_corpus, write_corpus
    from nerkit.files import atomic_write_text, check_output

    check_output(truth, source, target)
    corpus = read_corpus(source, limit=limit)
    sentences = corpus.sentences[:limit] if limit else corpus.sentences
    noisy, changes = corrupt(sentences, rates, seed)
    to = "jsonl" if Path(target).suffix in (".jsonl", ".json") else corpus.scheme
    write_corpus(target, noisy, to, source, corpus.format)
    atomic_write_text(truth, "".join(json.dumps(c.to_dict(sentences), ensure_ascii=False) + "\n" for c in changes))
    return {kind: sum(c.kind == kind for c in changes) for kind in NOISE_KINDS}
