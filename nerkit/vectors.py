"""Static vectors: read and write word2vec / fastText files, train character, bigram and word vectors
from your own text with gensim, and export the character embeddings that jieba ships (Baidu LAC).

Everything here works on plain numpy arrays; turning vectors into embedding tables is the featuriser's
job. gensim (training) and pyahocorasick (held-out filtering) come with `pip install nerkit[vectors]`.
"""

from __future__ import annotations

import gzip
import importlib.util
import logging
import re
import struct
import warnings
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from nerkit.errors import UserError
from nerkit.features import bigrams
from nerkit.files import atomic_write_bytes

KINDS = ("char", "bichar", "word")  # what `train_vectors` trains, each written as KIND.vec
_TEXT_FIX = "give a word2vec text file: an optional `count dim` header line, then `word v1 ... vD` lines"
_CHUNK = 65536  # text lines parsed by one numpy call
_WHITESPACE = re.compile(r"\s")
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
    path = Path(path)
    if not path.exists():
        raise UserError("vector file not found", where=str(path), fix="check the path")
    if not path.is_file():
        raise UserError("not a regular file", where=str(path), fix="point to a word2vec or fastText vector file")
    with _open(path) as f:
        first = _read_guarded(path, f.readline)
        sample = _read_guarded(path, lambda: f.read(4096))
    header = _parse_header(first, sample)
    if header is not None and _looks_binary(sample):
        return _read_binary(path, header)
    return _read_text(path, header)


def check_dim(vectors: Vectors, expected: int | None, setting: str) -> None:
    """Refuse a configured dimension (`setting`, e.g. `embeddings.char_dim`) that is not the file's."""
    if expected is not None and expected != vectors.dim:
        raise UserError(
            f"the vectors have dimension {vectors.dim}, but {setting} is {expected}",
            where=vectors.path,
            fix=f"set {setting} to {vectors.dim} (or leave it out: the dimension is read from the file)",
        )


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


def _read_text(path: Path, header: tuple[int, int] | None) -> Vectors:
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
            pending.append((number, values))
            if len(pending) == _CHUNK:
                flush()
    if pending:
        flush()
    if declared is not None and declared != data_lines:
        raise UserError(f"the header announces {declared:,} vectors but the file holds {data_lines:,}",
                        where=f"{path}:1", fix="the file may be truncated; download it again or fix the header")
    if not words:
        raise UserError("the file holds no vectors", where=str(path), fix=_TEXT_FIX)
    return Vectors(words, np.concatenate(blocks), str(path), duplicates)


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


def _read_binary(path: Path, header: tuple[int, int]) -> Vectors:
    count, dim = header
    with _open(path) as f:
        _read_guarded(path, f.readline)
        data = _read_guarded(path, f.read)
    words: list[str] = []
    seen: set[str] = set()
    matrix = np.empty((count, dim), dtype=np.float32)
    width, pos, duplicates = 4 * dim, 0, 0
    for record in range(1, count + 1):
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
        matrix[len(words)] = row
        words.append(word)
    if data[pos:].strip():
        raise UserError(f"{len(data) - pos:,} bytes follow the {count:,} vectors the header announces",
                        where=str(path), fix="the header count is wrong, or the file is not word2vec binary")
    if not words:
        raise UserError("the file holds no vectors", where=str(path), fix=_TEXT_FIX)
    return Vectors(words, matrix[: len(words)], str(path), duplicates)


# ---- arithmetic ---------------------------------------------------------------------------------


def normalize_rows(matrix: np.ndarray) -> np.ndarray:
    """Each row scaled to unit length; a zero row stays zero (TENER and FLAT's StaticEmbedding
    divide by norm + 1e-12 the same way)."""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)  # (N, 1)
    return matrix / np.where(norms > 0, norms, 1.0).astype(np.float32)


