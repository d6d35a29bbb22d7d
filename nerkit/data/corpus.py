"""Corpus reading, writing and checking: char-per-line CoNLL (BIO, BIOES, BMES), JSON-lines spans,
CLUENER's JSON and CBLUE's (nerkit.data.cblue), and through `read_corpus` and `write_corpus` the
annotation tools' files (nerkit.data.annotation: doccano, Label Studio) and inline markup (nerkit.data.inline).

The tag-scheme rules it checks with are nerkit.data.tags'; what every reader shares (Sentence,
Corpus, reading a file, its errors) is nerkit.data.records'. Spans are token offsets, end exclusive;
for char-per-line files a token is a character, so they are offsets into the sentence text.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

from nerkit.data import annotation, cblue
from nerkit.data.inline import read_inline
from nerkit.data.nesting import describe_pair, overlapping_pairs
from nerkit.data.records import (
    check_keys,
    check_unknown,
    Corpus,
    _decode,
    DOCUMENT_SEPARATOR,
    _json_record,
    nul_error,
    Overlaps,
    _Problems,
    _read_bytes,
    _read_records,
    record_entities,
    record_unknown,
    Sentence,
    _shown,
    span_sentence,
    SPANS,
    _text_of,
    UNKNOWN_KEY,
    unknown_regions,
    unknown_value,
)
from nerkit.data.tags import (
    _TAG_RE,
    SCHEMES,
    UNKNOWN_TAG,
    Span,
    convert_tags,
    detect_scheme,
    spread_tag,
    transition_problems,
)
from nerkit.errors import CorpusError
from nerkit.files import atomic_write_text, check_output

RECORD_KEYS = ("text", "entities", UNKNOWN_KEY)


# An entity's "text" and "score", as nerkit predict writes them, are optional (and a score is not read).
ENTITY_KEYS = ("start", "end", "type", "text", "score")


_JSONL_FORMAT = 'each line is {"text": "...", "entities": [{"start": 0, "end": 2, "type": "PER"}]}'
_UNKNOWN_FORMAT = ('"unknown" lists the regions nobody annotated as [start, end] pairs, end exclusive: '
                   '{"text": "...", "entities": [...], "unknown": [[5, 9]]}')


# CLUENER's release (and others that copied it): the mention's text, then where it occurs, end inclusive.
CLUENER_KEYS = ("id", "text", "label")


_CLUENER_FORMAT = 'each line is {"text": "...", "label": {"TYPE": {"MENTION": [[start, end_inclusive], ...]}}}'


# What read_corpus's `fmt` may say (auto: by extension); the annotation tools' are annotation.FORMATS.
FORMATS = ("auto", "conll", "jsonl", "cluener", "cblue", "inline", *annotation.FORMATS)


_SEPARATOR = re.compile(r"[ \t]+")  # only ASCII space and tab separate columns: U+3000 may be a token


# The one rule for the token of a character-per-line line, which every writer of one follows (`nerkit
# data convert`, `predict --format conll`, `eval --output`: `conll_line`) and `_columns` reads: any
# one character but a line break (`\n`, which ends the line) and NUL (a binary file's mark), the two
# that no line of text holds. A space, tab or `\r` is written as itself, first on its line (`  O`),
# and read back as the token, since no other line starts with a separator or ends with its token.
UNWRITABLE = re.compile(r"[\n\x00]")


def conll_line(token: str, *columns: str) -> str:
    """One token's line of a character-per-line file: the token, then its columns (the tag last),
    one space apart."""
    return " ".join((token, *columns)) + "\n"


def scheme_label(labels: str) -> str:
    """`Corpus.labels` as people read it: BIO, BIOES, BMES, or spans (JSON lines)."""
    return "spans (JSON lines)" if labels == SPANS else labels.upper()


# ---------------------------------------------------------------------------------------------
# Reading


REPAIR_OPTION = "pass --repair"  # how `nerkit eval` and `nerkit data convert` ask for `repair`


def read_corpus(path: str | Path, repair: bool = False, strict: bool = True, max_errors: int = 1,
                repair_option: str = REPAIR_OPTION, fmt: str = "auto", texts_only: bool = False,
                flat: str | None = None, limit: int = 0) -> Corpus:
    """Read a corpus, CoNLL or JSON-lines (by extension .jsonl/.json), or as `fmt` (one of FORMATS)
    says: CLUENER's JSON, inline markup (`[北京]LOC`) and the annotation tools' files (nerkit.data.annotation) are read only when
    asked for. With `strict`, an invalid tag transition is
    an error unless `repair` fixes it as conlleval reads it (and a token of several characters is
    an error unless `repair` splits it); without `strict` transitions are only counted (for
    `nerkit data stats`). The first error is raised at once; with
    `max_errors` above 1 reading goes on, and ManyErrors lists that many (the first by line) and
    counts them all (for `nerkit data validate`); a lone error is raised as itself.
    `repair_option`: how the command that reads the file asks for `repair`, for the error's fix.
    `texts_only`: only the texts are wanted (`nerkit data convert --to text`), so a JSON-lines or
    CLUENER record without its labels (CLUENER's unlabelled test.json) is a text without entities.
    Overlapping (nested) entities are kept (`Sentence.entities`), or with `flat` (outer, inner)
    projected flat (nerkit.data.nesting.project); `flat` None follows `repair`, which includes the
    outer projection (what --repair did before nesting was kept).
    `limit` above 0 (`data.limit`): a char-per-line file is read only up to its first `limit`
    sentences, which alone are checked and give the scheme and types (MSRA's 2.17M lines cost a
    second for 5,000 sentences); the other formats are read whole."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown corpus format {fmt!r}")
    overlaps = Overlaps(flat or ("outer" if repair else "none"))
    if fmt == "inline":
        return read_inline(path, max_errors=max_errors, overlaps=overlaps)
    if fmt == "auto" and cblue.looks_like(path):
        fmt = "cblue"
    if fmt == "cblue":
        return cblue.read_cblue(path, max_errors=max_errors, overlaps=overlaps, texts_only=texts_only)
    if fmt == "cluener":
        return read_cluener(path, max_errors=max_errors, overlaps=overlaps, texts_only=texts_only)
    if fmt in annotation.FORMATS:
        return annotation.READERS[fmt](path, max_errors=max_errors, overlaps=overlaps)
    if fmt == "jsonl" or (fmt == "auto" and is_jsonl(path)):
        return read_jsonl(path, max_errors=max_errors, overlaps=overlaps, texts_only=texts_only)
    return read_conll(path, repair=repair, strict=strict, max_errors=max_errors, repair_option=repair_option,
                      limit=limit)


