"""The word2vec file format, the one reader and writer of it: text (with or without its `N D`
header, fastText's `.vec`) or binary, gzipped or not. Static vectors (nerkit.pretrained.vectors) and
a lexicon's vocabulary (nerkit.features.lexicon) both read their files here.
"""

from __future__ import annotations

import gzip
import re
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from nerkit.errors import UserError
from nerkit.files import atomic_write_bytes

_WHITESPACE = re.compile(r"\s")

_TEXT_FIX = "give a word2vec text file: an optional `count dim` header line, then `word v1 ... vD` lines"


_CHUNK = 65536  # text lines parsed by one numpy call


_FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass
class Vectors:
    """Words and their vectors, row i of `matrix` (float32, (N, D)) belonging to `words[i]`."""

    words: list[str]
    matrix: np.ndarray  # (N, D) float32
    path: str = "<memory>"
    duplicates: int = 0  # repeated words skipped while reading (the first vector of a word is kept)

    @property
    def dim(self) -> int:
        return int(self.matrix.shape[1])

    def __len__(self) -> int:
        return len(self.words)

    def index(self) -> dict[str, int]:
        return {word: row for row, word in enumerate(self.words)}


# ---- reading ------------------------------------------------------------------------------------


def read_vectors(path: str | Path) -> Vectors:
    """Read word2vec text (with or without the `N D` header), fastText `.vec` (word2vec text with a
    header) or word2vec binary, each optionally gzipped (recognised by its magic bytes, not its name).

    Binary is told from text by content: a header line followed by bytes that are not a written
    number. The dimension is the file's own (the header's, else the first vector's). A word that
    occurs again keeps its first vector, as gensim does; `Vectors.duplicates` counts the skipped ones.
    Any defect (missing or empty file, non-UTF-8 text, a line with the wrong number of values or a
    value that is not a finite number, a truncated file) is a `UserError` naming the file and line.
    """
    return _read(Path(path))


def read_vector_words(path: str | Path) -> list[str]:
    """The words of a vector file `read_vectors` reads, in file order (a lexicon's vocabulary), each
    line or record checked as `read_vectors` checks it but its values not parsed: on large files
    (Tencent's 8M words of 200 values) parsing them would take most of the time."""
    return _read(Path(path), values=False).words


def check_vector_file(path: str | Path, setting: str, head: int = 20) -> None:
    """Raise the UserError `read_vectors` would raise on the first `head` vectors of the file: a
    cheap look (a few KiB) that tells a vector file from junk before a run reads its corpora.
    `setting` (the config key that names the file) is put in the message."""
    try:
        _read(Path(path), limit=head)
    except UserError as error:
        raise UserError(f"{setting}: {error.message}", where=error.where, fix=error.fix) from None


def is_vector_file(path: str | Path) -> bool:
    """Whether the file looks like word2vec (text or binary, gzipped or not) rather than a word list:
    a `N D` header, or a first line of a word and two or more numbers."""
    path = Path(path)
    with _open(path) as f:
        first = _read_guarded(path, f.readline)
        sample = _read_guarded(path, lambda: f.read(4096))
    if _parse_header(first, sample) is not None:
        return True
    fields = first.removeprefix(b"\xef\xbb\xbf").split()
    return len(fields) > 2 and all(_is_number(field) for field in fields[1:])


def _is_number(field: bytes) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def _read(path: Path, values: bool = True, limit: int | None = None) -> Vectors:
    """The one reader behind `read_vectors`, `read_vector_words` and `check_vector_file`: without
    `values` the rows are checked for their count but not parsed (the matrix is (N, 0)); with
    `limit` only the first `limit` vectors are read and the header's count is not checked."""
    if not path.exists():
        raise UserError("vector file not found", where=str(path), fix="check the path")
    if not path.is_file():
        raise UserError("not a regular file", where=str(path), fix="point to a word2vec or fastText vector file")
    with _open(path) as f:
        first = _read_guarded(path, f.readline)
        sample = _read_guarded(path, lambda: f.read(4096))
    header = _parse_header(first, sample)
    if header is not None and _looks_binary(sample):
        return _read_binary(path, header, values, limit)
    return _read_text(path, header, values, limit)


def _open(path: Path):
    try:
        with path.open("rb") as probe:
            gzipped = probe.read(2) == b"\x1f\x8b"
        return gzip.open(path, "rb") if gzipped else path.open("rb")
    except OSError as error:
        raise UserError(f"cannot read the vector file ({error.strerror or error})", where=str(path)) from None


