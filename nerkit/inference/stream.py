"""Streaming prediction over text files (one text per line, or JSON lines whose objects hold the
texts: `input_field`) and the eval output file.

Input is read in chunks, so memory stays bounded whatever the file size, and records come out in
input order. Lines are split only at `\n` (a `\r\n` ending is dropped) and checked as they are
read, as `nerkit data` checks corpora: bytes that are not UTF-8, or a NUL byte, end the run with an
error naming the line. A leading UTF-8 byte-order mark is dropped: each record's `text` is its line
without the mark and the line ending, and offsets index that `text`. The input may be a file,
stdin, a pipe or a device (`/dev/stdin`, bash's `<(...)`); the output goes to stdout, where a reader
that stops early (`| head`) is a normal end, or atomically to a file. The chunks are predicted
here, or by worker processes (`nerkit.inference.workers`, `--workers N`), whose output is the same.
Ctrl-C or SIGTERM during `nerkit predict` (`predict_file`) leaves no temporary file and no worker.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import stat
import sys
import threading
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from nerkit.data.corpus import UNWRITABLE, is_jsonl
from nerkit.data.records import UNKNOWN_KEY, decode_utf8, nul_error, text_record
from nerkit.errors import CorpusError, UserError
from nerkit.files import WRITE_ERRNOS, atomic_file, check_output
from nerkit.inference.formats import FORMATS, output_frame, predict_chunk
from nerkit.inference.ranks import Ranks, check_ranked, predicted_by_ranks
from nerkit.inference.predictor import check_min_score
from nerkit.inference.windows import check_window
from nerkit.inference.workers import Workers, predictor
from nerkit.log import progress_display

log = logging.getLogger(__name__)

STDIN = "-"


_BOM = b"\xef\xbb\xbf"


# Bytes read at once: a NUL byte is caught within this many, so a binary file without line breaks
# (or /dev/zero) is refused without filling memory.
_PIECE = 1 << 20


_SOURCE_FIX = "pass a text file with one text per line, or - for stdin"


# The output formats that write a text on lines of their own, where a line break (or NUL) in a JSON
# string's text cannot go: the rule of character-per-line files (corpus.UNWRITABLE), inline's too.
_LINE_FORMATS = ("conll", "inline")


# Characters of input predicted (and written) at a time: enough for batches of similar lengths, few
# enough that a page of text is several chunks for the processes of `--workers` to share.
CHUNK_CHARS = 20_000


def check_paths(source: str, output: str | None) -> None:
    """Fail now, before a model loads, on an input that cannot be read or an output that cannot be
    written. It only looks: opening a named pipe to try it would take what its writer sends."""
    if source != STDIN:
        path = Path(source)
        if not path.exists():
            raise UserError("input file not found", where=source, fix=_SOURCE_FIX)
        if path.is_dir():
            raise UserError("is a directory, not a text file", where=source, fix=_SOURCE_FIX)
        if not os.access(path, os.R_OK):
            raise UserError("cannot read the input (permission denied)", where=source)
    if output is not None:
        check_output(output, *([source] if source != STDIN else []))


def _open_source(source: str) -> tuple[BinaryIO, int | None]:
    """The input as a byte stream, and its size when it is a regular file (for the progress bar)."""
    if source == STDIN:
        return sys.stdin.buffer, None
    try:
        stream = open(source, "rb")
    except OSError as e:
        raise UserError(f"cannot read the input ({e.strerror})", where=source, fix=_SOURCE_FIX) from None
    info = os.fstat(stream.fileno())
    return stream, info.st_size if stat.S_ISREG(info.st_mode) else None


def _read_line(stream: BinaryIO, where: str) -> bytes:
    """The next line with its `\n` (b"" at the end of the input), read a piece at a time."""
    pieces = []
    while True:
        piece = stream.readline(_PIECE)
        if b"\x00" in piece:
            raise nul_error(where)
        pieces.append(piece)
        if not piece or piece.endswith(b"\n"):
            return b"".join(pieces)


def _lines(stream: BinaryIO, name: str, first_line: int = 1, offset: int = 0) -> Iterator[tuple[str, int]]:
    """Each line of `stream` as text without its ending, and its size in bytes. A line that is not
    UTF-8 or holds a NUL byte is a CorpusError naming `name` and the line; a leading BOM is dropped.
    A stream read from the middle of a file starts on its line `first_line`, at byte `offset`."""
    for number in itertools.count(first_line):
        raw = _read_line(stream, f"{name}:{number}")
        if not raw:
            return
        line = raw[len(_BOM):] if number == 1 and raw.startswith(_BOM) else raw
        start = offset + len(raw) - len(line)
        line = line.removesuffix(b"\n").removesuffix(b"\r")
        yield decode_utf8(line, name, number, start), len(raw)
        offset += len(raw)


def input_field(source: str, field: str | None) -> str | None:
    """Where each input line's text is: None for plain text, else the key of a JSON object: `field`
    as given (`--field`), or "text" for a file named as JSON lines are (corpus.is_jsonl): its lines
    as plain text would be tagged JSON, never what was meant."""
    if field is None and source != STDIN and is_jsonl(source):
        return "text"
    return field


def _texts(lines: Iterable[tuple[str, int]], name: str, field: str | None,
           fmt: str, warn: bool = True) -> Iterator[tuple[str, dict | None, int]]:
    """Each text to tag, the other keys of its JSON object (None for a line of plain text), and its
    input bytes. With `field`, each line that is not blank is a JSON object holding its text at
    `field` (records.text_record); a blank line is none. The first object that holds "entities" (a
    gold corpus given to predict) is warned about, when `warn` (one process of several need not)."""
    if field is None:
        yield from ((text, None, size) for text, size in lines)
        return
    skipped = 0  # the bytes of blank lines, counted with the next text's
    for number, (line, size) in enumerate(lines, 1):
        if not line.strip():
            skipped += size
            continue
        where = f"{name}:{number}"
        text, keys = text_record(line, field, where)
        if warn and "entities" in keys:
            log.warning(f'{where}: the input holds "entities", which predict does not read: the output\'s are the '
                        "model's predictions, in their place in --format jsonl; to score the model against the "
                        f"input's, run `nerkit eval --model MODEL --data {name}`")
            warn = False
        if fmt in _LINE_FORMATS and UNWRITABLE.search(text):
            raise CorpusError(f"the text holds a line break or NUL, which --format {fmt} cannot write "
                              "(it writes a text on lines of its own)", where=where, fix="use --format jsonl")
        # a partial corpus's unknown regions said what its annotators left out; the output's entities
        # are the model's over the whole text, which a kept "unknown" would contradict when read back
        keys.pop(UNKNOWN_KEY, None)
        yield text, keys, size + skipped
        skipped = 0


def input_lines(stream: BinaryIO, name: str) -> Iterator[tuple[str, int]]:
    """Each line of an input stream as `nerkit predict` reads it (its text and its size in bytes),
    checked as it is read: what `input_chunks` takes, for a reader of the input beside
    `predict_stream` (nerkit.inference.shards plans its shards with them)."""
    return _lines(stream, name)


@dataclass(frozen=True)
class Part:
    """A run of whole chunks of an input file, as `predict_stream` reads it from the start: `chunks`
    of them from byte `offset`, where line `line` starts (a shard: nerkit.inference.shards). Chunks
    start afresh after each other, so the part's are those of the whole file; `size`: its bytes."""

    offset: int
    line: int
    chunks: int
    size: int