# The suffixes of a file that is read as JSON lines without being told (a corpus, `nerkit predict`'s input).
JSON_LINES_SUFFIXES = (".jsonl", ".json")


def is_jsonl(path: str | Path) -> bool:
    return str(path).endswith(JSON_LINES_SUFFIXES)


def read_conll(path: str | Path, repair: bool = False, strict: bool = True, max_errors: int = 1,
               repair_option: str = REPAIR_OPTION, limit: int = 0) -> Corpus:
    """A char-per-line file; with `limit`, only its first `limit` sentences (read_corpus)."""
    path, data = _read_bytes(path)
    problems = _Problems(path, max_errors)
    sentences, columns = _conll_sentences(path, _decode(path, data), problems, repair, repair_option, limit)
    if not sentences:
        problems.raise_any()
        raise CorpusError("the file has no sentences (only blank lines)", where=str(path))
    if columns > 2 and all(t in (" ", "\t") for s in sentences for t in s.tokens):
        problems.add(CorpusError("every line starts with spaces or tabs: the lines look indented",
                                 where=f"{path}:{sentences[0].line}",
                                 fix="remove the indentation (a token line is `char TAG`)"), sentences[0].line)
    scheme = _file_scheme(path, sentences, problems)
    corpus = Corpus(str(path), sentences, scheme or "bio")
    if scheme and repair:
        corpus.split_tokens = _split_tokens(sentences, scheme)
    if scheme:
        _check_transitions(corpus, repair, strict, problems, repair_option)
    problems.raise_any()
    corpus.types = sorted({s.type for sent in sentences for s in sent.spans()})
    return corpus


