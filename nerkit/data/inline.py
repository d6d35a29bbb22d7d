"""Inline markup, one text a line with each entity written in place as `[北京]LOC`: what `nerkit predict
--format inline` writes (`inline_line`, imported by nerkit.inference.formats) and what `nerkit data
convert --from inline` reads back (`read_inline`), by the one rule `ENTITY`.

The markup has no escape, so the rule reads back what the writer wrote when an entity's text holds no
bracket and its type is ASCII letters and `_` (dots inside: `PER.NAM`), and when no ASCII letter follows
an entity in the text; anything else in brackets is plain text. Other types round-trip through jsonl.
"""

from __future__ import annotations

import re
from pathlib import Path

from nerkit.data.records import (
    Corpus,
    Overlaps,
    Sentence,
    _decode,
    _Problems,
    _read_bytes,
    _span_corpus,
    nul_error,
)
from nerkit.data.tags import Span, spans_to_tags

# An entity: "[" + its text (no bracket, no line break) + "]" + its type.
ENTITY = re.compile(r"\[([^\[\]\n]+)\]([A-Za-z_]+(?:\.[A-Za-z_]+)*)")


def inline_line(text: str, spans: list[Span]) -> str:
    """`text` with each of `spans` (sorted, not overlapping) written in place as `[TEXT]TYPE`."""
    out, pos = [], 0
    for s in spans:
        out.append(text[pos:s.start])
        out.append(f"[{text[s.start:s.end]}]{s.type}")
        pos = s.end
    out.append(text[pos:])
    return "".join(out)


def parse_inline(line: str) -> tuple[str, list[Span]]:
    """One line of markup as its plain text and its entities, offsets into that text."""
    text, spans, pos = [], [], 0
    for match in ENTITY.finditer(line):
        text.append(line[pos:match.start()])
        start = sum(map(len, text))
        spans.append(Span(start, start + len(match.group(1)), match.group(2)))
        text.append(match.group(1))
        pos = match.end()
    text.append(line[pos:])
    return "".join(text), spans


def read_inline(path: str | Path, max_errors: int = 1, overlaps: Overlaps | None = None) -> Corpus:
    """A file of inline markup, one sentence a line (a `\\r\\n` ending is dropped, as `nerkit predict`
    drops it from its input); blank lines are skipped. Entities never overlap here, so `overlaps`
    is unused; it is taken as every reader of read_corpus takes it."""
    path, data = _read_bytes(path)
    problems = _Problems(path, max_errors)
    sentences = []
    for number, line in enumerate(_decode(path, data).split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        if "\x00" in line:
            problems.add(nul_error(f"{path}:{number}"), number)
            continue
        text, spans = parse_inline(line)
        sentences.append(Sentence(list(text), spans_to_tags(len(text), spans, "bioes"), number))
    problems.raise_any()
    return _span_corpus(path, sentences, "inline")
