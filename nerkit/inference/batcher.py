"""Micro-batching for `nerkit serve`: the texts of concurrent requests are gathered into one batch for
one model thread, so that the model runs on full batches and the event loop never waits on it.

A request is a job in a bounded queue. The model thread takes the jobs at the head of the queue that
fit in `max_batch_chars` characters (a job larger than that is a batch of its own; 0 makes every job
its own batch: no micro-batching), waiting at most `max_wait` seconds after the first of them
arrived for more to come. Jobs that queue while the model is busy make the next batch at once, so
batches grow with the load even with no wait at all (the default), and a lone request never waits.
A full queue refuses a job (`QueueFull`) instead of letting waits grow without end; `stop` answers
every job already queued before the thread ends. Nothing here knows about HTTP or about the model:
`predict` maps a list of texts to one result per text.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The queue holds `max_queue` jobs already (or the batcher is stopping): try again later."""


@dataclass
class Job:
    texts: list[str]
    chars: int
    arrived: float  # time.monotonic()
    future: Future = field(default_factory=Future)


class Batcher:
    """Gathers the texts of jobs submitted from any thread into batches for `predict`, which one
    model thread runs; each job's future gets its own texts' results, in order."""

    def __init__(self, predict: Callable[[list[str]], list], max_batch_chars: int = 8192,
                 max_wait: float = 0.0, max_queue: int = 64):
        if max_batch_chars < 0 or max_wait < 0 or max_queue < 1:
            raise ValueError(f"max_batch_chars {max_batch_chars} and max_wait {max_wait} must not be negative, "
                             f"max_queue {max_queue} must be at least 1")
        self.predict = predict
        self.max_batch_chars = max_batch_chars
        self.max_wait = max_wait
        self.max_queue = max_queue
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self._running = 0  # jobs of the batch the model is on
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.batches = 0  # batches run, and the texts in them (for /health and the benchmark)
        self.texts = 0

    # ------------------------------------------------------------------------------ any thread

    def start(self) -> "Batcher":
        # A daemon: a server forced to exit (a second Ctrl-C) skips `stop` and must not hang on it.
        self._thread = threading.Thread(target=self._run, name="nerkit-model", daemon=True)
        self._thread.start()
        return self

    def submit(self, texts: list[str]) -> Future:
        """Queue `texts` for the model; the future's result is their results, in order. Raises
        QueueFull when `max_queue` jobs wait already, or once `stop` was called."""
        job = Job(list(texts), sum(map(len, texts)), time.monotonic())
        with self._cond:
            if self._stopping:
                raise QueueFull("the server is stopping")
            if len(self._queue) >= self.max_queue:
                waiting = "1 request waits" if len(self._queue) == 1 else f"{len(self._queue)} requests wait"
                raise QueueFull(f"{waiting} for the model already (--max-queue {self.max_queue})")
            self._queue.append(job)
            self._cond.notify()
        return job.future

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new jobs, answer every queued one, and end the model thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def queued(self) -> int:
        """Jobs waiting for the model."""
        with self._cond:
            return len(self._queue)

    @property
    def in_flight(self) -> int:
        """Jobs waiting or being predicted."""
        with self._cond:
            return len(self._queue) + self._running

    # ------------------------------------------------------------------------------ the model thread

    def _fit(self) -> tuple[int, bool]:
        """How many jobs at the head of the queue make the next batch, and whether that batch is
        full (no job more would fit in it)."""
        if self.max_batch_chars == 0:
            return 1, True
        count, chars = 1, self._queue[0].chars
        while count < len(self._queue) and chars + self._queue[count].chars <= self.max_batch_chars:
            chars += self._queue[count].chars
            count += 1
        return count, count < len(self._queue) or chars >= self.max_batch_chars

    def _next_batch(self) -> list[Job] | None:
        """The jobs of the next batch, once it is full, its first job has waited `max_wait`, or the
        batcher is stopping; None when it is stopping and every job has been taken."""
        with self._cond:
            while True:
                if not self._queue:
                    if self._stopping:
                        return None
                    self._cond.wait()
                    continue
                count, full = self._fit()
                wait = self._queue[0].arrived + self.max_wait - time.monotonic()
                if not (full or wait <= 0 or self._stopping):
                    self._cond.wait(wait)
                    continue
                taken = [self._queue.popleft() for _ in range(count)]
                jobs = [job for job in taken if job.future.set_running_or_notify_cancel()]  # not cancelled
                if jobs:
                    self._running = len(jobs)
                    return jobs

    def _run(self) -> None:
        while (jobs := self._next_batch()) is not None:
            try:
                self._answer(jobs)
            finally:
                with self._cond:
                    self._running = 0

    def _answer(self, jobs: list[Job]) -> None:
        """Predict the jobs' texts as one batch and give each job its share. When the batch fails,
        each job is tried alone, so that one bad request fails only itself."""
        texts = [text for job in jobs for text in job.texts]
        try:
            results = self.predict(texts)
        except Exception as e:  # noqa: BLE001 - the job's request answers 500; the thread goes on
            if len(jobs) > 1:
                for job in jobs:
                    self._answer([job])
                return
            log.exception("prediction failed")
            jobs[0].future.set_exception(e)
            return
        self.batches += 1
        self.texts += len(texts)
        start = 0
        for job in jobs:
            job.future.set_result(results[start:start + len(job.texts)])
            start += len(job.texts)