def _read_guarded(path: Path, read: Callable):
    try:
        return read()
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise UserError(f"damaged gzip file ({error})", where=str(path),
                        fix="the file may be truncated; download or compress it again") from None
    except OSError as error:
        raise UserError(f"cannot read the vector file ({error.strerror or error})", where=str(path)) from None


def _parse_header(first: bytes, sample: bytes) -> tuple[int, int] | None:
    """`(count, dim)` when the first line is a word2vec header. A headerless file of 1-d vectors can
    start with two integers too ("12 5"): then the next text line has 2 fields, not dim + 1."""
    fields = first.removeprefix(b"\xef\xbb\xbf").split()
    if len(fields) != 2 or not all(f.isdigit() for f in fields):
        return None
    count, dim = int(fields[0]), int(fields[1])
    if _looks_binary(sample):
        return count, dim
    following = sample.split(b"\n", 1)[0].split()
    return None if len(following) == 2 and dim != 1 else (count, dim)


def _looks_binary(sample: bytes) -> bool:
    """After a header, binary records are `word` + space + raw floats; text has written numbers. Raw
    float bytes are almost never all printable ASCII, while a text line with a typo (`0.1x`) still is:
    it is read as text, so that its error names its line and value."""
    first_line = sample.lstrip(b"\n").split(b"\n", 1)[0]
    word_end = first_line.find(b" ")
    if word_end < 0:
        return False
    values = first_line[word_end + 1:][:64]  # raw floats end here early if one of their bytes is "\n"
    return not values or any((byte < 0x20 and byte not in b"\t\r") or byte >= 0x7F for byte in values)


def _read_text(path: Path, header: tuple[int, int] | None, values_wanted: bool, limit: int | None) -> Vectors:
    declared, dim = header if header else (None, None)
    words: list[str] = []
    seen: set[str] = set()
    duplicates = data_lines = 0
    blocks: list[np.ndarray] = []
    pending: list[tuple[int, str]] = []  # (line number, the values of one line) awaiting parsing

    def flush() -> None:
        blocks.append(_parse_values(path, pending, dim))
        pending.clear()

    with _open(path) as f:
        lines = enumerate(f, 1)
        if header:
            _read_guarded(path, lambda: next(lines))
        while True:
            item = _read_guarded(path, lambda: next(lines, None))
            if item is None:
                break
            number, raw = item
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise UserError(f"bytes at column {error.start + 1} are not UTF-8 ({raw[error.start:error.start + 4]!r})",
                                where=f"{path}:{number}",
                                fix="convert the file to UTF-8; a word2vec binary file needs its `N D` header line") from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            line = line.rstrip(" \t\r\n")
            if not line:
                continue
            word, _, values = line.partition(" ")
            if not word:
                raise UserError("the line starts with a space (an empty word)", where=f"{path}:{number}", fix=_TEXT_FIX)
            count = values.count(" ") + 1 if values else 0
            if "\t" in word and (count != (dim or count) or not count):
                # Only spaces end the word: a tab-separated line is one long word without values.
                fields = line.split("\t")
                expected = f"{dim} values" if dim else "values"
                raise UserError(f"expected {expected} after the word, found a line of {len(fields)} tab-separated fields "
                                f"(word2vec text separates them with spaces)", where=f"{path}:{number}",
                                fix="replace the tabs with spaces, e.g. `tr '\\t' ' ' < IN > OUT`")
            if dim is None:
                dim = count
            if count != dim and len(values.split()) != dim:  # tolerate runs of spaces or tabs
                raise UserError(f"expected {dim} values after the word, found {len(values.split())}",
                                where=f"{path}:{number}", fix=_TEXT_FIX)
            if dim == 0:
                raise UserError("a word without values", where=f"{path}:{number}", fix=_TEXT_FIX)
            data_lines += 1
            if word in seen:
                duplicates += 1
                continue
            seen.add(word)
            words.append(word)
            if values_wanted:
                pending.append((number, values))
            else:  # the last value alone, as a cheap check that the line holds numbers
                _parse_values(path, [(number, values.rpartition(" ")[2])], 1)
            if len(pending) == _CHUNK:
                flush()
            if data_lines == limit:
                break
    if pending:
        flush()
    if limit is None and declared is not None and declared != data_lines:
        raise UserError(f"the header announces {declared:,} vectors but the file holds {data_lines:,}",
                        where=f"{path}:1", fix="the file may be truncated; download it again or fix the header")
    if not words:
        raise UserError("the file holds no vectors", where=str(path), fix=_TEXT_FIX)
    matrix = np.concatenate(blocks) if values_wanted else np.empty((len(words), 0), dtype=np.float32)
    return Vectors(words, matrix, str(path), duplicates)


