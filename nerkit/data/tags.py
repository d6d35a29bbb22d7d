"""Tag schemes (BIO, BIOES, BMES) and entity spans: every rule about which tag may follow which lives
here and only here, used by corpus checking and repair, the CRF's masks, the stitching of windows,
inserted spaces, LAC's tags and the tests. Spans are token offsets, end exclusive."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from nerkit.config import SCHEMES  # the tag schemes, defined once there

_TAG_RE = re.compile(r"^([BIMES])-(\S+)$")

# A character nobody annotated (partial annotation, issue 57), in a character-per-line file: the
# dsner-news corpora's tag, in place of O where an annotator may have missed an entity. Inside nerkit
# its tag is an O placeholder and its position is in `Sentence.unknown`, so schemes and transitions
# read it as O (`UNK I-PER` breaks BIO as `O I-PER` does); writers put it back.
UNKNOWN_TAG = "UNK"


@dataclass(frozen=True)
class Span:
    start: int
    end: int  # exclusive
    type: str
    # A prediction's probability (the CRF's: exactly this span with exactly this type); None for
    # gold spans. Not part of equality: a predicted span matches a gold one by offsets and type.
    score: float | None = field(default=None, compare=False)

    def to_dict(self, text: str | None = None) -> dict:
        """The entity as nerkit writes it everywhere (`nerkit predict`, JSON-lines corpora, the API):
        {"start", "end", "type"}, given the sentence's text the entity's "text", and its "score"
        when it has one."""
        record = {"start": self.start, "end": self.end, "type": self.type}
        if text is not None:
            record["text"] = text[self.start:self.end]
        if self.score is not None:
            record["score"] = round(self.score, SCORE_DIGITS)
        return record


SCORE_DIGITS = 6  # decimals of a written score: finer than any threshold, and than float32 agrees


@lru_cache(maxsize=4096)
def split_tag(tag: str) -> tuple[str, str | None]:
    """`B-PER` -> ("B", "PER"); `O` -> ("O", None). The type is everything after the first '-'."""
    if tag == "O":
        return "O", None
    m = _TAG_RE.match(tag)
    if not m:
        raise ValueError(f"unknown tag {tag!r}: expected 'O' or a prefix B-, I-, M-, E-, S- followed by a type name")
    return m.group(1), m.group(2)


def continues(tag: str) -> bool:
    """Whether `tag` continues an entity opened before it (I-, M-, E-): no entity boundary lies
    just before a token with such a tag."""
    return split_tag(tag)[0] in ("I", "M", "E")


def detect_scheme(tags) -> str:
    """BMES if any M- tag, BIOES if any E-/S- tag, else BIO. Raises ValueError on I- mixed with M-."""
    prefixes = {t[0] for t in tags if t != "O"}
    if "M" in prefixes and "I" in prefixes:
        raise ValueError("the tags mix I- (BIO/BIOES) and M- (BMES)")
    if "M" in prefixes:
        return "bmes"
    if prefixes & {"E", "S"}:
        return "bioes"
    return "bio"


def tags_to_spans(tags: list[str]) -> list[Span]:
    """Entities as conlleval reads them: an inside tag that does not continue an open entity of
    its type (an orphan, or a type change) opens a new entity; E- and S- close one."""
    spans: list[Span] = []
    start, kind = None, None
    for i, tag in enumerate(tags):
        prefix, typ = split_tag(tag)
        continues = start is not None and kind == typ and prefix in ("I", "M", "E")
        if not continues and start is not None:
            spans.append(Span(start, i, kind))
            start, kind = None, None
        if prefix == "O":
            continue
        if start is None:
            start, kind = i, typ
        if prefix in ("E", "S"):
            spans.append(Span(start, i + 1, kind))
            start, kind = None, None
    if start is not None:
        spans.append(Span(start, len(tags), kind))
    return spans


def spans_to_tags(length: int, spans: list[Span], scheme: str) -> list[str]:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; use one of {', '.join(SCHEMES)}")
    inside = "M" if scheme == "bmes" else "I"
    tags = ["O"] * length
    for s in spans:
        if scheme == "bio":
            tags[s.start] = f"B-{s.type}"
            for i in range(s.start + 1, s.end):
                tags[i] = f"I-{s.type}"
        elif s.end - s.start == 1:
            tags[s.start] = f"S-{s.type}"
        else:
            tags[s.start] = f"B-{s.type}"
            for i in range(s.start + 1, s.end - 1):
                tags[i] = f"{inside}-{s.type}"
            tags[s.end - 1] = f"E-{s.type}"
    return tags


def spread_tag(tag: str, length: int, scheme: str) -> list[str]:
    """The tags of the `length` characters of one token tagged `tag`, when the token is split into
    its characters: its entity keeps its extent, and a sequence valid in `scheme` stays valid
    (`ab` tagged B-X: B-X I-X, or B-X M-X in BMES; S-X: B-X E-X; E-X: I-X E-X; O: O O)."""
    prefix, typ = split_tag(tag)
    if prefix == "O" or length == 1:
        return [tag] * length
    inside = f"{'M' if scheme == 'bmes' else 'I'}-{typ}"
    first = f"B-{typ}" if prefix in ("B", "S") else inside
    last = f"E-{typ}" if prefix in ("E", "S") else inside
    return [first] + [inside] * (length - 2) + [last]


def convert_tags(tags: list[str], scheme: str) -> list[str]:
    return spans_to_tags(len(tags), tags_to_spans(tags), scheme)


def scheme_tags(types: list[str], scheme: str) -> list[str]:
    """Every tag of `scheme` over `types`, in a fixed order (O first)."""
    prefixes = {"bio": "BI", "bioes": "BIES", "bmes": "BMES"}[scheme]
    return ["O"] + [f"{p}-{t}" for t in sorted(types) for p in prefixes]


@lru_cache(maxsize=4096)  # a corpus has few distinct pairs and millions of transitions
def invalid_transition(prev: str | None, tag: str, scheme: str) -> str | None:
    """Why `prev -> tag` breaks `scheme` (prev None = sentence start, tag None = sentence end)."""
    p_prefix, p_type = split_tag(prev) if prev else ("O", None)
    if tag is None:
        if scheme != "bio" and p_prefix in ("B", "I", "M"):
            return f"the entity {prev} is not closed before the sentence ends (expected E-{p_type})"
        return None
    prefix, typ = split_tag(tag)
    open_entity = p_prefix in ("B", "I", "M")
    if prefix in ("I", "M", "E"):
        if not open_entity:
            where = "at the sentence start" if prev is None else f"after {prev}"
            return f"{tag} {where} continues no entity (expected B-{typ} first)"
        if p_type != typ:
            return f"{tag} after {prev} changes the type inside an entity"
        return None
    if scheme != "bio" and open_entity:
        return f"{tag} after {prev}: the entity {prev} is not closed (expected E-{p_type})"
    return None


def transition_problems(tags: list[str], scheme: str):
    """(position, why) for every transition of `tags` that breaks `scheme`, the sentence's start
    and end included (position len(tags): the end)."""
    prev = None
    for i, tag in enumerate(tags + [None]):
        why = invalid_transition(prev, tag, scheme)
        if why:
            yield i, why
        prev = tag


def transition_table(tags: list[str]) -> tuple[list[bool], list[list[bool]], list[bool]]:
    """(start_ok, trans_ok, end_ok) over a tag set, as `invalid_transition` decides: start_ok[j],
    tag j may open a sentence; trans_ok[i][j], tag j may follow tag i; end_ok[i], tag i may close
    one. The scheme is read from the prefixes present: any E- or S- means entities must be closed
    (BIOES, BMES), otherwise BIO. The CRF's masks are this table."""
    if not tags:
        raise ValueError("empty tag set")
    if len(set(tags)) != len(tags):
        raise ValueError(f"duplicate tags in {tags!r}")
    scheme = "bioes" if any(split_tag(t)[0] in ("E", "S") for t in tags) else "bio"
    start_ok = [invalid_transition(None, t, scheme) is None for t in tags]
    trans_ok = [[invalid_transition(a, b, scheme) is None for b in tags] for a in tags]
    end_ok = [invalid_transition(t, None, scheme) is None for t in tags]
    return start_ok, trans_ok, end_ok