def _conll_sentences(path: Path, text: str, problems: _Problems, repair: bool = False,
                     repair_option: str = REPAIR_OPTION, limit: int = 0) -> tuple[list[Sentence], int | None]:
    """The sentences of a CoNLL file and its column count. A sentence with a bad line is left out
    (after its error is sent to `problems`), so no transition error follows from the bad line.
    A token of several characters is such a line, unless `repair` is to split it (`_split_tokens`).
    A line whose token is DOCUMENT_SEPARATOR (CoNLL 2003's `-DOCSTART- -X- -X- O`, whatever its
    columns) ends the sentence before it and starts a new document (`Sentence.document`).
    With `limit`, reading stops at the end of the `limit`-th sentence: the lines after it are
    never looked at."""
    sentences: list[Sentence] = []
    tokens: list[str] = []
    tags: list[str] = []
    first_line, broken, columns, document = 0, False, None, 0
    lines = _lines(text) if limit else _all_lines(text)
    # A character corpus repeats few distinct lines (a character and its tag) millions of times: a
    # line read and checked once is a token line whose columns are known.
    known: dict[str, list[str]] = {}
    for number, raw in enumerate(lines, 1):
        parts = known.get(raw)
        if parts is not None and len(parts) == columns:
            if not tokens:
                first_line = number
            tokens.append(parts[0])
            tags.append(parts[-1])
            continue
        line = raw[:-1] if raw.endswith("\r") else raw
        separator = _SEPARATOR.split(line.strip(" \t"), 1)[0] == DOCUMENT_SEPARATOR
        if separator or not line.strip(" \t"):
            if tokens and not broken:
                sentences.append(_conll_sentence(tokens, tags, first_line, document))
                if len(sentences) == limit:
                    return sentences, columns
            tokens, tags, broken = [], [], False
            document += separator
            continue
        try:
            parts = _token_line(line, f"{path}:{number}", columns)
            if len(parts[0]) > 1 and not repair:
                raise _long_token(parts[0], f"{path}:{number}", repair_option)
        except CorpusError as e:
            problems.add(e, number)
            broken = True
            continue
        columns = columns or len(parts)
        known[raw] = parts
        if not tokens:
            first_line = number
        tokens.append(parts[0])
        tags.append(parts[-1])
    if tokens and not broken:
        sentences.append(_conll_sentence(tokens, tags, first_line, document))
    return sentences, columns


def _conll_sentence(tokens: list[str], tags: list[str], line: int, document: int) -> Sentence:
    """A sentence of a char-per-line file, its UNKNOWN_TAG positions its `unknown` regions and their
    tags O placeholders. Looked for once a sentence, not once a line: the line cache stays as fast."""
    if UNKNOWN_TAG not in tags:
        return Sentence(tokens, tags, line, document)
    known = [tag != UNKNOWN_TAG for tag in tags]
    return Sentence(tokens, [tag if k else "O" for tag, k in zip(tags, known)], line, document,
                    unknown=unknown_regions(known))


def _all_lines(text: str) -> list[str]:
    """The lines of a file's text, without the empty one after its last line break."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _lines(text: str, chunk: int = 1 << 18):
    """The lines of `_all_lines`, split a chunk of the text at a time, for a reader that may stop
    early: splitting a whole 14 MB file costs more than reading its first thousands of sentences."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + chunk)
        if end < 0:
            yield from _all_lines(text[start:])
            return
        yield from text[start:end].split("\n")
        start = end + 1