def input_chunks(lines: Iterable[tuple[str, int]], name: str, field: str | None, fmt: str,
                 chunk_chars: int = CHUNK_CHARS, warn: bool = True) -> Iterator[tuple[list[str], int, list[dict] | None]]:
    """The chunks `predict_stream` predicts, from `input_lines`: the same whoever reads them."""
    return _chunks(_texts(lines, name, field, fmt, warn), chunk_chars)


def _chunks(texts: Iterable[tuple[str, dict | None, int]],
            chunk_chars: int) -> Iterator[tuple[list[str], int, list[dict] | None]]:
    """The texts of about `chunk_chars` characters of input at a time, how many input bytes they
    cover and their JSON objects' other keys (None for plain text). One process or several
    (`nerkit.inference.workers`), the chunks are the same."""
    chunk: list[str] = []
    keys: list[dict | None] = []
    size = chars = 0
    for text, other, text_size in texts:
        chunk.append(text)
        keys.append(other)
        size += text_size
        chars += len(text)
        if chars >= chunk_chars:
            yield chunk, size, (None if other is None else keys)
            chunk, keys, size, chars = [], [], 0, 0
    if chunk:
        yield chunk, size, (None if keys[0] is None else keys)


def _predicted(pipe, chunks: Iterable[tuple[list[str], int, list[dict] | None]], fmt: str, batch_size: int,
               window: int | None, min_score: float | None = None) -> Iterator[tuple[bytes, int, int]]:
    """Each chunk's output in input order, with how many records and input bytes it holds: predicted
    here by a Pipeline, by the threads of an ONNX export with lanes (`_in_threads`), or by the
    processes of a `Workers`."""
    if isinstance(pipe, Workers):
        yield from pipe.predict_chunks(chunks, fmt, batch_size, window, min_score)
        return
    if getattr(pipe, "lanes", 1) > 1:
        yield from _in_threads(pipe, chunks, fmt, batch_size, window, min_score)
        return
    for texts, size, keys in chunks:
        yield predict_chunk(pipe, texts, fmt, batch_size, window, keys, min_score), len(texts), size


