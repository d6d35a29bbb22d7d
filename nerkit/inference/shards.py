"""Shards of one input that can be predicted anywhere and rerun (`nerkit predict --shard I/N`), and
their join (`nerkit shards join`): the unit of work that a cluster engine, a batch scheduler's array
job or a shell loop hands out, with nerkit never an engine itself.

Shard I of N (1-based, as coreutils' `split -n l/K/N` counts) is a run of whole chunks of the input
as `nerkit predict` reads it (nerkit.inference.stream: about 20,000 characters of whole lines each),
the chunks shared out as evenly as they divide: shard boundaries fall at chunk boundaries, so each
shard predicts exactly the batches that one `nerkit predict` process would, and the shards joined are
its output byte for byte. Planning reads the whole input once (checking every line as predict does,
and taking its sha256), so every shard of a bad input fails alike, before its model loads.

A shard writes OUTPUT and, once OUTPUT is complete, OUTPUT.shard.json: what it was made from (the
input's checksum, the model's, the options that change the records, nerkit's version), which lines
and chunks it holds, and the output's own checksum. A rerun writes the same bytes to both. The join
checks the manifests against one another and each output against its manifest before it writes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import stat
import sys
from bisect import bisect_left
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import BinaryIO, Iterator

from nerkit.errors import UserError
from nerkit.files import atomic_file, atomic_write_text, check_output
from nerkit.inference.formats import output_frame
from nerkit.inference.model_dir import CRF_FILE, LEXICON_FILE, MODEL_FILES, ONNX_MODEL_FILES, ModelDir
from nerkit.inference.ranks import Ranks
from nerkit.inference.stream import (
    CHUNK_CHARS,
    STDIN,
    check_paths,
    input_chunks,
    input_field,
    input_lines,
    Part,
    predict_stream,
    sigterm_as_exit,
)
from nerkit.inference.workers import predictor
from nerkit.version import __version__

log = logging.getLogger(__name__)

# A shard's manifest is its output's name with this added.
MANIFEST_SUFFIX = ".shard.json"

# The manifest's layout; a join refuses manifests of another.
MANIFEST_VERSION = 1

# Bytes read at once when hashing or copying a file.
_BLOCK = 1 << 20


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`, 1-based."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> "Shard":
        """`I/N` as `--shard` takes it: 1 <= I <= N."""
        index, slash, count = text.partition("/")
        if slash and index.strip().isdigit() and count.strip().isdigit():
            shard = cls(int(index), int(count))
            if 1 <= shard.index <= shard.count:
                return shard
        raise UserError(f"--shard takes I/N with 1 <= I <= N (shard I of N), not {text!r}",
                        fix="e.g. --shard 1/8 ... --shard 8/8")

    def chunk_range(self, chunks: int) -> tuple[int, int]:
        """The chunks [first, end) of an input of `chunks` that this shard predicts: shard i of n
        takes chunks floor((i-1)c/n) to floor(ic/n), so the shards differ by one chunk at most."""
        return (self.index - 1) * chunks // self.count, self.index * chunks // self.count

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass
class Plan:
    """The input as `nerkit predict` reads it into chunks: its checksum, size and lines, and for each
    chunk its last line, the byte offset after that line and its records (the last chunk's line and
    offset: the input's last line and its size, blank lines of JSON lines included)."""

    sha256: str
    size: int
    lines: int
    chunk_ends: list[int]
    chunk_offsets: list[int]
    chunk_records: list[int]

    def part(self, first: int, end: int) -> Part:
        """Chunks [first, end) as a `Part` that `predict_stream` reads."""
        offset = self.chunk_offsets[first - 1] if first else 0
        stop = self.chunk_offsets[end - 1] if end > first else offset
        return Part(offset, self.chunk_ends[first - 1] + 1 if first else 1, end - first, stop - offset)

    def line_range(self, first: int, end: int) -> tuple[int, int]:
        """The input lines (first, last) of chunks [first, end); (k, k - 1) for none."""
        line = self.chunk_ends[first - 1] + 1 if first else 1
        return line, self.chunk_ends[end - 1] if end > first else line - 1


class _Hashing:
    """A binary stream's `readline`, its bytes added to a sha256 as they are read."""

    def __init__(self, stream: BinaryIO):
        self.stream, self.hash, self.size = stream, hashlib.sha256(), 0

    def readline(self, limit: int = -1) -> bytes:
        data = self.stream.readline(limit)
        self.hash.update(data)
        self.size += len(data)
        return data


def plan(source: str, field: str | None, fmt: str, chunk_chars: int = CHUNK_CHARS) -> Plan:
    """Read `source` (a file) once into the chunks `predict_stream` would make, every line checked
    as it checks them (an invalid one is its CorpusError, naming the line). Plain text is read a
    block at a time (`_plain_plan`); JSON lines, or a file with a line to refuse, as predict reads it."""
    with open(source, "rb") as stream:
        found = _plain_plan(stream, chunk_chars) if field is None else None
        if found is None:
            stream.seek(0)
            found = _line_plan(stream, source, field, fmt, chunk_chars)
    return found


def _line_plan(stream: BinaryIO, source: str, field: str | None, fmt: str, chunk_chars: int) -> Plan:
    """`plan` through predict's own reader, a line at a time: the reference that `_plain_plan` equals."""
    ends, offsets, records = [], [], []
    read = offset = 0

    def counted(lines: Iterator[tuple[str, int]]) -> Iterator[tuple[str, int]]:
        nonlocal read, offset
        for text, size in lines:
            read += 1
            offset += size
            yield text, size

    digest = _Hashing(stream)
    for texts, _, _ in input_chunks(counted(input_lines(digest, source)), source, field, fmt, chunk_chars,
                                    warn=False):
        ends.append(read)  # a chunk is yielded right after its last text's line is read
        offsets.append(offset)
        records.append(len(texts))
    if ends:  # the lines after the last text (blank ones of JSON lines) belong to the last chunk
        ends[-1], offsets[-1] = read, offset
    return Plan(digest.hash.hexdigest(), digest.size, read, ends, offsets, records)


def _plain_plan(stream: BinaryIO, chunk_chars: int) -> Plan | None:
    """`_line_plan` of plain text, a block of whole lines at a time (several times as fast: each
    shard plans the whole input); None at a NUL byte or bytes that are not UTF-8, whose error
    `_line_plan` then gives with its line. Each line counts its characters without the line end
    (a `\r` before the `\n` too) and without the byte-order mark of the first line."""
    digest = hashlib.sha256()
    ends, offsets, records = [], [], []
    lines = offset = 0  # whole lines counted so far, and the byte offset where the next block of them starts
    chars = count = 0  # the chunk being gathered: its characters and lines
    carry = b""  # a line begun in one block and ended in the next
    first = True
    while True:
        block = stream.read(_BLOCK)
        digest.update(block)
        data = carry + block
        if block:
            cut = data.rfind(b"\n") + 1
            data, carry = data[:cut], data[cut:]
        if not data:
            if block:
                continue
            break
        if b"\0" in data:
            return None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        pieces = text.split("\n")
        if text.endswith("\n"):
            pieces.pop()  # the empty piece after the last line end is no line
        sizes = list(map(len, pieces))  # each line's characters with its "\r": where it lies in `text`
        lengths = sizes if "\r" not in text else [n - p.endswith("\r") for n, p in zip(sizes, pieces)]
        if first and pieces and pieces[0].startswith("\ufeff"):
            lengths = [lengths[0] - 1, *lengths[1:]]
        first = False
        # gathered[i]: the gathering chunk's characters after the block's first i lines; placed[i] + i:
        # where the i-th line's end lies in `text` (its line ends counted). A chunk ends at its first
        # line that reaches chunk_chars (as stream._chunks ends one), found by bisection.
        gathered = list(accumulate(lengths, initial=chars))
        placed = list(accumulate(sizes, initial=0))
        base, floor, done = 0, 0, 0  # the chunk's first line in the block, its characters before it, `text` counted
        while (end := bisect_left(gathered, floor + chunk_chars, base + 1)) <= len(pieces):
            offset += len(text[done:placed[end] + end].encode("utf-8"))
            done = placed[end] + end
            ends.append(lines + end)
            offsets.append(offset)
            records.append(count + end - base)
            base, floor, count = end, gathered[end], 0
        count += len(pieces) - base
        chars = gathered[-1] - floor
        lines += len(pieces)
        offset += len(text[done:].encode("utf-8"))
        if not block:
            break
    if count:
        ends.append(lines)
        offsets.append(offset)
        records.append(count)
    if ends:
        ends[-1], offsets[-1] = lines, offset
    return Plan(digest.hexdigest(), offset, lines, ends, offsets, records)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def model_identity(directory: str | Path) -> dict:
    """What makes a model directory's predictions: a sha256 over the files that `nerkit predict`
    reads (nerkit.json, config, vocabulary, weights or graph, lexicon, CRF scores, a language
    model's files), by name and content, so that a copy elsewhere has the same; its runtime and the
    nerkit version that wrote it."""
    found = ModelDir.read(directory)
    base = found.path
    names = [*(ONNX_MODEL_FILES if found.is_export else MODEL_FILES), LEXICON_FILE, CRF_FILE]
    files = [base / name for name in names if (base / name).is_file()]
    if (base / "lm").is_dir():
        files += sorted(p for p in (base / "lm").rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.relative_to(base).as_posix()}\0{file_sha256(path)}\n".encode("utf-8"))
    return {"sha256": digest.hexdigest(), "runtime": found.runtime, "nerkit_version": found.meta.get("nerkit_version")}


def manifest_path(output: str | Path) -> Path:
    return Path(f"{output}{MANIFEST_SUFFIX}")


def _check_shard_paths(source: str, output: str | None) -> None:
    """A shard reads its input twice (the plan, then its own chunks) and writes a file and its manifest."""
    if source == STDIN:
        raise UserError("--shard reads the input twice (to plan the shards, then its own): it needs a file, not stdin",
                        fix="pass the input file's path")
    check_paths(source, output)
    if not stat.S_ISREG(os.stat(source).st_mode):
        raise UserError("--shard reads the input twice (to plan the shards, then its own): it needs a regular file",
                        where=source, fix="write the stream to a file first")
    if output is None:
        raise UserError("--shard writes its own output file and a manifest beside it", fix="pass --output FILE")
    check_output(manifest_path(output), source)
    if Ranks.from_env() is not None:
        raise UserError("--shard is one process's share of the input; torchrun's ranks share it out themselves",
                        fix="run the shards as separate commands (or drop --shard under torchrun)")


def predict_shard(model: str | Path, source: str, output: str | None, shard: str | Shard, fmt: str = "jsonl",
                  batch_size: int = 64, device: str = "cpu", threads: int = 0, workers: int = 1,
                  window: int | None = None, field: str | None = None, min_score: float | None = None,
                  document: bool = False) -> dict:
    """`nerkit predict --shard I/N`: shard I of N of `source` (a file) into `output`, then its
    manifest beside it; the other arguments are `predict_file`'s (`document` is refused: a document
    is read in order, as one stream). Returns the manifest."""
    shard = shard if isinstance(shard, Shard) else Shard.parse(shard)
    if document:
        raise UserError("--document reads the input in order, as one stream: it cannot be cut into shards",
                        fix="drop --shard or --document")
    _check_shard_paths(source, output)
    field = input_field(source, field)
    before = os.stat(source)
    found = plan(source, field, fmt)
    first, end = shard.chunk_range(len(found.chunk_ends))
    first_line, last_line = found.line_range(first, end)
    manifest = manifest_path(output)
    with sigterm_as_exit(), predictor(model, device, threads, workers, window) as pipe:
        model_info = model_identity(model)  # once it loaded: a directory it could not load is its error
        manifest.unlink(missing_ok=True)  # an older manifest must not vouch for the output written next
        written = predict_stream(pipe, source, output, fmt, batch_size, window=window, field=field,
                                 min_score=min_score, part=found.part(first, end))
    after = os.stat(source)
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        Path(output).unlink(missing_ok=True)
        raise UserError("the input changed while its shard was predicted, so the shards would not fit together",
                        where=source, fix="predict the shards again once the file is final")
    record = {
        "nerkit_shard": MANIFEST_VERSION,
        "shard": str(shard), "index": shard.index, "count": shard.count,
        "input": {"path": source, "sha256": found.sha256, "bytes": found.size, "lines": found.lines},
        "lines": {"first": first_line, "last": last_line, "count": last_line - first_line + 1},
        "records": written,
        "chunks": {"first": first, "end": end, "of": len(found.chunk_ends), "chars": CHUNK_CHARS},
        "model": {"path": str(model), **model_info},
        "options": {"format": fmt, "field": field, "window": window, "min_score": min_score,
                    "batch_size": batch_size},
        "nerkit_version": __version__,
        "output": {"path": str(output), "sha256": file_sha256(Path(output)), "bytes": os.path.getsize(output)},
    }
    atomic_write_text(manifest, json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    lines = f"lines {first_line:,}-{last_line:,}" if written else "no lines (fewer chunks than shards)"
    log.info(f"shard {shard}: {lines} of {found.lines:,}, {written:,} records in {output} (manifest {manifest})")
    return record


# ----------------------------------------------------------------------------------------- join


# What every shard of one input must agree on (manifest keys), and how a difference is named.
_SAME = (("input", "sha256", "input file"), ("model", "sha256", "model"), ("options", None, "options"),
         ("chunks", "of", "chunking"), ("chunks", "chars", "chunking"), ("nerkit_version", None, "nerkit version"))


def _read_manifest(part: str) -> tuple[Path, Path, dict]:
    """(output, manifest, its content) for a shard named by its output or its manifest."""
    if part.endswith(MANIFEST_SUFFIX):
        output, manifest = Path(part[:-len(MANIFEST_SUFFIX)]), Path(part)
    else:
        output, manifest = Path(part), manifest_path(part)
    rerun = "predict its shard again (nerkit predict ... --shard I/N --output FILE)"
    if not output.is_file():
        raise UserError("shard output not found", where=str(output), fix=rerun)
    if not manifest.is_file():
        raise UserError(f"no manifest beside this shard output ({manifest.name}): it was not written by "
                        "`nerkit predict --shard`, or its run did not finish", where=str(output), fix=rerun)
    try:
        content = json.loads(manifest.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError("not a shard manifest (invalid JSON)", where=str(manifest), fix=rerun) from None
    if not isinstance(content, dict) or content.get("nerkit_shard") != MANIFEST_VERSION:
        raise UserError(f"not a shard manifest of this nerkit (nerkit_shard: {MANIFEST_VERSION})", where=str(manifest),
                        fix=rerun)
    return output, manifest, content


def _value(content: dict, key: str, sub: str | None):
    value = content.get(key)
    return value.get(sub) if sub is not None and isinstance(value, dict) else value


def rerun_command(content: dict, index: int) -> str:
    """The command that predicts shard `index` of the shards `content` (a manifest) belongs to."""
    options = content["options"]
    words = ["nerkit", "predict", "--model", content["model"]["path"], content["input"]["path"],
             "--shard", f"{index}/{content['count']}", "--format", options["format"], "--output", "FILE"]
    if options.get("window") is not None:
        words += ["--window", str(options["window"])]
    score = options.get("min_score")
    words += ["--no-scores"] if score is None else ["--scores"] if score == 0 else ["--min-score", str(score)]
    if options.get("field") is not None:
        words += ["--field", options["field"]]
    if options.get("batch_size") not in (None, 64):
        words += ["--batch-size", str(options["batch_size"])]
    return shlex.join(words)


def check_shards(parts: list[str]) -> list[tuple[Path, dict]]:
    """The shards `parts` name (outputs or manifests), in shard order, once their manifests agree
    and every shard of 1..N is there exactly once; else the UserError that names the first problem."""
    if not parts:
        raise UserError("no shards to join", fix="pass every shard's output: nerkit shards join parts/*.jsonl")
    found = [_read_manifest(part) for part in parts]
    _, first_manifest, reference = found[0]
    for _, manifest, content in found[1:]:
        for key, sub, what in _SAME:
            if _value(content, key, sub) != _value(reference, key, sub):
                raise UserError(f"shard {content.get('shard')} was predicted with another {what} than "
                                f"{first_manifest}: {json.dumps(_value(content, key, sub))} against "
                                f"{json.dumps(_value(reference, key, sub))}", where=str(manifest),
                                fix="predict it again as the others were, or join only shards of one run")
        if content.get("count") != reference.get("count"):
            raise UserError(f"shard {content.get('shard')} is one of {content.get('count')} shards, {first_manifest} "
                            f"one of {reference.get('count')}", where=str(manifest),
                            fix="join the shards of one split of the input")
    by_index: dict[int, tuple[Path, Path, dict]] = {}
    for output, manifest, content in found:
        index = content["index"]
        if index in by_index:
            raise UserError(f"shard {content['shard']} is given twice: {by_index[index][0]} and {output}",
                            where=str(output), fix="pass each shard once")
        by_index[index] = (output, manifest, content)
    count = reference["count"]
    missing = [i for i in range(1, count + 1) if i not in by_index]
    if missing:
        shown = ", ".join(f"{i}/{count}" for i in missing[:10]) + (" ..." if len(missing) > 10 else "")
        raise UserError(f"{len(missing)} of {count} shards missing: {shown}", where=reference["input"]["path"],
                        fix=f"predict them (`{rerun_command(reference, missing[0])}`) and join again")
    return [(by_index[i][0], by_index[i][2]) for i in range(1, count + 1)]


def join_shards(parts: list[str], output: str | None) -> dict:
    """`nerkit shards join`: the shards `parts` (every shard of one input, their outputs or manifests,
    in any order) written as one output, to `output` atomically or to stdout: what `nerkit predict`
    writes for the whole input. Each output is checked against its manifest's checksum as it is
    copied (a mismatch leaves `output` as it was). Returns a summary: shards, records, input."""
    shards = check_shards(parts)
    if output is not None:
        check_output(output, *(str(path) for path, _ in shards), *(str(manifest_path(path)) for path, _ in shards))
    fmt = shards[0][1]["options"]["format"]
    start, separator, end = (part.encode("utf-8") for part in output_frame(fmt))
    with (atomic_file(output) if output is not None else _stdout()) as sink:
        sink.write(start)
        wrote = False
        for path, content in shards:
            size = os.path.getsize(path)
            if size != content["output"]["bytes"] or size < len(start) + len(end):
                raise _changed(path)
            if content["records"] and wrote and separator:
                sink.write(separator)
            digest = _copy_body(path, sink, len(start), size - len(end))
            if digest != content["output"]["sha256"]:
                raise _changed(path)
            wrote = wrote or content["records"] > 0
        sink.write(end)
    records = sum(content["records"] for _, content in shards)
    log.info(f"joined {len(shards)} shards of {shards[0][1]['input']['path']}: {records:,} records"
             + (f" in {output}" if output else ""))
    return {"shards": len(shards), "records": records, "input": shards[0][1]["input"]}


def _changed(path: Path) -> UserError:
    return UserError("this shard output is not the one its manifest describes (changed, cut short, or from another "
                     "run)", where=str(path), fix="predict its shard again")


def _copy_body(path: Path, sink: BinaryIO, start: int, end: int) -> str:
    """Write bytes [start, end) of `path` to `sink`; the sha256 of the whole file."""
    digest = hashlib.sha256()
    position = 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
            a, b = max(start - position, 0), min(end - position, len(block))
            if a < b:
                sink.write(block[a:b])
            position += len(block)
    return digest.hexdigest()


@contextmanager
def _stdout() -> Iterator[BinaryIO]:
    """stdout's bytes, left open."""
    with open(sys.stdout.fileno(), "wb", closefd=False) as f:
        yield f