def _token_line(line: str, where: str, columns: int | None) -> list[str]:
    """The columns of one token line, checked: a token, maybe more columns (as many as the file's
    first token line has), and a tag last."""
    if "\x00" in line:
        raise nul_error(where)
    parts = _columns(line, where)
    if len(parts) < 2:
        raise CorpusError(f"expected 2 columns `char TAG`, found 1 ({_shown(line)})", where=where,
                          fix="add the tag after a space or tab (O outside entities)")
    if columns is not None and len(parts) != columns:
        raise CorpusError(
            f"expected {columns} columns as on the file's first token line, found {len(parts)} ({_shown(line)})",
            where=where, fix="use the same number of columns on every line",
        )
    tag = parts[-1]
    if tag != "O" and tag != UNKNOWN_TAG and not _TAG_RE.match(tag):
        hint = f"tags are case-sensitive: did you mean {tag.upper()}?" \
            if _TAG_RE.match(tag.upper()) or tag.upper() in ("O", UNKNOWN_TAG) \
            else f"use O or B-/I-/M-/E-/S- followed by a type, e.g. B-PER ({UNKNOWN_TAG} where nobody annotated)"
        raise CorpusError(f"unknown tag {_shown(tag)}", where=where, fix=hint)
    return parts


def _long_token(token: str, where: str, repair_option: str) -> CorpusError:
    # Offsets, vocabularies and language models count characters: a token of two would be read as
    # one position everywhere, and LAC's vocabulary cannot look it up at all.
    shown = _shown(token)
    count = "" if "characters)" in shown else f" ({len(token):,} characters)"  # a long one says it already
    return CorpusError(f"the token {shown} is longer than one character{count}; a char-per-line "
                       "file holds one character per line", where=where,
                       fix=f"put each character on its own line, or split the token into its characters, "
                           f"its tag spread over them: {repair_option}")


def _split_tokens(sentences: list[Sentence], scheme: str) -> int:
    """Repair's reading of a token of several characters: its characters, each a token, with its tag
    spread over them (nerkit.data.tags.spread_tag), so its entity keeps its extent. Returns how many
    tokens were split."""
    split = 0
    for sent in sentences:
        if all(len(token) == 1 for token in sent.tokens):
            continue
        tokens, tags, known = [], [], []
        for token, tag, k in zip(sent.tokens, sent.tags, sent.known()):
            split += len(token) > 1
            tokens.extend(token)
            tags.extend(spread_tag(tag, len(token), scheme))
            known.extend([k] * len(token))  # an unannotated token's characters are all unannotated
        sent.tokens, sent.tags = tokens, tags
        sent.unknown = unknown_regions(known) if sent.unknown else None
    return split


def _columns(line: str, where: str) -> list[str]:
    """The columns of a token line. A line that starts with a space or tab and then a separator
    holds that space or tab as its token, as `conll_line` writes one: `  O`."""
    if line[0] not in " \t":
        return _SEPARATOR.split(line.rstrip(" \t"))
    if line[1] not in " \t":
        raise CorpusError(f"empty token (the line starts with a separator: {_shown(line)})", where=where,
                          fix="each line is `char TAG`; remove the leading space or tab")
    return [line[0], *_SEPARATOR.split(line[1:].strip(" \t"))]


def _file_scheme(path: Path, sentences: list[Sentence], problems: _Problems) -> str | None:
    """The tag scheme of the file's sentences; None, after an error, when they mix I- and M-."""
    try:
        return detect_scheme({t for s in sentences for t in s.tags})
    except ValueError as e:
        # Point at the first tag of whichever kind (I- or M-) appears second: where the file breaks
        # the scheme it started in.
        line = max(next(s.line + i for s in sentences for i, t in enumerate(s.tags) if t.startswith(p))
                   for p in ("I-", "M-"))
        problems.add(CorpusError(str(e), where=f"{path}:{line}", fix="use one scheme per file (BIO, BIOES or BMES)"), line)
        return None


