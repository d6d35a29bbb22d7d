"""Corpus reading, writing and checking: char-per-line CoNLL (BIO, BIOES, BMES) and JSON-lines spans.

The tag-scheme rules it checks with are nerkit.data.tags'. Spans are token offsets, end exclusive;
for char-per-line files a token is a character, so they are offsets into the sentence text.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from nerkit.data.tags import (
    _TAG_RE,
    SCHEMES,
    Span,
    convert_tags,
    detect_scheme,
    spans_to_tags,
    spread_tag,
    tags_to_spans,
    transition_problems,
)
from nerkit.errors import CorpusError, ManyErrors, did_you_mean
from nerkit.files import atomic_write_text, same_file

SPANS = "spans"  # what JSON-lines files have instead of a tag scheme


RECORD_KEYS = ("text", "entities")


ENTITY_KEYS = ("start", "end", "type", "text")  # an entity's "text", as nerkit predict writes it, is optional


_JSONL_FORMAT = 'each line is {"text": "...", "entities": [{"start": 0, "end": 2, "type": "PER"}]}'


# CLUENER's release (and others that copied it): the mention's text, then where it occurs, end inclusive.
CLUENER_KEYS = ("id", "text", "label")


_CLUENER_FORMAT = 'each line is {"text": "...", "label": {"TYPE": {"MENTION": [[start, end_inclusive], ...]}}}'


FORMATS = ("auto", "conll", "jsonl", "cluener")  # what read_corpus's `fmt` may say; auto: by extension


_SEPARATOR = re.compile(r"[ \t]+")  # only ASCII space and tab separate columns: U+3000 may be a token


# Characters `write_corpus` keeps out of CoNLL tokens: the reader takes a lone space or tab token
# (`  O`, as `nerkit predict --format conll` writes it), but other tools would read such a line wrong.
_UNWRITABLE = re.compile(r"[ \t\r\n\x00]")


@dataclass
class Sentence:
    tokens: list[str]
    tags: list[str] | None = None
    line: int = 0  # 1-based line of the first token in its file (0 when not from a file)

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    def spans(self) -> list[Span]:
        return tags_to_spans(self.tags or [])

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class Corpus:
    path: str
    sentences: list[Sentence]
    scheme: str
    invalid_transitions: int = 0  # found while reading (each one fixed when repair=True)
    repaired: int = 0  # tags changed by repair
    split_tokens: int = 0  # tokens of several characters that repair split into their characters
    types: list[str] = field(default_factory=list)
    format: str = "conll"  # or "jsonl", "cluener"

    @property
    def labels(self) -> str:
        """How the file marks entities: its tag scheme, or SPANS for JSON lines and CLUENER's JSON
        (whose BIOES tags exist only inside nerkit)."""
        return self.scheme if self.format == "conll" else SPANS


def scheme_label(labels: str) -> str:
    """`Corpus.labels` as people read it: BIO, BIOES, BMES, or spans (JSON lines)."""
    return "spans (JSON lines)" if labels == SPANS else labels.upper()


# ---------------------------------------------------------------------------------------------
# Reading


def decode_utf8(data: bytes, name: str, line: int = 1, offset: int = 0) -> str:
    """`data` as text; bytes that are not UTF-8 are a CorpusError naming the line and byte offset.
    `data` may be a piece of the file `name` that starts on `line`, at byte `offset`. Every reader
    of text (corpora, `nerkit predict`) decodes here, so all say the same thing."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line += data[: e.start].count(b"\n")
        raise CorpusError(
            f"bytes at offset {offset + e.start} are not UTF-8 ({data[e.start:e.start + 4]!r})",
            where=f"{name}:{line}",
            fix="convert the file to UTF-8, e.g. `iconv -f GBK -t UTF-8 IN > OUT`",
        ) from None


def nul_error(where: str) -> CorpusError:
    """A NUL byte in a line of text: the file is binary, or UTF-16 read as UTF-8."""
    return CorpusError("the line contains a NUL byte", where=where,
                       fix="the file is probably binary or UTF-16; convert it to UTF-8 text")


def _decode(path: Path, data: bytes) -> str:
    text = decode_utf8(data, str(path))
    return text[1:] if text.startswith("\ufeff") else text  # a BOM is accepted and dropped


