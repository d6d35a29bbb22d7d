"""Prediction over several processes (`nerkit predict --workers N`): each worker process loads the
model once and predicts the chunks of input that the main process reads and sends it; their output
comes back, and is written, in input order.

The main process reads and checks the input (an invalid line is its error, as with one process) and
keeps at most two chunks per worker out at once, sent or finished but waiting for an earlier one,
so memory stays bounded whatever the input's size. A worker that dies ends the run with an error
instead of a wait, and the workers end with the block that started them (Ctrl-C included).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import threading
from collections import deque
from contextlib import contextmanager
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Iterable, Iterator

from nerkit.errors import UserError, killed_by

log = logging.getLogger(__name__)

# Chunks out at once per worker: one it predicts, one sent or done while the main process writes.
CHUNKS_PER_WORKER = 2


@contextmanager
def predictor(model: str | Path, device: str = "cpu", threads: int = 0, workers: int = 1, window: int | None = None):
    """The model ready for `predict.predict_stream`: loaded in this process for one worker (no
    subprocess), else `Workers` that each hold a copy and end with the block. `threads`: torch
    threads in all (0: one per core), shared out among the workers. `window`, the prediction window
    the run will use (None: the model's), is checked against the model once it loads."""
    if workers < 1:
        raise UserError(f"--workers must be at least 1, not {workers}", fix="use 1 to predict in this process")
    if workers == 1:
        from nerkit.inference.loading import load_pipeline

        pipe = load_pipeline(model, device, threads)  # an ONNX export runs without torch
        pipe.check_window(window)
        yield pipe
        return
    with Workers(model, workers, device, threads, window) as pool:
        yield pool


def threads_per_worker(threads: int, workers: int) -> int:
    """torch threads of each worker: `threads` in all (0: one per core the process may use), shared
    out evenly, at least one each."""
    if threads < 0:
        raise UserError(f"--threads must not be negative, not {threads}", fix="use 0 for one per core, or N >= 1")
    if not threads:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, threads // workers)


class WorkerLost(Exception):
    """Worker `index` ended, or closed its connection, before its chunk came back."""

    def __init__(self, index: int):
        super().__init__(f"worker {index} ended")
        self.index = index


def in_order(tasks: Iterator[bytes], conns: list[Connection], window: int,
             sentinels: list[int] = ()) -> Iterator[bytes]:
    """Send each task to an idle worker's connection and yield the replies in task order.

    At most `window` tasks are out at once (sent, and their reply not yet yielded), however long
    one of them takes, and a task is drawn from `tasks` only when it can be sent. An error that
    drawing a task raises (a bad input line) comes after the replies of the tasks drawn before it,
    as it would with one process. A worker whose connection closes, or whose sentinel (in the
    order of `conns`) becomes ready, raises WorkerLost: a dead worker never leaves a wait behind.
    """
    idle = deque(conns)
    busy: dict[Connection, int] = {}  # a busy worker's connection -> the number of its task
    done: dict[int, bytes] = {}  # replies that wait for an earlier one
    sent = yielded = 0
    more, reader_error = True, None
    while more or sent > yielded:
        while more and idle and sent - yielded < window:
            try:
                task = next(tasks)
            except StopIteration:
                more = False
            except Exception as e:  # noqa: BLE001 - raised below, after the replies before it
                more, reader_error = False, e
            else:
                conn = idle.popleft()
                try:
                    conn.send_bytes(task)
                except OSError:  # the worker is gone (a BrokenPipeError here is not stdout's)
                    raise WorkerLost(conns.index(conn)) from None
                busy[conn] = sent
                sent += 1
        if busy:
            for ready in wait([*busy, *sentinels]):
                if ready not in busy:
                    raise WorkerLost(list(sentinels).index(ready))
                try:
                    done[busy.pop(ready)] = ready.recv_bytes()
                except (EOFError, OSError):
                    raise WorkerLost(conns.index(ready)) from None
                idle.append(ready)
        while yielded in done:
            yield done.pop(yielded)
            yielded += 1
    if reader_error is not None:
        raise reader_error


class Workers:
    """`count` processes that each hold the model of `model` (a directory), started by `with`
    and ended when the block ends, however it ends. `predict_chunks` is what `predict_stream`
    calls; `threads` (0: one per core) are shared out among the processes; `window`, the prediction
    window the run will use, is checked by each once it has loaded the model (a window the model
    cannot read is a UserError before any input is read). They are spawned (a new interpreter
    each), so a script that uses them starts them under `if __name__ == "__main__":`."""

    def __init__(self, model: str | Path, count: int, device: str = "cpu", threads: int = 0,
                 window: int | None = None):
        self.model, self.count, self.device, self.window = str(model), count, device, window
        self.threads = threads_per_worker(threads, count)
        self.processes: list[multiprocessing.Process] = []
        self.conns: list[Connection] = []
        self.worker_threads: list[int] = []  # the torch threads each process runs with, as it says once loaded

    def __enter__(self) -> "Workers":
        try:
            self._start()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def _start(self) -> None:
        """Start the processes and wait until each has loaded the model; a model it cannot load is
        its UserError, raised here, before any input is read."""
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of this one's threads
        level = logging.getLogger("nerkit").getEffectiveLevel()
        with _sigint_ignored():  # inherited: Ctrl-C is this process's to handle, by ending the workers
            for number in range(1, self.count + 1):
                ours, theirs = context.Pipe()
                process = context.Process(target=serve, args=(theirs, self.model, self.device, self.threads, level,
                                                              self.window),
                                          name=f"nerkit-predict-{number}", daemon=True)
                process.start()
                theirs.close()
                self.processes.append(process)
                self.conns.append(ours)
        waiting = dict(enumerate(self.conns))
        threads = [0] * self.count
        sentinels = [p.sentinel for p in self.processes]
        while waiting:
            for ready in wait([*waiting.values(), *sentinels]):
                index = sentinels.index(ready) if ready in sentinels else self.conns.index(ready)
                try:
                    status = json.loads(self.conns[index].recv_bytes())
                except (EOFError, OSError):
                    raise self._lost(index, "while loading the model") from None
                if status["error"]:
                    raise UserError(status["error"])
                threads[index] = status["threads"]
                waiting.pop(index, None)
        self.worker_threads = threads
        log.debug(f"{self.count} prediction workers, torch threads each: {', '.join(map(str, threads))}")

    def _stop(self) -> None:
        for conn in self.conns:
            conn.close()  # an idle worker sees the end of its input and returns
        for process in self.processes:
            if process.is_alive():
                process.terminate()  # a busy one (an error or Ctrl-C ended the run) is stopped
        for process in self.processes:
            process.join(10)
            if process.is_alive():  # not even SIGTERM ended it
                process.kill()
                process.join()

    def predict_chunks(self, chunks: Iterable[tuple[list[str], int, list[dict] | None]], fmt: str, batch_size: int,
                       window: int | None = None, min_score: float | None = None) -> Iterator[tuple[bytes, int, int]]:
        """`predict.predict_chunk` of each chunk of texts, done by the workers, in input order, with
        the chunk's number of records and its input bytes (the second item of each chunk)."""
        shapes: deque[tuple[int, int]] = deque()  # (records, input bytes) of the chunks sent

        def tasks() -> Iterator[bytes]:
            for texts, size, keys in chunks:
                shapes.append((len(texts), size))
                task = {"format": fmt, "batch_size": batch_size, "window": window, "texts": texts, "keys": keys,
                        "min_score": min_score}
                yield json.dumps(task, ensure_ascii=False).encode("utf-8")

        sentinels = [p.sentinel for p in self.processes]
        try:
            for data in in_order(tasks(), self.conns, CHUNKS_PER_WORKER * self.count, sentinels):
                records, size = shapes.popleft()
                yield data, records, size
        except WorkerLost as lost:
            raise self._lost(lost.index, "while predicting") from None

    def _lost(self, index: int, doing: str) -> UserError:
        """The error for worker `index`, which ended (or closed its pipe) unasked."""
        process = self.processes[index]
        process.join(5)
        code = process.exitcode
        fix = "run again, or with --workers 1 to predict in one process"
        if code is None:
            how = "stopped answering"
        elif code < 0:
            how = f"was {killed_by(code)}"
            if code == -signal.SIGKILL:
                fix = "run again, with fewer --workers if memory is short"
        else:
            how = f"ended with exit code {code}" + (" (its error is above)" if code else "")
        return UserError(f"prediction worker {index + 1} of {self.count} {how} {doing}", fix=fix)


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored inside the block: a process spawned there keeps ignoring it (a new Python keeps
    an ignored SIGINT ignored), so Ctrl-C at a terminal, which reaches every process of the group,
    is handled by the main process alone."""
    if threading.current_thread() is not threading.main_thread():  # signals reach only the main thread
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def serve(conn: Connection, model: str, device: str, threads: int, log_level: int, window: int | None = None) -> None:
    """A worker process: load the model, say whether that worked (and whether it reads `window`),
    then answer each chunk of texts with its records until the main process closes the connection."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # started from another thread, it was not ignored yet
    os.dup2(2, 1)  # stdout is the main process's output: anything printed here goes to stderr
    from nerkit.log import configure_logging

    configure_logging(log_level)
    from nerkit.inference.formats import predict_chunk
    from nerkit.inference.loading import load_pipeline

    try:
        pipe = load_pipeline(model, device, threads)  # threads >= 1 (threads_per_worker); an ONNX export: no torch
        pipe.check_window(window)
    except UserError as e:
        _send_quietly(conn, json.dumps({"error": str(e)}).encode("utf-8"))  # another worker's error may have closed it
        return
    if not _send_quietly(conn, json.dumps({"error": None, "threads": threads}).encode("utf-8")):
        return
    while True:
        try:
            task = json.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the main process is done, or gone
            return
        data = predict_chunk(pipe, task["texts"], task["format"], task["batch_size"], task["window"], task["keys"],
                             task["min_score"])
        if not _send_quietly(conn, data):
            return


def _send_quietly(conn: Connection, data: bytes) -> bool:
    """Send `data`; False when the main process has closed the connection (it stopped on another
    worker's error, or is gone): nothing to report, and no traceback from a worker that ends."""
    try:
        conn.send_bytes(data)
    except OSError:  # BrokenPipeError, ConnectionResetError
        return False
    return True