def _check_transitions(corpus: Corpus, repair: bool, strict: bool, problems: _Problems, repair_option: str) -> None:
    for sent in corpus.sentences:
        bad = list(transition_problems(sent.tags, corpus.scheme))
        if not bad:
            continue
        corpus.invalid_transitions += len(bad)
        if repair:
            fixed = convert_tags(sent.tags, corpus.scheme)
            corpus.repaired += sum(a != b for a, b in zip(fixed, sent.tags))
            sent.tags = fixed
        elif strict:
            known = sent.known()
            for i, why in bad:
                if not all(known[max(i - 1, 0):i + 1]):  # the tag or the one before it
                    why += f" ({UNKNOWN_TAG}, not annotated, reads as O)"
                line = sent.line + min(i, len(sent.tags) - 1)
                problems.add(CorpusError(f"invalid transition: {why}", where=f"{corpus.path}:{line}",
                                         fix=f"fix the tag, or read it as conlleval does: {repair_option}"), line)




def read_jsonl(path: str | Path, max_errors: int = 1, overlaps: Overlaps | None = None,
               texts_only: bool = False) -> Corpus:
    """nerkit's JSON lines; `texts_only`: a record without "entities" is a text without any."""
    return _read_records(path, max_errors, lambda *line: _parse_record(*line, texts_only=texts_only), "jsonl", overlaps)


def read_cluener(path: str | Path, max_errors: int = 1, overlaps: Overlaps | None = None,
                 texts_only: bool = False) -> Corpus:
    """CLUENER's JSON, one record a line: {"text", "label": {TYPE: {MENTION: [[start, end], ...]}}}
    with `end` inclusive; each mention must be the text at its places. An "id" key is allowed.
    `texts_only`: a record without "label" is a text without entities."""
    return _read_records(path, max_errors, lambda *line: _parse_cluener(*line, texts_only=texts_only), "cluener",
                         overlaps)


def _record_text(line: str, where: str, known: tuple[str, ...], fmt: str) -> tuple[dict, str]:
    """A record's JSON object, its keys checked against `known`, and its "text"."""
    record = _json_record(line, where, fmt)
    check_keys(record, known, "", where, fmt)
    return record, _text_of(record, where, fmt)


def _parse_cluener(line: str, number: int, where: str, overlaps: Overlaps, texts_only: bool = False) -> Sentence:
    record, text = _record_text(line, where, CLUENER_KEYS, _CLUENER_FORMAT)
    if "label" not in record and not texts_only:
        raise CorpusError('the record has no "label" key', where=where,
                          fix='write "label": {} for a text without entities (CLUENER\'s test.json has no labels: '
                              'it is text to tag, `nerkit predict test.json`, or to write out with --to text)')
    label = record.get("label", {})
    if not isinstance(label, dict):
        raise CorpusError(f'"label" is {type(label).__name__}, not an object', where=where, fix=_CLUENER_FORMAT)
    spans = set()
    for typ, mentions in label.items():
        if not re.fullmatch(r"\S+", typ) or not isinstance(mentions, dict):
            raise CorpusError(f"the entity type {typ!r} needs an object of mentions and no spaces in its name",
                              where=where, fix=_CLUENER_FORMAT)
        for mention, places in mentions.items():
            if not (isinstance(places, list) and all(
                    isinstance(p, list) and len(p) == 2 and all(type(x) is int for x in p) for p in places)):
                raise CorpusError(f"the places of {typ} {_shown(mention)} are not a list of [start, end] integer pairs",
                                  where=where, fix=_CLUENER_FORMAT)
            for start, end in places:
                if not 0 <= start <= end < len(text):
                    raise CorpusError(f"{typ} {_shown(mention)} at [{start}, {end}] is outside the text of "
                                      f"{len(text)} characters", where=where,
                                      fix="offsets count characters, from 0, end inclusive")
                if text[start:end + 1] != mention:
                    raise CorpusError(f"{typ} {_shown(mention)} is not the text at [{start}, {end}] "
                                      f"({_shown(text[start:end + 1])})", where=where,
                                      fix="offsets count characters, from 0, end inclusive")
                spans.add(Span(start, end + 1, typ))  # a place listed twice is one entity
    spans = sorted(spans, key=lambda s: (s.start, s.end, s.type))
    return span_sentence(text, overlaps.check(spans), number)


