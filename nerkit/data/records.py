"""What every corpus reader shares: the Sentence and Corpus it returns, reading and decoding a file,
collecting its errors, and the checks of a JSON record (its text; its overlapping entities, kept or
projected flat by nerkit.data.nesting's rules). The
readers of nerkit's own formats (`corpus`) and of annotation tools' files (`annotation`) import it;
it imports neither, so the two can dispatch to each other's formats without a circle."""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from pathlib import Path

from nerkit.data.nesting import FLAT_RULES, nested, project
from nerkit.data.tags import Span, spans_to_tags, tags_to_spans
from nerkit.errors import CorpusError, ManyErrors, did_you_mean

SPANS = "spans"  # what JSON-lines files have instead of a tag scheme

# A document separator (CoNLL's): a CoNLL line whose token is this, or a JSON record whose whole
# text it is, is no sentence but the start of a new document (`Sentence.document`).
DOCUMENT_SEPARATOR = "-DOCSTART-"


@dataclass
class Sentence:
    tokens: list[str]
    tags: list[str] | None = None
    # 1-based line of the first token in its file (0 when not from a file); in a Label Studio export,
    # whose tasks are not lines, the task's index + 1.
    line: int = 0
    # Which document of its file it belongs to: the count of separator lines (DOCUMENT_SEPARATOR)
    # before it, 0 in a file without any. Consecutive sentences of one document are read as one
    # stream by `data.context: document` (nerkit.data.documents).
    document: int = 0
    # The entities of a sentence whose entities overlap (nested, or a span with two types), which
    # tags cannot hold: its `tags` are then the outer projection's, and only `spans()` is the truth.
    # None for every other sentence, whose tags hold its entities.
    entities: list[Span] | None = None
    # A JSON-lines record's keys besides "text" and "entities" (an id, metadata), in its order, which
    # `nerkit data convert --to jsonl` writes back; nothing else reads them. None for other formats.
    extra: dict | None = None
    # Partial annotation: the regions (start, end exclusive, sorted, disjoint) that nobody annotated,
    # where the tags hold O only as a placeholder and no entity lies; a marked entity is whole and
    # known. None where every character is annotated (every corpus nerkit read before issue 57).
    unknown: list[tuple[int, int]] | None = None

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    @property
    def nested(self) -> bool:
        return self.entities is not None

    def spans(self) -> list[Span]:
        return list(self.entities) if self.entities is not None else tags_to_spans(self.tags or [])

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def partial(self) -> bool:
        return bool(self.unknown)

    def known(self) -> list[bool]:
        """Per character, whether it is annotated (False inside an `unknown` region)."""
        known = [True] * len(self.tokens)
        for start, end in self.unknown or ():
            known[start:end] = [False] * (end - start)
        return known


def unknown_regions(known: list[bool]) -> list[tuple[int, int]] | None:
    """The `Sentence.unknown` regions of a per-character annotated mask (None: all annotated)."""
    regions, start = [], None
    for i, k in enumerate([*known, True]):
        if not k and start is None:
            start = i
        elif k and start is not None:
            regions.append((start, i))
            start = None
    return regions or None


@dataclass
class Corpus:
    path: str
    sentences: list[Sentence]
    scheme: str
    invalid_transitions: int = 0  # found while reading (each one fixed when repair=True)
    repaired: int = 0  # tags changed by repair
    split_tokens: int = 0  # tokens of several characters that repair split into their characters
    dropped_overlaps: int = 0  # entities that a flat projection dropped from overlaps (`Overlaps`)
    flat: str = "none"  # the flat projection applied while reading (nerkit.data.nesting.FLATS)
    types: list[str] = field(default_factory=list)
    format: str = "conll"  # or "jsonl", "cluener", "inline", "doccano", "label-studio"

    @property
    def labels(self) -> str:
        """How the file marks entities: its tag scheme, or SPANS for JSON lines and the other
        formats of offsets (whose BIOES tags exist only inside nerkit)."""
        return self.scheme if self.format == "conll" else SPANS


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
    return text.removeprefix("\ufeff")  # a BOM is accepted and dropped


