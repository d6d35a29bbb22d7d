"""Nested and overlapping entities: the one rule for when two entities overlap, what a sentence's or a
corpus's nesting is (entities inside another, crossing ones, depth, spans with two types), and the
flat projections that keep the outer or the inner entity of each overlap.

Two entities overlap when they share a character; one lies inside another when the other's offsets
hold its offsets and are not the same (the same offsets with two types is a span with two types).
Two overlapping entities of which neither holds the other cross. Spans are sorted and compared by
(start, end, type) triples, so a span with two types is two entities."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from nerkit.data.tags import Span

# What each projection keeps, as the messages say it.
FLAT_RULES = {
    "outer": "keeps the longest entity of each overlap, the earliest of equal ones, as spaCy's filter_spans does",
    "inner": "keeps the shortest entity of each overlap, the earliest of equal ones",
}


def overlap(a: Span, b: Span) -> bool:
    return a.start < b.end and b.start < a.end


def inside(a: Span, b: Span) -> bool:
    """Whether `a` lies inside `b`: within its offsets, and not at the same ones."""
    return b.start <= a.start and a.end <= b.end and (a.start, a.end) != (b.start, b.end)


def nested(spans: list[Span]) -> bool:
    """Whether any two of `spans` overlap (a span with two types overlaps itself)."""
    reach = -1
    for span in sorted(spans, key=lambda s: (s.start, s.end)):
        if span.start < reach:
            return True
        reach = max(reach, span.end)
    return False


def overlapping_pairs(spans: list[Span]) -> list[tuple[Span, Span]]:
    """Every pair of `spans` that overlap, in order of (start, end, type)."""
    spans = sorted(spans, key=lambda s: (s.start, s.end, s.type))
    return [(a, b) for i, a in enumerate(spans) for b in spans[i + 1:] if b.start < a.end]


def project(spans: list[Span], flat: str) -> list[Span]:
    """`spans` without overlaps: each overlap keeps its longest span (`outer`, spaCy's `filter_spans`)
    or its shortest (`inner`), ties going to the earliest (and of one span with two types, to the
    type first in alphabetical order, whatever order a file lists them in); spans claim their
    characters in that order. Sorted by start."""
    if flat not in FLAT_RULES:
        raise ValueError(f"unknown flat projection {flat!r}")
    sign = -1 if flat == "outer" else 1
    taken: set[int] = set()
    kept = []
    for span in sorted(spans, key=lambda s: (sign * (s.end - s.start), s.start, s.type)):
        if taken.isdisjoint(range(span.start, span.end)):
            kept.append(span)
            taken.update(range(span.start, span.end))
    return sorted(kept, key=lambda s: (s.start, s.end))


def depth(spans: list[Span]) -> int:
    """The longest chain of spans each inside the one before (a flat sentence's is 1, none's 0);
    a span with two types counts once."""
    places = sorted({(s.start, s.end) for s in spans}, key=lambda p: (p[0], -p[1]))  # holders before held
    chain: list[int] = []
    for i, (start, end) in enumerate(places):
        holders = [chain[j] for j in range(i) if places[j][0] <= start and end <= places[j][1]]
        chain.append(1 + max(holders, default=0))
    return max(chain, default=0)


@dataclass
class Nesting:
    """How nested a corpus is. `overlapping`: entities that share a character with another entity
    (CMeEE's README counts these); of them `inside`, those inside another, and `crossing`, those
    that cross one; `two_types`: spans (offsets) that carry more than one type; `depth`: the
    longest chain of entities each inside the one before; `sentences`: those with any overlap."""

    entities: int = 0
    overlapping: int = 0
    inside: int = 0
    crossing: int = 0
    two_types: int = 0
    depth: int = 0
    sentences: int = 0

    def add(self, spans: list[Span]) -> None:
        spans = sorted(set(spans), key=lambda s: (s.start, s.end, s.type))
        self.entities += len(spans)
        self.depth = max(self.depth, depth(spans))
        if not nested(spans):
            return
        self.sentences += 1
        touched = {s for pair in overlapping_pairs(spans) for s in pair}
        self.overlapping += len(touched)
        self.inside += sum(any(inside(s, t) for t in touched) for s in touched)
        self.crossing += sum(any(overlap(s, t) and not inside(s, t) and not inside(t, s)
                                 and (s.start, s.end) != (t.start, t.end) for t in touched) for s in touched)
        places = [(s.start, s.end) for s in spans]
        self.two_types += sum(places.count(p) > 1 for p in set(places))

    @property
    def is_nested(self) -> bool:
        return self.overlapping > 0

    def to_dict(self) -> dict:
        return asdict(self)


def nesting(spans_of_sentences) -> Nesting:
    """The Nesting of sentences given as their lists of spans."""
    found = Nesting()
    for spans in spans_of_sentences:
        found.add(spans)
    return found


def nested_entities(gold: list[Span]) -> set[Span]:
    """The entities of `gold` that share a character with another of them: evaluation's "nested"."""
    return {s for pair in overlapping_pairs(list(set(gold))) for s in pair}


def describe_pair(a: Span, b: Span, text: str) -> str:
    return f"{a.type} {text[a.start:a.end]!r} at {a.start}:{a.end} and {b.type} {text[b.start:b.end]!r} at {b.start}:{b.end}"


def describe(found: Nesting) -> str:
    """A corpus's nesting in words, for `nerkit data validate` and `stats`."""
    if not found.is_nested:
        return f"flat (no entity overlaps another), depth {found.depth}"
    share = f" ({found.overlapping / found.entities:.1%})" if found.entities else ""
    return (f"nested: {found.overlapping:,} of {found.entities:,} entities{share} overlap another in "
            f"{found.sentences:,} sentences ({found.inside:,} inside another, {found.crossing:,} crossing one), "
            f"depth {found.depth}, {found.two_types:,} spans with two types")