@dataclass(frozen=True)
class Coverage:
    types: int
    types_found: int
    occurrences: int
    occurrences_found: int

    @property
    def type_rate(self) -> float:
        return self.types_found / self.types if self.types else 0.0

    @property
    def occurrence_rate(self) -> float:
        return self.occurrences_found / self.occurrences if self.occurrences else 0.0

    def __str__(self) -> str:
        return (f"types {self.types_found:,}/{self.types:,} ({100 * self.type_rate:.2f}%), "
                f"occurrences {self.occurrences_found:,}/{self.occurrences:,} ({100 * self.occurrence_rate:.2f}%)")


def coverage(counts: Counter, words: Iterable[str]) -> Coverage:
    """How many token types of a corpus (`counts`: token -> occurrences) have a vector, and how many
    of their occurrences."""
    vocabulary = words if isinstance(words, (set, frozenset, dict)) else set(words)
    found = [n for token, n in counts.items() if token in vocabulary and n > 0]
    return Coverage(sum(1 for n in counts.values() if n > 0), len(found),
                    sum(n for n in counts.values() if n > 0), sum(found))


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


# ---- text for training --------------------------------------------------------------------------


_CONLL_LINE = re.compile(r"^\S+[ \t]+(?:\S+[ \t]+)*(?:O|[BIMES]-\S+)$")


def read_texts(path: str | Path) -> list[str]:
    """The texts of one training file. A nerkit corpus gives its sentences (JSON lines by the
    extension .jsonl/.json; CoNLL char-per-line when each of its first 50 non-blank lines is
    `token ... TAG` with an O or B-/I-/M-/E-/S- tag); any other file is plain UTF-8 text, one text per
    non-blank line."""
    from nerkit.corpus import _decode, _read_bytes, read_corpus

    path, data = _read_bytes(path)
    text = _decode(path, data)
    if path.suffix in (".jsonl", ".json"):
        return [s.text for s in read_corpus(path).sentences]
    sample = [line.rstrip("\r") for line in text.split("\n", 400)[:400] if line.strip()][:50]
    if sample and all(_CONLL_LINE.match(line) for line in sample):
        return [s.text for s in read_corpus(path, strict=False).sentences]
    return [line.strip() for line in text.split("\n") if line.strip()]


def text_key(text: str) -> str:
    """A sentence as held-out filtering compares it: whitespace removed, each character NFKC-folded
    when that keeps it one character (so １９９８ and 1998, or ， and , compare equal)."""
    return "".join(chars_of(text, normalize=True))


class HeldOut:
    """Dev and test sentences that vector training text must not contain, be part of, or share a
    long run of characters with.

    A text is rejected when, compared by `text_key`, it contains a held-out sentence of at least
    `min_len` characters, is itself part of a held-out sentence (any length), or shares a run of
    `run` characters with one (a held-out sentence cut or joined differently, as MSRA and People's
    Daily cut the same 1998 articles). Shorter held-out "sentences" (MSRA's test set has lines such
    as 同胞们 or a bare name) are not evidence that a text comes from the test set, and would reject
    every text that mentions them.
    """

    def __init__(self, sentences: Iterable[str], min_len: int = 5, run: int = 25):
        from nerkit.lexicon import Lexicon

        keys = {text_key(s) for s in sentences} - {""}
        self.min_len, self.run = min_len, run
        self._joined = "\n".join(sorted(keys))  # `key in joined` <=> key is part of a held-out sentence
        self._lexicon = Lexicon(keys, min_len=max(2, min_len), max_len=None, source="held-out sentences")
        self._single = {k for k in keys if len(k) == 1 and min_len <= 1}
        self._runs = {k[i:i + run] for k in keys for i in range(len(k) - run + 1)}

    @classmethod
    def from_files(cls, paths: Iterable[str | Path], **options) -> "HeldOut":
        """The sentences of dev or test files (corpora or plain text, as `read_texts` reads them)."""
        return cls([text for path in paths for text in read_texts(path)], **options)

    def rejects(self, text: str) -> bool:
        key = text_key(text)
        if not key:
            return False
        if key in self._joined:
            return True
        if self._single and any(char in self._single for char in key):
            return True
        if any(key[i:i + self.run] in self._runs for i in range(len(key) - self.run + 1)):
            return True
        return bool(self._lexicon.match(key))

    def filter(self, texts: list[str]) -> tuple[list[str], int]:
        """The texts it does not reject, and how many it rejected."""
        kept = [t for t in texts if not self.rejects(t)]
        return kept, len(texts) - len(kept)