def read_text(path: str | Path) -> str:
    """A plain UTF-8 text file's text, decoded as the corpora are (`decode_utf8`) and a leading BOM
    dropped: the one reading of every plain-text input (lm adapt's and distill's --text, data
    select's pool, vectors' text, bench's texts). Its caller has checked that the file exists."""
    path = Path(path)
    return _decode(path, path.read_bytes())


def text_lines(text: str) -> list[str]:
    """The texts of one-text-a-line input, as `nerkit predict` splits it: each line that is not
    blank, without its line end ("\n" or "\r\n"), otherwise as written."""
    return [line.rstrip("\r") for line in text.split("\n") if line.strip()]


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


def _span_corpus(path: Path, sentences: list[Sentence], fmt: str) -> Corpus:
    """The Corpus of a file of offsets (`fmt`), its sentences tagged BIOES inside nerkit."""
    if not sentences:
        raise CorpusError("the file has no sentences", where=str(path))
    corpus = Corpus(str(path), sentences, "bioes", format=fmt)
    corpus.types = sorted({s.type for sent in sentences for s in sent.spans()})
    return corpus


def _read_records(path: str | Path, max_errors: int, parse, fmt: str, overlaps: Overlaps | None = None) -> Corpus:
    """A file of one JSON record a line, each read by `parse(line, number, where, overlaps)` into a
    Sentence; `overlaps` (by default: refused) says what to do with overlapping entities."""
    overlaps = overlaps or Overlaps()
    path, data = _read_bytes(path)
    text = _decode(path, data)
    if _json_array(text.lstrip().split("\n", 1)[0]):
        line = text[:len(text) - len(text.lstrip())].count("\n") + 1
        raise CorpusError("the file is one JSON array, not JSON lines (an object a line)", where=f"{path}:{line}",
                          fix="a Label Studio export? convert it with `nerkit data convert IN OUT --from label-studio "
                              "--to jsonl` (CBLUE's CMeEE JSON: --from cblue)")
    problems = _Problems(path, max_errors)
    sentences, document = [], 0
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            sentence = parse(line, number, f"{path}:{number}", overlaps)
        except CorpusError as e:
            problems.add(e, number)
            continue
        if sentence.text == DOCUMENT_SEPARATOR and not sentence.spans():
            document += 1
            continue
        sentence.document = document
        sentences.append(sentence)
    problems.raise_any()
    return overlaps.noted(_span_corpus(path, sentences, fmt))


def _json_array(first_line: str) -> bool:
    """Whether a file whose first line is this is one JSON array (Label Studio's export) rather than
    a record a line: the line opens an array that it does not close, or is an array of objects."""
    if not first_line.startswith("["):
        return False
    try:
        value = json.loads(first_line)
    except json.JSONDecodeError:
        return True
    return isinstance(value, list) and any(isinstance(item, dict) for item in value)