def _in_threads(pipe, chunks: Iterable[tuple[list[str], int, list[dict] | None]], fmt: str, batch_size: int,
                window: int | None, min_score: float | None = None) -> Iterator[tuple[bytes, int, int]]:
    """`_predicted` on `pipe.lanes` threads: while one chunk's batches are in ONNX Runtime (which
    lets go of Python's lock), another chunk is featurised or written out. At most two chunks per
    thread are out at once, and they come back in input order; an error reading the input comes
    after the chunks read before it, as with one thread."""
    from concurrent.futures import ThreadPoolExecutor

    source = iter(chunks)
    out: deque = deque()  # (future, records, size), in input order
    failure: BaseException | None = None
    with ThreadPoolExecutor(pipe.lanes, thread_name_prefix="nerkit-chunk") as pool:
        try:
            while True:
                while failure is None and len(out) < 2 * pipe.lanes:
                    try:
                        texts, size, keys = next(source)
                    except StopIteration:
                        break
                    except Exception as e:  # an invalid input line: after the chunks before it
                        failure = e
                        break
                    out.append((pool.submit(predict_chunk, pipe, texts, fmt, batch_size, window, keys, min_score),
                                len(texts), size))
                if not out:
                    break
                future, records, size = out.popleft()
                yield future.result(), records, size
        finally:
            for future, _, _ in out:  # the reader stopped early, or a chunk failed: drop what is queued
                future.cancel()
    if failure is not None:
        raise failure


@contextmanager
def _sink(output: str | None) -> Iterator[BinaryIO]:
    """Where the records go: `output` through an atomic write (nothing there until the end), or stdout."""
    if output is None:
        with open(sys.stdout.fileno(), "wb", closefd=False) as f:
            yield f
    else:
        with atomic_file(output) as f:
            yield f