def _parse_values(path: Path, pending: list[tuple[int, str]], dim: int) -> np.ndarray:
    """One (len(pending), dim) float32 block; a bad value is looked for line by line only on failure."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            flat = np.fromstring(" ".join(v for _, v in pending), dtype=np.float32, sep=" ")
        except ValueError:
            flat = np.empty(0, dtype=np.float32)
    if flat.size == len(pending) * dim and np.isfinite(flat).all():
        return flat.reshape(len(pending), dim)
    for number, values in pending:
        for value in values.split():
            try:
                ok = abs(float(value)) <= _FLOAT32_MAX  # False for nan; inf and 1e39 exceed it
            except ValueError:
                ok = False
            if not ok:
                shown = value if len(value) <= 30 else value[:30] + "..."
                raise UserError(f"the value {shown!r} is not a finite number", where=f"{path}:{number}", fix=_TEXT_FIX)
    raise AssertionError("numpy refused values that parse one by one")  # pragma: no cover


def _read_binary(path: Path, header: tuple[int, int], values_wanted: bool, limit: int | None) -> Vectors:
    count, dim = header
    width, pos, duplicates = 4 * dim, 0, 0
    records = count if limit is None else min(count, limit)
    with _open(path) as f:
        _read_guarded(path, f.readline)
        # A word is looked for in its first 10,000 bytes: `limit` records fit in this many.
        data = _read_guarded(path, lambda: f.read(-1 if limit is None else limit * (width + 10_002)))
    words: list[str] = []
    seen: set[str] = set()
    matrix = np.empty((records, dim if values_wanted else 0), dtype=np.float32)
    for record in range(1, records + 1):
        where = f"{path}: record {record:,}"
        while data[pos:pos + 1] == b"\n":  # the word2vec C tool ends each record with a newline
            pos += 1
        space = data.find(b" ", pos, pos + 10_000)
        if space < 0 or space + 1 + width > len(data):
            raise UserError(f"the header announces {count:,} vectors but the file ends at record {record:,}",
                            where=where, fix="the file may be truncated; download it again")
        try:
            word = data[pos:space].decode("utf-8")
        except UnicodeDecodeError:
            raise UserError(f"the word at byte {pos:,} is not UTF-8 ({data[pos:pos + 12]!r})", where=where,
                            fix="the file is damaged, or not word2vec binary") from None
        if not word:
            raise UserError(f"an empty word at byte {pos:,}", where=where, fix="the file is damaged, or not word2vec binary")
        row = np.frombuffer(data, dtype="<f4", count=dim, offset=space + 1)
        pos = space + 1 + width
        if word in seen:
            duplicates += 1
            continue
        if not np.isfinite(row).all():
            raise UserError(f"the vector of {word!r} holds a value that is not a finite number", where=where,
                            fix="the file is damaged, or not word2vec binary")
        seen.add(word)
        if values_wanted:
            matrix[len(words)] = row
        words.append(word)
    if limit is None and data[pos:].strip():
        raise UserError(f"{len(data) - pos:,} bytes follow the {count:,} vectors the header announces",
                        where=str(path), fix="the header count is wrong, or the file is not word2vec binary")
    if not words:
        raise UserError("the file holds no vectors", where=str(path), fix=_TEXT_FIX)
    return Vectors(words, matrix[: len(words)], str(path), duplicates)


# ---- writing ------------------------------------------------------------------------------------


def write_word2vec_text(path: str | Path, words: list[str], matrix: np.ndarray, digits: int = 6) -> None:
    """Write `N D` and one `word v1 ... vD` line per row (`digits` significant digits), atomically."""
    matrix = np.asarray(matrix, dtype=np.float32)
    if matrix.ndim != 2 or matrix.shape[0] != len(words):
        raise ValueError(f"{len(words)} words but a matrix of shape {matrix.shape}")
    bad = next((w for w in words if not w or _WHITESPACE.search(w)), None)
    if bad is not None:
        raise ValueError(f"the word {bad!r} cannot be written to word2vec text (empty, or holds whitespace)")
    row_format = " ".join([f"%.{digits}g"] * matrix.shape[1])
    lines = [f"{len(words)} {matrix.shape[1]}\n"]
    lines.extend(f"{word} {row_format % tuple(row)}\n" for word, row in zip(words, matrix.tolist()))
    atomic_write_bytes(path, "".join(lines).encode("utf-8"))