def _json_record(line: str, where: str, fmt: str, key: str = "text") -> dict:
    """One line's JSON object; `fmt` says what a line should be, for the error's fix, and `key`
    where its text is."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise CorpusError(f"not valid JSON ({e.msg} at column {e.colno})", where=where, fix=fmt) from None
    if not isinstance(record, dict):
        raise CorpusError(f'the record has no "{key}" string', where=where, fix=fmt)
    return record


def text_record(line: str, field: str, where: str) -> tuple[str, dict]:
    """A line of JSON lines to tag (`nerkit predict --field FIELD`): the string at its `field`, and
    its other keys, which the output's record keeps (a CLUENER `id`, a Hugging Face dataset's columns)."""
    fmt = f'each line is a JSON object with the text to tag at "{field}" (--field names the key)'
    record = _json_record(line, where, fmt, key=field)
    text = record.pop(field, None)
    if not isinstance(text, str):
        found = "its keys: " + ", ".join(map(str, record)) if text is None else f"it is {type(text).__name__}"
        close = did_you_mean(field, [k for k, v in record.items() if isinstance(v, str)])
        raise CorpusError(f'the record has no "{field}" string ({found})', where=where,
                          fix=f"name the key with --field: {close}" if close else fmt)
    return text, record


def _text_of(record: dict, where: str, fmt: str) -> str:
    text = record.get("text")
    if not isinstance(text, str):
        raise CorpusError('the record has no "text" string', where=where, fix=fmt)
    return text


def span_sentence(text: str, spans: list[Span], line: int, extra: dict | None = None,
                  unknown: list[tuple[int, int]] | None = None) -> Sentence:
    """The Sentence of a text and its entities (sorted by start, end): tagged BIOES inside nerkit,
    the entities kept beside the tags when they overlap (`Sentence.entities`); `extra`: its
    record's other keys (`Sentence.extra`); `unknown`: its regions nobody annotated, checked
    (`record_unknown`, `check_unknown`)."""
    if not nested(spans):
        return Sentence(list(text), spans_to_tags(len(text), spans, "bioes"), line, extra=extra, unknown=unknown)
    return Sentence(list(text), spans_to_tags(len(text), project(spans, "outer"), "bioes"), line,
                    entities=sorted(spans, key=lambda s: (s.start, s.end, s.type)), extra=extra, unknown=unknown)


# Partial annotation in a record of offsets (JSON lines, doccano, Label Studio's data): the regions
# nobody annotated, `"unknown": [[start, end], ...]`, end exclusive as entities' offsets are. The
# key says what is missing rather than what is there, so that a record without it, every file
# written before it, is complete and keeps its meaning.
UNKNOWN_KEY = "unknown"


def record_unknown(value, length: int, where: str, fix: str, char=None,
                   units: str = "characters") -> list[tuple[int, int]] | None:
    """The `Sentence.unknown` of a record's UNKNOWN_KEY `value` (None for an empty list): pairs of
    integer offsets inside its text of `length` (in the file's units), no region empty. Regions
    that are out of order, overlap or touch are refused rather than merged: one region is written
    one way, so every file reads back to itself, and a list out of order is a script's bug worth
    seeing. `char` maps an offset of the file to a character index, None inside a character
    (doccano's UTF-16 `units`); `fix` says what the record looks like."""
    if not isinstance(value, list):
        raise CorpusError(f'"{UNKNOWN_KEY}" is {type(value).__name__}, not a list of [start, end] pairs', where=where,
                          fix=fix)
    regions: list[tuple[int, int]] = []
    for pair in value:
        if not (isinstance(pair, list) and len(pair) == 2 and all(type(x) is int for x in pair)):
            raise CorpusError(f"the unknown region {_shown(json.dumps(pair, ensure_ascii=False))} is not [start, end] "
                              "with integer offsets", where=where, fix=fix)
        start, end = pair
        if not 0 <= start < end <= length:
            what = "is empty" if start == end else f"is outside the text of {length} {units}"
            raise CorpusError(f"the unknown region [{start}, {end}] {what}", where=where,
                              fix=f"offsets count {units} from 0, end exclusive, as entities' do")
        if regions and start <= regions[-1][1]:
            before = regions[-1]
            how = "are out of order" if start < before[0] else "overlap" if start < before[1] else "touch"
            raise CorpusError(f"the unknown regions [{before[0]}, {before[1]}] and [{start}, {end}] {how}", where=where,
                              fix="list the regions sorted by start and apart, a region that overlaps or touches "
                                  f"another written as one: [{min(before[0], start)}, {max(before[1], end)}]")
        regions.append((start, end))
    if char is not None:
        chars = [(char(start), char(end)) for start, end in regions]
        inside = next((pair for pair, got in zip(regions, chars) if None in got), None)
        if inside:
            raise CorpusError(f"the unknown region [{inside[0]}, {inside[1]}] starts or ends inside a character", where=where,
                              fix=fix)
        regions = chars
    return regions or None


def check_unknown(spans: list[Span], unknown: list[tuple[int, int]] | None, text: str, where: str) -> None:
    """An entity that overlaps an unknown region is an error naming both: a marked entity is
    annotated whole, and no entity lies where nobody looked."""
    for span in spans:
        for start, end in unknown or ():
            if span.start < end and start < span.end:
                raise CorpusError(f"the entity {span.type} {_shown(text[span.start:span.end])} at {span.start}:{span.end} "
                                  f"overlaps the unknown region [{start}, {end}]", where=where,
                                  fix="an entity lies where the text is annotated: shrink the region to leave it out, "
                                      "or remove the entity")


def unknown_value(sentence: Sentence) -> list[list[int]]:
    """A partial sentence's regions as a record's UNKNOWN_KEY writes them (character offsets)."""
    return [[start, end] for start, end in sentence.unknown or ()]


@dataclass
class Overlaps:
    """What a reader of offsets does with overlapping or nested entities: keep them (every format of
    offsets holds them; what cannot, a character-per-line file or a CRF's training data, refuses
    them later), or with `flat` "outer" or "inner" keep one entity of each overlap
    (nerkit.data.nesting.project) and count the entities dropped."""

    flat: str = "none"
    dropped: int = 0

    def check(self, spans: list[Span]) -> list[Span]:
        """`spans` (sorted by start, end), projected flat if asked."""
        if self.flat == "none" or not nested(spans):
            return spans
        kept = project(spans, self.flat)
        self.dropped += len(spans) - len(kept)
        return kept

    def noted(self, corpus: Corpus) -> Corpus:
        corpus.dropped_overlaps, corpus.flat = self.dropped, self.flat
        return corpus


# What `--repair` does with overlaps (it includes `--flat outer`), as the messages say it.
OVERLAP_RULE = FLAT_RULES["outer"]


def flatten(sentences: list[Sentence], flat: str) -> tuple[list[Sentence], int]:
    """`sentences` with every nested one projected flat (`flat`: outer or inner), and how many
    entities that dropped."""
    out, dropped = [], 0
    for sent in sentences:
        if not sent.nested:
            out.append(sent)
            continue
        kept = project(sent.entities, flat)
        dropped += len(sent.entities) - len(kept)
        out.append(Sentence(sent.tokens, spans_to_tags(len(sent), kept, "bioes"), sent.line, sent.document,
                            extra=sent.extra, unknown=sent.unknown))
    return out, dropped


def check_keys(obj: dict, known: tuple[str, ...], what: str, where: str, fix: str, hint=None) -> None:
    """An unknown key is an error, not ignored: a misspelt `entities` would lose every entity. Its fix:
    `hint(key)` where that names one (another format's key), else the nearest known key, else `fix`."""
    for key in obj:
        if key not in known:
            raise CorpusError(f"unknown key {key!r}{what}; the keys are {', '.join(map(repr, known))}", where=where,
                              fix=(hint and hint(key)) or did_you_mean(key, known) or fix)


def record_entities(record: dict, where: str, texts_only: bool, missing_fix, fix: str | None = None) -> list:
    """A record's "entities" list (empty when `texts_only` and it has none); `missing_fix` says what to
    write where the key is missing (a string, or a function that works it out only then), `fix`
    what the list should look like."""
    if "entities" not in record and not texts_only:
        raise CorpusError('the record has no "entities" key', where=where,
                          fix=missing_fix() if callable(missing_fix) else missing_fix)
    entities = record.get("entities", [])
    if not isinstance(entities, list):
        raise CorpusError(f'"entities" is {type(entities).__name__}, not a list', where=where, fix=fix)
    return entities