def _silence_stdout() -> None:
    """After a reader closed stdout's pipe, point stdout at /dev/null so that no later flush fails
    (Python's advice in the `signal` module's documentation on SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


@contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """SIGTERM (`kill`, a batch scheduler or a service manager stopping the job) inside the block
    ends it as Ctrl-C does: the cleanups run (an output's temporary file is removed, the worker
    processes end) and the process exits with 143, the shell's code for SIGTERM. A second SIGTERM
    while they run is ignored (SIGKILL is not)."""
    if threading.current_thread() is not threading.main_thread():  # signals reach only the main thread
        yield
        return
    received = []

    def handler(signum, frame):
        if not received:
            received.append(signum)
            raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def predict_file(model: str | Path, source: str, output: str | None, fmt: str = "jsonl", batch_size: int = 64,
                 device: str = "cpu", threads: int = 0, workers: int = 1, window: int | None = None,
                 document: bool = False, field: str | None = None, min_score: float | None = None) -> int:
    """`nerkit predict`: the paths checked before the model loads (a wrong one costs no wait), then
    `predict_stream` with the model in this process or in `workers` processes. SIGTERM ends it as
    Ctrl-C does (`sigterm_as_exit`). With `document` (a model with memory), the lines are read in
    order as one stream, in this process. `field` and `min_score`: `predict_stream`'s. Returns the
    number of records written."""
    check_paths(source, output)
    ranks = Ranks.from_env()  # torchrun's processes, on this machine or several
    if document and (workers > 1 or ranks is not None):
        raise UserError("--document reads the input as one stream, in order: one process reads it",
                        fix="drop --workers (or run without torchrun)")
    if ranks is not None:
        check_ranked(source, output)
        workers = 1  # a rank is one process; add ranks rather than workers
    with sigterm_as_exit(), predictor(model, device, threads, workers, window) as pipe:
        if document:
            pipe = pipe.document_stream()
        if ranks is None:
            return predict_stream(pipe, source, output, fmt, batch_size, window=window, field=field,
                                  min_score=min_score)
        ranks.start()
        try:
            return predict_stream(pipe, source, output, fmt, batch_size, window=window, ranks=ranks, field=field,
                                  min_score=min_score)
        finally:
            ranks.stop()


def predict_stream(pipe, source: str, output: str | None, fmt: str = "jsonl", batch_size: int = 64,
                   chunk_chars: int = CHUNK_CHARS, progress: bool | None = None, window: int | None = None,
                   ranks: Ranks | None = None, field: str | None = None, min_score: float | None = None,
                   part: Part | None = None) -> int:
    """Predict every line of `source` (a path, or '-' for stdin) into `output` (a path, or stdout)
    with `pipe`: a Pipeline, or `nerkit.inference.workers.Workers` (processes that each hold one; the output
    is the same). `window`: the prediction window (None: the model's, `Pipeline.window`). With
    `ranks` (torchrun), each rank predicts its share of the chunks and rank 0 alone writes them, in
    input order (nerkit.inference.ranks). `field`: the key of each line's JSON object that holds its
    text (`input_field`: "text" for a .jsonl or .json file; None: plain text); the object's other
    keys are kept in its output record. `min_score`: None for entities without scores, else each
    entity is scored and those below it are left out (0: none). With `part`, only that run of chunks
    of the input file is read, predicted and written, in the format's frame. Returns the number of
    records written."""
    if fmt not in FORMATS:
        raise UserError(f"unknown output format {fmt!r}", fix=f"use one of {', '.join(FORMATS)}")
    if batch_size < 1:
        raise UserError(f"the batch size must be at least 1, not {batch_size}")
    if window is not None:
        check_window(window)
    check_min_score(min_score)
    check_paths(source, output)
    field = input_field(source, field)
    name = "<stdin>" if source == STDIN else source
    stream, total = _open_source(source)
    lines = input_lines(stream, name)
    if part is not None:
        stream.seek(part.offset)
        lines, total = _lines(stream, name, part.line, part.offset), part.size
    if progress is None and source == STDIN and sys.stderr.isatty():
        progress = False  # someone may be typing the input: no bar under it
    bar = progress_display("predict", total, "B", unit_scale=True, shown=progress)
    written = 0
    try:
        if ranks is not None and not ranks.main:  # its chunks go to rank 0, which writes (and warns)
            chunks = _chunks(_texts(_lines(stream, name), name, field, fmt, warn=False), chunk_chars)
            for _ in predicted_by_ranks(pipe, chunks, fmt, batch_size, window, ranks, min_score):
                pass
            return 0
        with _sink(output) as sink:
            # html's page and label-studio's JSON array: their start, the records as they come, their end
            start, separator, end = (part.encode("utf-8") for part in output_frame(fmt))
            sink.write(start)
            chunks = input_chunks(lines, name, field, fmt, chunk_chars)
            if part is not None:
                chunks = itertools.islice(chunks, part.chunks)
            produced = (_predicted(pipe, chunks, fmt, batch_size, window, min_score) if ranks is None
                        else predicted_by_ranks(pipe, chunks, fmt, batch_size, window, ranks, min_score))
            for data, records, size in produced:
                if written and separator:  # a chunk holds its records' separators, not the one before it
                    sink.write(separator)
                sink.write(data)
                written += records
                bar.set_postfix(lines=f"{written:,}")
                bar.update(size)
            sink.write(end)
    except BrokenPipeError:
        if output is not None:
            raise
        _silence_stdout()  # `nerkit predict ... | head`: the reader has what it wanted
    except OSError as e:
        if e.errno not in WRITE_ERRNOS:
            raise
        raise UserError(f"cannot write the output ({e.strerror})", where=output or "stdout",
                        fix="free space or fix permissions there") from None
    finally:
        bar.close()
        if source != STDIN:
            stream.close()
    return written