def _parse_record(line: str, number: int, where: str, overlaps: Overlaps, texts_only: bool = False) -> Sentence:
    """A record of nerkit's JSON lines. Keys besides "text", "entities" and "unknown" (the regions
    nobody annotated: records.UNKNOWN_KEY) are kept (`Sentence.extra`); a misspelt "text" or
    "entities" is caught as that key missing, its error naming the record's key that looks like it."""
    record = _json_record(line, where, _JSONL_FORMAT)
    if not isinstance(record.get("text"), str):
        raise CorpusError('the record has no "text" string', where=where, fix=_missing_fix(record, "text"))
    entities = record_entities(record, where, texts_only, lambda: _missing_fix(record, "entities"))
    text = record["text"]
    spans = sorted((_parse_entity(ent, text, where) for ent in entities), key=lambda s: (s.start, s.end))
    unknown = record_unknown(record[UNKNOWN_KEY], len(text), where, _UNKNOWN_FORMAT) if UNKNOWN_KEY in record else None
    check_unknown(spans, unknown, text, where)
    extra = {key: value for key, value in record.items() if key not in RECORD_KEYS}
    return span_sentence(text, overlaps.check(spans), number, extra or None, unknown)


def _missing_fix(record: dict, key: str) -> str:
    """The fix of a JSON-lines record without `key` ("text" or "entities"): another format's keys
    name that format; a key that looks like `key` misspelt names it; else what a record looks like."""
    if key == "entities" and isinstance(record.get("label", record.get("labels")), list):
        return f"this looks like doccano's format: {annotation.CONVERT_HINT.format(fmt='doccano')}"
    if key == "entities" and "label" in record:
        return "this looks like CLUENER's format: convert it with `nerkit data convert IN OUT --from cluener --to jsonl`"
    close = difflib.get_close_matches(key, [k for k in record if k not in RECORD_KEYS], n=1, cutoff=0.7)
    if close:
        return f"rename {close[0]!r} to {key!r} (a record's other keys are kept as they are)"
    if key == "entities":
        return ('write "entities": [] for a text without entities (texts to tag need none: '
                '`nerkit predict FILE.jsonl` reads them)')
    return _JSONL_FORMAT


def _parse_entity(ent, text: str, where: str) -> Span:
    if isinstance(ent, dict):
        check_keys(ent, ENTITY_KEYS, " in an entity", where, _JSONL_FORMAT)
    # Exactly ints (not 1.5, "1" or true) and a type that can become a tag (`B-TYPE`).
    if not (isinstance(ent, dict) and all(type(ent.get(k)) is int for k in ("start", "end"))
            and isinstance(ent.get("type"), str) and re.fullmatch(r"\S+", ent["type"])):
        raise CorpusError(f"entity {_shown(json.dumps(ent, ensure_ascii=False))} needs integer start, end "
                          "and a type without spaces", where=where)
    span = Span(ent["start"], ent["end"], ent["type"])
    if not 0 <= span.start < span.end <= len(text):
        raise CorpusError(f"entity {ent!r} is outside the text of {len(text)} characters",
                          where=where, fix="offsets count characters, end exclusive")
    if "text" in ent and ent["text"] != text[span.start:span.end]:
        raise CorpusError(f"the entity's text {ent['text']!r} is not the text at {span.start}:{span.end} "
                          f"({text[span.start:span.end]!r})", where=where, fix="offsets count characters, end exclusive")
    return span