# ---- training -----------------------------------------------------------------------------------


_MAX_TOKENS = 10_000  # gensim silently cuts a longer sentence: cut it into pieces instead


class _Sentences:
    """A re-iterable corpus for gensim: `tokenize(text)` for each text, in pieces of at most 10,000."""

    def __init__(self, texts: list[str], tokenize: Callable[[str], list[str]]):
        self.texts, self.tokenize = texts, tokenize

    def __iter__(self) -> Iterator[list[str]]:
        for text in self.texts:
            tokens = self.tokenize(text)
            for start in range(0, len(tokens), _MAX_TOKENS):
                yield tokens[start:start + _MAX_TOKENS]


def chars_of(text: str, normalize: bool = False) -> list[str]:
    """A text's characters as vector tokens: whitespace dropped (a corpus has no whitespace tokens),
    each NFKC-folded with `normalize` exactly as the featuriser does under `data.normalize`."""
    from nerkit.corpus import normalize_char

    return [normalize_char(c) if normalize else c for c in text if not c.isspace()]


def segment(texts: list[str], normalize: bool = False) -> list[str]:
    """Each text cut into words by jieba (its default dictionary, HMM on) as the words of
    `train_vectors` are: space-joined, whitespace dropped."""
    try:
        import jieba
    except ImportError:
        raise UserError("word vectors need jieba to cut the text into words", fix="pip install jieba") from None
    tokenizer = jieba.Tokenizer()
    logger = logging.getLogger("jieba")
    level = logger.level
    logger.setLevel(logging.WARNING)  # jieba announces its dictionary loading on stderr
    try:
        tokenizer.initialize()
    finally:
        logger.setLevel(level)
    segmented = []
    for text in texts:
        text = "".join(chars_of(text, normalize)) if normalize else text
        segmented.append(" ".join(w for w in tokenizer.cut(text) if w.strip() and not _WHITESPACE.search(w)))
    return segmented


