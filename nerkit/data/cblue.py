"""CBLUE's CMeEE JSON: one JSON array of records `{"text", "entities": [{"start_idx", "end_idx", "type",
"entity"}]}`, character offsets with the end INCLUSIVE and `entity` the text at them. Entities may
nest and a span may carry two types (CMeEE's do), so they are read as nested as they are
(`nerkit data convert --from cblue`, or found by `--from auto` in a .json file that is an array of
such records)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from nerkit.data.records import (
    check_keys,
    Corpus,
    _decode,
    Overlaps,
    _Problems,
    _read_bytes,
    record_entities,
    _shown,
    _span_corpus,
    span_sentence,
)
from nerkit.data.tags import Span
from nerkit.errors import CorpusError

RECORD_KEYS = ("text", "entities")
ENTITY_KEYS = ("start_idx", "end_idx", "type", "entity")

CBLUE_FORMAT = ('a JSON array of {"text": "...", "entities": [{"start_idx": 0, "end_idx": 1, "type": "dis", '
                '"entity": "..."}]}, end_idx inclusive')
_OFFSETS = "offsets count characters from 0, end_idx inclusive"

_PEEK = 1 << 16  # bytes looked at to tell a CBLUE file from JSON lines


def looks_like(path: str | Path) -> bool:
    """Whether a .json file is CBLUE's: it opens a JSON array and its first record's entities
    have `start_idx` (a file that is no regular file is left to the readers' errors)."""
    path = Path(path)
    if path.suffix != ".json" or not path.is_file():
        return False
    with open(path, "rb") as f:
        head = f.read(_PEEK)
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"[") and re.search(rb'"start_idx"\s*:', head) is not None


def record_where(path: str | Path, index: int) -> str:
    """Where a record is: its index in the array, from 0, as `jq '.[N]'` counts."""
    return f"{path}: record {index}"


def read_cblue(path: str | Path, max_errors: int = 1, overlaps: Overlaps | None = None,
               texts_only: bool = False) -> Corpus:
    """CBLUE's JSON (see the module); `texts_only`: a record without "entities" (CBLUE's unlabelled
    test split) is a text without entities."""
    overlaps = overlaps or Overlaps()
    path, data = _read_bytes(path)
    try:
        records = json.loads(_decode(path, data))
    except json.JSONDecodeError as e:
        raise CorpusError(f"not valid JSON ({e.msg} at column {e.colno})", where=f"{path}:{e.lineno}",
                          fix=CBLUE_FORMAT) from None
    if not isinstance(records, list):
        raise CorpusError(f"the file holds a JSON {type(records).__name__}, not an array of records", where=str(path),
                          fix=CBLUE_FORMAT)
    problems, sentences = _Problems(path, max_errors), []
    for index, record in enumerate(records):
        try:
            spans, text = _parse(record, record_where(path, index), texts_only)
        except CorpusError as e:
            problems.add(e, index)
            continue
        sentences.append(span_sentence(text, overlaps.check(spans), index + 1))
    problems.raise_any()
    return overlaps.noted(_span_corpus(path, sentences, "cblue"))


def _parse(record, where: str, texts_only: bool) -> tuple[list[Span], str]:
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise CorpusError('the record has no "text" string', where=where, fix=CBLUE_FORMAT)
    check_keys(record, RECORD_KEYS, "", where, CBLUE_FORMAT)
    text = record["text"]
    entities = record_entities(record, where, texts_only, 'write "entities": [] for a text without entities '
                               '(CBLUE\'s test split has none: write its texts with --to text)', CBLUE_FORMAT)
    spans = {_entity(entity, text, where) for entity in entities}  # an entity listed twice is one
    return sorted(spans, key=lambda s: (s.start, s.end, s.type)), text


def _entity(entity, text: str, where: str) -> Span:
    if isinstance(entity, dict):
        check_keys(entity, ENTITY_KEYS, " in an entity", where, CBLUE_FORMAT)
    if not (isinstance(entity, dict) and all(type(entity.get(k)) is int for k in ("start_idx", "end_idx"))
            and isinstance(entity.get("type"), str) and re.fullmatch(r"\S+", entity["type"])
            and isinstance(entity.get("entity"), str)):
        raise CorpusError(f"entity {_shown(json.dumps(entity, ensure_ascii=False))} needs integer start_idx, end_idx, "
                          "a type without spaces and the entity's text", where=where, fix=CBLUE_FORMAT)
    start, end, typ = entity["start_idx"], entity["end_idx"], entity["type"]
    if not 0 <= start <= end < len(text):
        raise CorpusError(f"{typ} {_shown(entity['entity'])} at [{start}, {end}] is outside the text of "
                          f"{len(text)} characters", where=where, fix=_OFFSETS)
    if text[start:end + 1] != entity["entity"]:
        raise CorpusError(f"{typ} {_shown(entity['entity'])} is not the text at [{start}, {end}] "
                          f"({_shown(text[start:end + 1])})", where=where, fix=_OFFSETS)
    return Span(start, end + 1, typ)