def _shown(text: str, limit: int = 80) -> str:
    """`text` quoted for an error message, cut short: a malformed line may be megabytes long."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text):,} characters)"


def _read_bytes(path: str | Path) -> tuple[Path, bytes]:
    path = Path(path)
    if not path.exists():
        raise CorpusError("no such file", where=str(path), fix="check the path (and NERKIT_DATA)")
    if path.is_dir():
        raise CorpusError("is a directory, not a corpus file", where=str(path))
    if path.is_char_device() or path.is_block_device() or path.is_socket():
        # /dev/zero and the like never end: reading one would fill memory. A pipe (FIFO) is allowed.
        raise CorpusError("is a device, not a corpus file", where=str(path), fix="point to a regular file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CorpusError(f"cannot read the file ({e.strerror})", where=str(path)) from None
    if not data.strip():
        raise CorpusError("the file is empty", where=str(path), fix="point to a corpus with sentences")
    return path, data


REPAIR_OPTION = "pass --repair"  # how `nerkit eval` and `nerkit data convert` ask for `repair`


def read_corpus(path: str | Path, repair: bool = False, strict: bool = True, max_errors: int = 1,
                repair_option: str = REPAIR_OPTION, fmt: str = "auto") -> Corpus:
    """Read a corpus, CoNLL or JSON-lines (by extension .jsonl/.json), or as `fmt` says (FORMATS:
    CLUENER's JSON only so). With `strict`, an invalid
    tag transition is an error unless `repair` fixes it as conlleval reads it; without `strict`
    they are only counted (for `nerkit data stats`). The first error is raised at once; with
    `max_errors` above 1 reading goes on, and ManyErrors lists that many (the first by line) and
    counts them all (for `nerkit data validate`); a lone error is raised as itself.
    `repair_option`: how the command that reads the file asks for `repair`, for the error's fix."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown corpus format {fmt!r}")
    if fmt == "cluener":
        return read_cluener(path, max_errors=max_errors)
    if fmt == "jsonl" or (fmt == "auto" and _is_jsonl(path)):
        return read_jsonl(path, max_errors=max_errors)
    return read_conll(path, repair=repair, strict=strict, max_errors=max_errors, repair_option=repair_option)


def _is_jsonl(path: str | Path) -> bool:
    return str(path).endswith((".jsonl", ".json"))


class _Problems:
    """Where a reader sends the errors it finds. With `limit` 1 the first is raised at once (train
    and eval stop there); above, the reader goes on past each bad line or record, and the `limit`
    errors with the lowest line numbers are kept while all are counted."""

    def __init__(self, path: Path, limit: int):
        self.path, self.limit = path, limit
        self.kept: list[tuple[int, CorpusError]] = []
        self.total = 0

    def add(self, error: CorpusError, line: int) -> None:
        if self.limit <= 1:
            raise error
        self.total += 1
        bisect.insort(self.kept, (line, error), key=lambda kept: kept[0])
        del self.kept[self.limit:]

    def raise_any(self) -> None:
        if self.total == 1:
            raise self.kept[0][1]
        if self.total:
            raise ManyErrors([error for _, error in self.kept], self.total, where=str(self.path))


def read_conll(path: str | Path, repair: bool = False, strict: bool = True, max_errors: int = 1,
               repair_option: str = REPAIR_OPTION) -> Corpus:
    path, data = _read_bytes(path)
    problems = _Problems(path, max_errors)
    sentences, columns = _conll_sentences(path, _decode(path, data), problems, repair, repair_option)
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
                     repair_option: str = REPAIR_OPTION) -> tuple[list[Sentence], int | None]:
    """The sentences of a CoNLL file and its column count. A sentence with a bad line is left out
    (after its error is sent to `problems`), so no transition error follows from the bad line.
    A token of several characters is such a line, unless `repair` is to split it (`_split_tokens`)."""
    sentences: list[Sentence] = []
    tokens: list[str] = []
    tags: list[str] = []
    first_line, broken, columns = 0, False, None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, raw in enumerate(lines, 1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line.strip(" \t"):
            if tokens and not broken:
                sentences.append(Sentence(tokens, tags, first_line))
            tokens, tags, broken = [], [], False
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
        if not tokens:
            first_line = number
        tokens.append(parts[0])
        tags.append(parts[-1])
    if tokens and not broken:
        sentences.append(Sentence(tokens, tags, first_line))
    return sentences, columns


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
    if tag != "O" and not _TAG_RE.match(tag):
        hint = f"tags are case-sensitive: did you mean {tag.upper()}?" if _TAG_RE.match(tag.upper()) or tag.upper() == "O" \
            else "use O or B-/I-/M-/E-/S- followed by a type, e.g. B-PER"
        raise CorpusError(f"unknown tag {_shown(tag)}", where=where, fix=hint)
    return parts


def _long_token(token: str, where: str, repair_option: str) -> CorpusError:
    # Offsets, vocabularies and language models count characters: a token of two would be read as
    # one position everywhere, and LAC's vocabulary cannot look it up at all.
    return CorpusError(f"the token {_shown(token)} is longer than one character ({len(token)} characters); a char-per-line "
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
        tokens, tags = [], []
        for token, tag in zip(sent.tokens, sent.tags):
            split += len(token) > 1
            tokens.extend(token)
            tags.extend(spread_tag(tag, len(token), scheme))
        sent.tokens, sent.tags = tokens, tags
    return split


def _columns(line: str, where: str) -> list[str]:
    """The columns of a token line. A line that starts with a space or tab and then a separator
    holds that space or tab as its token: `nerkit predict --format conll` writes one as `  O`."""
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
            for i, why in bad:
                line = sent.line + min(i, len(sent.tags) - 1)
                problems.add(CorpusError(f"invalid transition: {why}", where=f"{corpus.path}:{line}",
                                         fix=f"fix the tag, or read it as conlleval does: {repair_option}"), line)




def read_jsonl(path: str | Path, max_errors: int = 1) -> Corpus:
    return _read_records(path, max_errors, _parse_record, "jsonl")


def read_cluener(path: str | Path, max_errors: int = 1) -> Corpus:
    """CLUENER's JSON, one record a line: {"text", "label": {TYPE: {MENTION: [[start, end], ...]}}}
    with `end` inclusive; each mention must be the text at its places. An "id" key is allowed."""
    return _read_records(path, max_errors, _parse_cluener, "cluener")


def _read_records(path: str | Path, max_errors: int, parse, fmt: str) -> Corpus:
    """A file of one JSON record a line, each read by `parse(line, number, where)` into a Sentence."""
    path, data = _read_bytes(path)
    problems = _Problems(path, max_errors)
    sentences = []
    for number, line in enumerate(_decode(path, data).split("\n"), 1):
        if not line.strip():
            continue
        try:
            sentences.append(parse(line, number, f"{path}:{number}"))
        except CorpusError as e:
            problems.add(e, number)
    problems.raise_any()
    if not sentences:
        raise CorpusError("the file has no sentences", where=str(path))
    corpus = Corpus(str(path), sentences, "bioes", format=fmt)
    corpus.types = sorted({s.type for sent in sentences for s in sent.spans()})
    return corpus


def _record_text(line: str, where: str, known: tuple[str, ...], fmt: str) -> tuple[dict, str]:
    """A record's JSON object, its keys checked, and its "text"."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise CorpusError(f"not valid JSON ({e.msg} at column {e.colno})", where=where, fix=fmt) from None
    if not isinstance(record, dict):
        raise CorpusError('the record has no "text" string', where=where, fix=fmt)
    _check_keys(record, known, "", where, fmt)
    text = record.get("text")
    if not isinstance(text, str):
        raise CorpusError('the record has no "text" string', where=where, fix=fmt)
    return record, text


def _check_flat(spans: list[Span], text: str, where: str, shown, key: str) -> None:
    """Refuse overlapping or nested entities in `spans` (sorted); `shown(span)` names one as its
    format writes it, `key` is where the format lists them."""
    for a, b in zip(spans, spans[1:]):
        if b.start < a.end:
            raise CorpusError(f"the entities {a.type} {text[a.start:a.end]!r} at {shown(a)} and {b.type} "
                              f"{text[b.start:b.end]!r} at {shown(b)} overlap", where=where,
                              fix=f"flat NER gives a character one entity at most: keep one of the two and delete "
                                  f"the other from {key}")


def _parse_cluener(line: str, number: int, where: str) -> Sentence:
    record, text = _record_text(line, where, CLUENER_KEYS, _CLUENER_FORMAT)
    if "label" not in record:
        raise CorpusError('the record has no "label" key', where=where,
                          fix='write "label": {} for a text without entities (CLUENER\'s test.json has no labels: '
                              'it is text to tag with `nerkit predict`, not a corpus)')
    label = record["label"]
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
    _check_flat(spans, text, where, lambda s: f"[{s.start}, {s.end - 1}]", '"label"')
    return Sentence(list(text), spans_to_tags(len(text), spans, "bioes"), number)


def _parse_record(line: str, number: int, where: str) -> Sentence:
    record, text = _record_text(line, where, RECORD_KEYS, _JSONL_FORMAT)
    if "entities" not in record:
        raise CorpusError('the record has no "entities" key', where=where,
                          fix='write "entities": [] for a text without entities (nerkit predict reads '
                              'unlabelled text as plain lines)')
    entities = record["entities"]
    if not isinstance(entities, list):
        raise CorpusError(f'"entities" is {type(entities).__name__}, not a list', where=where)
    spans = sorted((_parse_entity(ent, text, where) for ent in entities), key=lambda s: (s.start, s.end))
    _check_flat(spans, text, where, lambda s: f"{s.start}:{s.end}", '"entities"')
    return Sentence(list(text), spans_to_tags(len(text), spans, "bioes"), number)


def _parse_entity(ent, text: str, where: str) -> Span:
    if isinstance(ent, dict):
        _check_keys(ent, ENTITY_KEYS, " in an entity", where)
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


def _check_keys(obj: dict, known: tuple[str, ...], what: str, where: str, fmt: str = _JSONL_FORMAT) -> None:
    """An unknown key is an error, not ignored: a misspelt `entities` would lose every entity."""
    for key in obj:
        if key not in known:
            if key == "label" and known == RECORD_KEYS:
                fix = "this looks like CLUENER's format: convert it with `nerkit data convert IN OUT --from cluener --to jsonl`"
            else:
                fix = did_you_mean(key, known) or fmt
            raise CorpusError(f"unknown key {key!r}{what}; the keys are {', '.join(map(repr, known))}", where=where,
                              fix=fix)


# ---------------------------------------------------------------------------------------------
# Writing


def format_conll(sentences: list[Sentence], scheme: str) -> str:
    out = []
    for sent in sentences:
        tags = convert_tags(sent.tags, scheme)
        out.extend(f"{tok} {tag}\n" for tok, tag in zip(sent.tokens, tags))
        out.append("\n")
    return "".join(out)


def format_jsonl(sentences: list[Sentence]) -> str:
    lines = []
    for sent in sentences:
        ents = [s.to_dict() for s in sent.spans()]
        lines.append(json.dumps({"text": sent.text, "entities": ents}, ensure_ascii=False) + "\n")
    return "".join(lines)


def write_corpus(path: str | Path, sentences: list[Sentence], to: str, source: str | Path | None = None,
                 source_format: str = "auto") -> None:
    """Write `sentences` as `to` in bio|bioes|bmes (CoNLL) or jsonl, atomically. `source`, the file
    they were read from (as `source_format`, read_corpus's `fmt`), is never written over, and a
    token that cannot be written is named with its line there."""
    if source is not None and same_file(source, path):
        raise CorpusError("is the input file: the output would replace it", where=str(path), fix="write to another file")
    if to not in (*SCHEMES, "jsonl"):
        raise CorpusError(f"unknown output format {to!r}", fix="use bio, bioes, bmes or jsonl")
    if to in SCHEMES:
        found = _first_token(sentences, lambda t: not t or _UNWRITABLE.search(t))
        if found:
            raise CorpusError(
                f"the token {found[2]!r} cannot be written one character per line: spaces, tabs and line breaks "
                "separate columns and sentences, and NUL marks a binary file",
                where=_token_where(path, source, source_format, *found[:2]),
                fix="remove or replace them in the input (U+3000 is fine), or write jsonl",
            )
    # Both formats count characters (JSON lines by offsets), and the reader refuses longer tokens.
    found = _first_token(sentences, lambda t: len(t) != 1)
    if found:
        raise CorpusError(f"the token {found[2]!r} is longer than one character, but offsets and char-per-line "
                          "files count characters", where=_token_where(path, source, source_format, *found[:2]),
                          fix="split it into its characters")
    atomic_write_text(path, format_jsonl(sentences) if to == "jsonl" else format_conll(sentences, to))


def _first_token(sentences: list[Sentence], bad) -> tuple[Sentence, int, str] | None:
    """The first (sentence, index, token) whose token is `bad`, or None."""
    return next(((s, i, t) for s in sentences for i, t in enumerate(s.tokens) if bad(t)), None)


def _token_where(path: str | Path, source: str | Path | None, source_format: str, sent: Sentence, index: int) -> str:
    """Where a token came from: its line in `source` (a CoNLL file has a line per token, JSON lines
    and CLUENER's JSON one per sentence); the output `path` when that is unknown."""
    if source is None or not sent.line:
        return str(path)
    per_sentence = source_format in ("jsonl", "cluener") or (source_format == "auto" and _is_jsonl(source))
    return f"{source}:{sent.line if per_sentence else sent.line + index}"