def train_vectors(
    text_files: list[str | Path],
    out_dir: str | Path,
    dim: int = 50,
    word_dim: int | None = None,
    window: int = 5,
    min_count: int = 5,
    epochs: int = 5,
    seed: int = 1,
    workers: int = 1,
    sg: bool = True,
    kinds: Iterable[str] = KINDS,
    normalize: bool = False,
    held_out: HeldOut | None = None,
) -> dict:
    """Train word2vec (gensim; skip-gram with negative sampling unless `sg` is False) character,
    character-bigram and jieba-word vectors on the texts of `text_files` (see `read_texts`) and
    write them as word2vec text to `out_dir`/char.vec, bichar.vec, word.vec.

    Characters and bigrams are exactly the featuriser's (`chars_of`, `nerkit.features.bigrams`, so
    the last character of a text also gets `c + "</s>"`). `word_dim` defaults to `dim`. Texts that
    `held_out` rejects are left out. With one worker a seed gives identical files on every run.
    Returns what was trained: per file the texts read and rejected, per kind its vocabulary size,
    dimension, tokens and path.
    """
    kinds = list(kinds)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise UserError(f"unknown vector kind(s) {', '.join(unknown) or '(none given)'}", fix=f"choose from {', '.join(KINDS)}")
    word_dim = dim if word_dim is None else word_dim
    for name, value in (("dim", dim), ("word_dim", word_dim), ("window", window), ("min_count", min_count),
                        ("epochs", epochs), ("workers", workers)):
        if not isinstance(value, int) or value < 1:
            raise UserError(f"{name} must be a positive integer, not {value!r}")
    if not text_files:
        raise UserError("no text files given", fix="pass at least one plain text file or corpus")
    try:
        from gensim.models import Word2Vec
    except ImportError:
        raise UserError("training vectors needs gensim, which is not installed",
                        fix="pip install 'nerkit[vectors]' (or pip install gensim)") from None

    texts: list[str] = []
    report: dict = {"files": [], "kinds": {}}
    for path in text_files:
        read = read_texts(path)
        kept, rejected = held_out.filter(read) if held_out is not None else (read, 0)
        texts.extend(kept)
        report["files"].append({"path": str(path), "texts": len(read), "rejected": rejected})
    if not any(chars_of(t) for t in texts):
        raise UserError("the text files hold no characters to train on",
                        where=", ".join(str(p) for p in text_files), fix="give files with text")

    tokenizers: dict[str, Callable[[str], list[str]]] = {
        "char": lambda t: chars_of(t, normalize),
        "bichar": lambda t: bigrams(chars_of(t, normalize)),
    }
    word_texts: list[str] = []
    if "word" in kinds:
        word_texts = segment(texts, normalize)
        tokenizers["word"] = str.split
    out_dir = Path(out_dir)
    for kind in kinds:
        corpus = _Sentences(word_texts if kind == "word" else texts, tokenizers[kind])
        model = Word2Vec(vector_size=word_dim if kind == "word" else dim, window=window, min_count=min_count,
                         sg=int(sg), negative=5, epochs=epochs, seed=seed, workers=workers)
        model.build_vocab(corpus)
        if not model.wv.index_to_key:
            raise UserError(f"no {kind} occurs {min_count} times or more: nothing to train",
                            fix="give more text or lower min_count")
        model.train(corpus, total_examples=model.corpus_count, epochs=model.epochs)
        path = out_dir / f"{kind}.vec"
        write_word2vec_text(path, list(model.wv.index_to_key), model.wv.vectors)
        report["kinds"][kind] = {"path": str(path), "vectors": len(model.wv.index_to_key),
                                 "dim": model.wv.vector_size, "tokens": model.corpus_total_words}
    return report


# ---- jieba's LAC character embeddings -----------------------------------------------------------

# Paddle's VarType for the tensor element types: numpy dtype and the bytes of one element.
_PADDLE_FIX = ("the file is damaged or of another layout; reinstall the package it came from "
               "(pip install --force-reinstall jieba)")
_PADDLE_DTYPES = {1: np.dtype("<i2"), 2: np.dtype("<i4"), 3: np.dtype("<i8"), 4: np.dtype("<f2"),
                  5: np.dtype("<f4"), 6: np.dtype("<f8")}


