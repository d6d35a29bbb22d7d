"""Streaming prediction over text files (one text per line) and the eval output file.

Input is read in chunks, so memory stays bounded whatever the file size, and records come out in
input order. Lines are split only at `\n` (a `\r\n` ending is dropped); bytes that are not UTF-8
pass through unchanged (surrogate-escaped), so output line N always belongs to input line N.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import BinaryIO, Iterator

from nerkit.corpus import Sentence, Span, spans_to_tags
from nerkit.errors import UserError

FORMATS = ("jsonl", "conll", "inline")


def _lines(stream: BinaryIO) -> Iterator[tuple[str, int]]:
    for raw in stream:
        size = len(raw)
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        yield raw.decode("utf-8", errors="surrogateescape"), size


def format_record(text: str, spans: list[Span], fmt: str, scheme: str = "bio") -> str:
    if fmt == "jsonl":
        ents = [{"start": s.start, "end": s.end, "type": s.type, "text": text[s.start:s.end]} for s in spans]
        return json.dumps({"text": text, "entities": ents}, ensure_ascii=False) + "\n"
    if fmt == "inline":
        out, pos = [], 0
        for s in spans:
            out.append(text[pos:s.start])
            out.append(f"[{text[s.start:s.end]}]{s.type}")
            pos = s.end
        out.append(text[pos:])
        return "".join(out) + "\n"
    tags = spans_to_tags(len(text), spans, scheme)
    return "".join(f"{c} {t}\n" for c, t in zip(text, tags)) + "\n"


def predict_stream(pipe, source: str, output: str | None, fmt: str = "jsonl", batch_size: int = 64,
                   chunk_chars: int = 200_000, progress: bool | None = None) -> int:
    """Predict every line of `source` (a path, or '-' for stdin) into `output` (a path, or stdout).
    Returns the number of records written."""
    if fmt not in FORMATS:
        raise UserError(f"unknown output format {fmt!r}", fix=f"use one of {', '.join(FORMATS)}")
    if source == "-":
        stream, total = sys.stdin.buffer, None
    else:
        path = Path(source)
        if not path.is_file():
            raise UserError("input file not found", where=source, fix="pass a text file with one text per line, or - for stdin")
        stream, total = open(path, "rb"), path.stat().st_size
    out_path = Path(output) if output else None
    tmp_path = out_path.with_name(f".{out_path.name}.tmp") if out_path else None
    sink = open(tmp_path, "w", encoding="utf-8", errors="surrogateescape", newline="\n") if out_path else \
        open(sys.stdout.fileno(), "w", encoding="utf-8", errors="surrogateescape", newline="\n", closefd=False)
    from tqdm import tqdm

    bar = tqdm(total=total, unit="B", unit_scale=True, desc="predict", file=sys.stderr, leave=False,
               disable=(source == "-" or not sys.stderr.isatty()) if progress is None else not progress)
    written = 0
    try:
        texts: list[str] = []
        pending_bytes = 0
        chars = 0

        def flush():
            nonlocal written
            spans = pipe.predict_tokens([list(t) for t in texts], batch_size)
            sink.write("".join(format_record(t, s, fmt, pipe.scheme) for t, s in zip(texts, spans)))
            written += len(texts)
            bar.update(pending_bytes)

        for text, size in _lines(stream):
            texts.append(text)
            pending_bytes += size
            chars += len(text)
            if chars >= chunk_chars:
                flush()
                texts, pending_bytes, chars = [], 0, 0
        if texts:
            flush()
        sink.flush()
        if out_path:
            os.fsync(sink.fileno())
    finally:
        bar.close()
        if source != "-":
            stream.close()
        sink.close()
    if out_path:
        os.replace(tmp_path, out_path)
    return written


def eval_output(sentences: list[Sentence], predicted: list[list[Span]], scheme: str) -> str:
    """`char gold predicted` lines with a blank line between sentences: conlleval's input."""
    lines = []
    for sent, spans in zip(sentences, predicted):
        gold = sent.tags
        pred = spans_to_tags(len(sent), spans, scheme)
        lines.extend(f"{c} {g} {p}\n" for c, g, p in zip(sent.tokens, gold, pred))
        lines.append("\n")
    return "".join(lines)