# ---------------------------------------------------------------------------------------------
# Writing


def _separators(sentences: list[Sentence]):
    """Each sentence, and whether a document separator goes before it: where its document differs
    from the one before (a file read without separators gets none)."""
    previous = 0
    for sent in sentences:
        yield sent, sent.document != previous
        previous = sent.document


def format_conll(sentences: list[Sentence], scheme: str) -> str:
    out = []
    for sent, separated in _separators(sentences):
        if separated:
            out.append(f"{DOCUMENT_SEPARATOR} O\n\n")
        tags = convert_tags(sent.tags, scheme)
        if sent.unknown:  # its O placeholders back to the tag of a character nobody annotated
            tags = [tag if k else UNKNOWN_TAG for tag, k in zip(tags, sent.known())]
        out.extend(conll_line(tok, tag) for tok, tag in zip(sent.tokens, tags))
        out.append("\n")
    return "".join(out)


def format_jsonl(sentences: list[Sentence]) -> str:
    lines = []
    for sent, separated in _separators(sentences):
        if separated:
            lines.append(json.dumps({"text": DOCUMENT_SEPARATOR, "entities": []}) + "\n")
        ents = [s.to_dict() for s in sent.spans()]
        record = {**(sent.extra or {}), "text": sent.text, "entities": ents}  # other keys first, as predict writes them
        if sent.partial:
            record[UNKNOWN_KEY] = unknown_value(sent)
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    return "".join(lines)


# What write_corpus's `to` may say: a tag scheme (CoNLL), jsonl, text, or an annotation tool's format.
TARGETS = (*SCHEMES, "jsonl", "text", *annotation.FORMATS)


def write_corpus(path: str | Path, sentences: list[Sentence], to: str, source: str | Path | None = None,
                 source_format: str = "auto") -> None:
    """Write `sentences` as `to` in bio|bioes|bmes (CoNLL), jsonl, text (the sentences alone, one a
    line), or an annotation tool's format (annotation.FORMATS), atomically. `source`, the file they were read from (as `source_format`,
    read_corpus's `fmt`), is never written over, and a token that cannot be written is named with
    its line there."""
    check_output(path, *([source] if source is not None else []))  # not a directory, not the input
    if to not in TARGETS:
        raise CorpusError(f"unknown output format {to!r}", fix=f"use {', '.join(TARGETS)}")
    if to == "text":  # one sentence a line, no labels: what `nerkit predict` and `nerkit lm adapt --text` read
        found = _first_token(sentences, lambda t: "\x00" in t or "".join(t.splitlines()) != t)
        if found:
            raise CorpusError(f"the token {found[2]!r} breaks the line: a text file has one sentence a line",
                              where=_token_where(path, source, source_format, *found[:2]),
                              fix="remove or replace it in the input, or write jsonl")
        atomic_write_text(path, "".join(s.text + "\n" for s in sentences))
        return
    if to in SCHEMES:
        refuse_nested(sentences, source or path, source_format,
                      f"a character-per-line file ({to.upper()}) holds one entity per character",
                      "write a flat projection: --flat outer (the longest entity of each overlap) or --flat inner "
                      "(the shortest); or keep the nesting in jsonl, doccano or label-studio")
        found = _first_token(sentences, lambda t: not t or UNWRITABLE.search(t))
        if found:
            raise CorpusError(
                f"the token {found[2]!r} cannot be written one character per line: a line break ends the line "
                "and NUL marks a binary file",
                where=_token_where(path, source, source_format, *found[:2]),
                fix="remove or replace them in the input, or write jsonl",
            )
    # Every format counts characters (the others by offsets), and the readers refuse longer tokens.
    found = _first_token(sentences, lambda t: len(t) != 1)
    if found:
        raise CorpusError(f"the token {found[2]!r} is longer than one character, but offsets and char-per-line "
                          "files count characters", where=_token_where(path, source, source_format, *found[:2]),
                          fix="split it into its characters")
    if to in annotation.FORMATS:
        atomic_write_text(path, annotation.WRITERS[to](sentences))
    else:
        atomic_write_text(path, format_jsonl(sentences) if to == "jsonl" else format_conll(sentences, to))


