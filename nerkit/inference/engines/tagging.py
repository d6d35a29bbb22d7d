"""What every engine adapter shares: `TextTagger`, a model directory loaded once per process (a Ray
actor, a Python worker of Spark, a Dask worker) that tags a batch of texts into the entities `nerkit
predict` writes for them (the same spans, offsets, texts and scores, the same function computing
them), and `file_rows`, a text file's lines as rows, read as `nerkit predict` reads them.

A row that cannot be tagged is reported on the row (`error`), in the words `nerkit predict` uses for
that line, and the batch goes on: in an engine one bad line of millions should cost one row, not the
job. `NERKIT_ENGINE_TEST_CRASH` exists for the tests of the engines' retries (see `_crash_for_test`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Iterable, NamedTuple

from nerkit.data.records import decode_utf8, nul_error, text_record
from nerkit.errors import UserError
from nerkit.inference.formats import predicted_spans
from nerkit.inference.predictor import check_min_score

# The models this process has loaded, by (directory, device, threads): an engine may build its
# callable once per batch or per partition, but the model is loaded once per process.
_LOADED: dict[tuple[str, str, int], object] = {}
_LOADING = threading.Lock()  # a Dask worker with several threads runs tasks side by side

# "N:PATH": the N-th batch (or a later one) that a process tags makes it exit at once with
# CRASH_EXIT_CODE, if it can create PATH first; so one process of the run dies, once, in the middle of
# its work, and the engine's retry must finish the job without losing or repeating a row.
CRASH_VARIABLE = "NERKIT_ENGINE_TEST_CRASH"
CRASH_EXIT_CODE = 70

_BOM = b"\xef\xbb\xbf"


class Tagged(NamedTuple):
    """A batch's results, a row each: its entities (None where the row had an error) and its error."""
    entities: list[list[dict] | None]
    errors: list[str | None]


def load_once(model: str | Path, device: str = "cpu", threads: int = 1):
    """The pipeline of `model` in this process, loaded the first time it is asked for."""
    from nerkit.inference.loading import load_pipeline

    key = (str(Path(model).resolve()), device, threads)
    with _LOADING:
        if key not in _LOADED:
            _LOADED[key] = load_pipeline(model, device, threads)  # an ONNX export runs without torch
        return _LOADED[key]


def loaded_models() -> int:
    """How many models this process has loaded (what a test asks a worker)."""
    return len(_LOADED)


class TextTagger:
    """Tags batches of texts with the model directory `model` (a `nerkit train` directory or an ONNX
    export), loaded once per process when first needed, as `nerkit predict` would: `scores` and
    `min_score` as its --scores and --min-score, `window` and `batch_size` as its options; `threads`:
    the torch threads (an export: batches read at once) of this process, one by default since an
    engine runs a process per core. It holds only these settings, so an engine can ship it to its
    workers; nothing is loaded on the driver."""

    def __init__(self, model: str | Path, *, scores: bool = False, min_score: float | None = None,
                 window: int | None = None, batch_size: int = 64, threads: int = 1, device: str = "cpu"):
        check_min_score(min_score)
        if batch_size < 1 or threads < 1:
            raise UserError(f"batch_size and threads must be at least 1, not {batch_size} and {threads}")
        self.model, self.device, self.threads = str(model), device, threads
        self.window, self.batch_size = window, batch_size
        self.min_score = min_score if min_score is not None else 0.0 if scores else None

    def load(self):
        """The model, loaded now if this process has not loaded it yet (an actor's constructor calls it,
        so that loading is start-up, not the first batch's time); its window checked."""
        pipe = load_once(self.model, self.device, self.threads)
        pipe.check_window(self.window)
        return pipe

    def tag(self, texts: Iterable) -> Tagged:
        """Each text's entities as `nerkit predict --format jsonl` writes them (`{"start", "end",
        "type", "text"}`, and "score" when scored); a row that is not a string (a missing value, a
        JSON record without the field) gets None and an error instead."""
        texts = list(texts)
        _crash_for_test()
        entities: list[list[dict] | None] = [None] * len(texts)
        errors: list[str | None] = [None] * len(texts)
        good = [i for i, text in enumerate(texts) if isinstance(text, str)]
        for i in set(range(len(texts))) - set(good):
            errors[i] = f"no text to tag: the row holds {_shown(texts[i])}"
        if good:
            spans = predicted_spans(self.load(), [texts[i] for i in good], self.batch_size, self.window,
                                    self.min_score)
            for i, found in zip(good, spans):
                entities[i] = [span.to_dict(texts[i]) for span in found]
        return Tagged(entities, errors)


def _shown(value) -> str:
    """A value that is not a text, as an error names it."""
    try:
        missing = value is None or bool(value != value)  # None, or NaN
    except TypeError:  # pandas' NA, which is neither equal nor unequal to itself
        missing = True
    if missing:
        return "no value"
    return f"a {type(value).__name__}, not a string"


def _crash_for_test() -> None:
    """Under CRASH_VARIABLE ("N:PATH"), end this process abruptly (as the out-of-memory killer or a
    lost machine would) at its N-th batch or later, if PATH can be created: it can be once."""
    setting = os.environ.get(CRASH_VARIABLE)
    if not setting:
        return
    after, _, marker = setting.partition(":")
    _crash_for_test.batches = getattr(_crash_for_test, "batches", 0) + 1
    if _crash_for_test.batches < int(after):
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os._exit(CRASH_EXIT_CODE)


# ----------------------------------------------------------------------------------- reading text files

ROW_KEYS = ("path", "line", "text", "error")


def file_rows(data: bytes, path: str, field: str | None = None) -> list[dict]:
    """The lines of a text file (`data`, its bytes; `path`, its name) as rows `{"path", "line",
    "text", "error"}`, read as `nerkit predict` reads them: split at `\\n` (a `\\r` before it
    dropped), a leading byte-order mark dropped, every line a text; with `field`, each line a JSON
    object whose text is at `field` (a blank line is no row). A line `nerkit predict` would refuse
    (not UTF-8, a NUL byte, not such an object) is a row without text whose error is predict's
    message for it (FILE:LINE: what, and how to fix it)."""
    rows = []
    offset = 0
    lines = data.split(b"\n")
    if data.endswith(b"\n") or not data:
        lines.pop()  # after the last line end there is no line
    for number, raw in enumerate(lines, 1):
        line = raw[len(_BOM):] if number == 1 and raw.startswith(_BOM) else raw
        start = offset + len(raw) - len(line)
        offset += len(raw) + 1
        line = line.removesuffix(b"\r")
        where = f"{path}:{number}"
        try:
            if b"\x00" in line:
                raise nul_error(where)
            text = decode_utf8(line, path, number, start)
            if field is not None:
                if not text.strip():
                    continue
                text, _ = text_record(text, field, where)
        except UserError as e:
            rows.append({"path": path, "line": number, "text": None, "error": str(e)})
            continue
        rows.append({"path": path, "line": number, "text": text, "error": None})
    return rows