def read_paddle_tensor(path: str | Path) -> np.ndarray:
    """A tensor saved by Paddle's (fluid) `save_persistables`, read without paddle.

    Layout, little-endian: uint32 version (0); uint64 LoD levels, each a uint64 byte count and that
    many bytes of offsets; uint32 tensor version (0); int32 size of a protobuf `TensorDesc`
    (field 1 varint data type, field 2 int64 dims, packed or not); then the elements, row-major.
    """
    path = Path(path)
    where = str(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read the tensor file ({e.strerror or e})", where=where, fix=_PADDLE_FIX) from None
    try:
        (version,) = struct.unpack_from("<I", data, 0)
        (levels,) = struct.unpack_from("<Q", data, 4)
        pos = 12
        for _ in range(levels):
            (size,) = struct.unpack_from("<Q", data, pos)
            pos += 8 + size
        tensor_version, desc_size = struct.unpack_from("<Ii", data, pos)
        pos += 8
    except struct.error:
        raise UserError("too short for a Paddle tensor file", where=where, fix=_PADDLE_FIX) from None
    if version != 0 or tensor_version != 0 or not 0 < desc_size < 4096:
        raise UserError(f"not a Paddle tensor file (versions {version}/{tensor_version}, descriptor {desc_size} bytes)",
                        where=where, fix=_PADDLE_FIX)
    dtype_code, dims = _tensor_desc(data[pos:pos + desc_size], where)
    pos += desc_size
    dtype = _PADDLE_DTYPES.get(dtype_code)
    if dtype is None or not dims:
        raise UserError(f"unsupported Paddle tensor (data type {dtype_code}, dims {dims})", where=where,
                        fix=_PADDLE_FIX)
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(data) - pos != expected:
        raise UserError(f"the tensor {dims} needs {expected:,} bytes of data, the file holds {len(data) - pos:,}",
                        where=where, fix=_PADDLE_FIX)
    return np.frombuffer(data, dtype=dtype, offset=pos).reshape(dims)


def _tensor_desc(desc: bytes, where: str) -> tuple[int, list[int]]:
    def varint(pos: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            if pos >= len(desc):
                raise UserError("damaged tensor descriptor", where=where, fix=_PADDLE_FIX)
            byte = desc[pos]
            value |= (byte & 0x7F) << shift
            pos, shift = pos + 1, shift + 7
            if not byte & 0x80:
                return value, pos

    pos, dtype_code, dims = 0, None, []
    while pos < len(desc):
        key, pos = varint(pos)
        field, wire = key >> 3, key & 7
        if field == 1 and wire == 0:
            dtype_code, pos = varint(pos)
        elif field == 2 and wire == 0:
            dim, pos = varint(pos)
            dims.append(dim)
        elif field == 2 and wire == 2:
            size, pos = varint(pos)
            end = pos + size
            while pos < end:
                dim, pos = varint(pos)
                dims.append(dim)
        else:
            raise UserError(f"unexpected field {field} in the tensor descriptor", where=where, fix=_PADDLE_FIX)
    if dtype_code is None:
        raise UserError("the tensor descriptor names no data type", where=where, fix=_PADDLE_FIX)
    return dtype_code, dims


def jieba_lac_folder() -> Path:
    """The lac_small/ folder of the installed jieba (Baidu's LAC-small model), found without
    importing jieba; whether it holds every file is for the caller to check."""
    spec = importlib.util.find_spec("jieba")
    if spec is None:
        raise UserError("jieba is not installed", fix="pip install jieba")
    locations = list(spec.submodule_search_locations or [])
    return (Path(locations[0]) if locations else Path(spec.origin).parent) / "lac_small"


def jieba_lac_files() -> tuple[Path, Path]:
    """(embedding tensor, character dictionary) of the LAC-small model inside the installed jieba."""
    folder = jieba_lac_folder()
    tensor, dictionary = folder / "model_baseline" / "word_emb", folder / "word.dic"
    for path in (tensor, dictionary):
        if not path.is_file():
            raise UserError("this jieba has no LAC-small model file", where=str(path),
                            fix="install jieba 0.42 or later (pip install --force-reinstall jieba)")
    return tensor, dictionary


def export_jieba(out_path: str | Path) -> dict:
    """Write the character embeddings of Baidu's LAC-small model (jieba's `paddle` mode) as
    word2vec text: one line per character of its `word.dic` (`id<TAB>char`); the pseudo-tokens OOV,
    OOV_NUM, OOV_ALPHA, OOV_ALNUM and OOV_HANZ and rows no character names are left out."""
    tensor_path, dict_path = jieba_lac_files()
    table = read_paddle_tensor(tensor_path)
    if table.ndim != 2:
        raise UserError(f"expected a 2-d embedding table, found shape {table.shape}", where=str(tensor_path))
    words, rows, skipped = [], [], []
    for number, line in enumerate(dict_path.read_text(encoding="utf-8").split("\n"), 1):
        if not line:
            continue
        row, _, word = line.partition("\t")
        if not row.isdigit() or not word or int(row) >= len(table):
            raise UserError(f"expected `id<TAB>character` with an id below {len(table)}, found {line!r}",
                            where=f"{dict_path}:{number}")
        if word.startswith("OOV") or _WHITESPACE.search(word):
            skipped.append(word)
            continue
        words.append(word)
        rows.append(int(row))
    write_word2vec_text(out_path, words, table[rows].astype(np.float32))
    return {"path": str(out_path), "source": str(tensor_path), "table": list(table.shape), "vectors": len(words),
            "dim": int(table.shape[1]), "skipped": skipped}