def refuse_nested(sentences: list[Sentence], path: str | Path, fmt: str, what: str, fix: str) -> None:
    """A CorpusError at the first nested sentence of `sentences` (read from `path` as `fmt`) when
    any is; `what` says what needs one entity per character. Every place that cannot hold nesting refuses here."""
    first = next((s for s in sentences if s.nested), None)
    if first is None:
        return
    count = sum(s.nested for s in sentences)
    a, b = overlapping_pairs(first.entities)[0]
    raise CorpusError(f"{what}, but the entities of {count:,} sentence"
                      f"{'s' if count != 1 else ''} overlap (the first: {describe_pair(a, b, first.text)})",
                      where=sentence_where(path, fmt, first), fix=fix)


def refuse_partial(corpus: Corpus | list[Sentence], path: str | Path | None = None, role: str = "gold",
                   fmt: str = "auto") -> None:
    """A CorpusError at the first unknown character of the first partial sentence (`Sentence.unknown`)
    when any sentence is: a score counts every gold entity, and where nobody annotated, an entity
    the model finds would count as wrong. `corpus`: a Corpus (its path and format are used) or
    sentences read from `path` as `fmt` (read_corpus's); `role` names the file in the message
    ("gold", "dev set", "test set"). Every reading of a file to score on refuses here."""
    if isinstance(corpus, Corpus):
        sentences, path, fmt = corpus.sentences, path or corpus.path, corpus.format
    else:
        sentences = corpus
    first = next((s for s in sentences if s.partial), None)
    if first is None:
        return
    count = sum(s.partial for s in sentences)
    per_token = fmt == "conll" or (fmt == "auto" and not is_jsonl(path))
    where = f"{path}:{first.line + first.unknown[0][0]}" if per_token and first.line else sentence_where(path, fmt, first)
    raise CorpusError(f'the {role} has unknown regions ({UNKNOWN_TAG} tags / "{UNKNOWN_KEY}") in {count:,} of '
                      f"{len(sentences):,} sentences: a score needs complete annotation", where=where,
                      fix="score on a completely annotated file: annotate those regions, or leave their sentences out")


def sentence_where(path: str | Path, fmt: str, sent: Sentence) -> str:
    """Where a sentence of offsets is in the file it was read from: its line, or its task or record
    in a JSON array (Label Studio's, CBLUE's)."""
    if fmt == "label-studio":
        return annotation.task_where(path, sent.line - 1)
    if fmt == "cblue":
        return cblue.record_where(path, sent.line - 1)
    return f"{path}:{sent.line}"


def _first_token(sentences: list[Sentence], bad) -> tuple[Sentence, int, str] | None:
    """The first (sentence, index, token) whose token is `bad`, or None."""
    return next(((s, i, t) for s in sentences for i, t in enumerate(s.tokens) if bad(t)), None)


def _token_where(path: str | Path, source: str | Path | None, source_format: str, sent: Sentence, index: int) -> str:
    """Where a token came from: its line in `source` (a CoNLL file has a line per token, JSON lines,
    CLUENER's JSON, inline markup and doccano's one per sentence), or its task in a Label Studio export; the output
    `path` when that is unknown."""
    if source is None or not sent.line:
        return str(path)
    if source_format in ("label-studio", "cblue"):
        return sentence_where(source, source_format, sent)
    per_sentence = source_format in ("jsonl", "cluener", "inline", "doccano") or (source_format == "auto" and is_jsonl(source))
    return f"{source}:{sent.line if per_sentence else sent.line + index}"
