"""One training job at a time, later requests coalesced: while a job runs, every request that comes
waits as one next job (the latest request's, which reads the annotations as they are when it
starts, so nothing an earlier request asked for is lost). Nothing here knows about Label Studio or
models: `run(request)` is the job, called on the queue's own thread."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)


class CoalescingQueue:
    """Runs `run(request)` for submitted requests on one thread, one at a time; the requests that
    come while one runs become a single next job (the last of them). `finished(request, error)`
    is called after each job (`error` None when `run` returned)."""

    def __init__(self, run: Callable[[Any], None], finished: Callable[[Any, BaseException | None], None] | None = None):
        self.run = run
        self.finished = finished
        self._cond = threading.Condition()
        self._next: Any = None
        self._has_next = False
        self.running: Any = None
        self.coalesced = 0  # requests folded into the next job beyond its own
        self.jobs = 0  # jobs run
        self._stopping = False
        self._thread: threading.Thread | None = None

    def submit(self, request: Any) -> str:
        """Queue `request`: "started" (nothing was running), "queued" (the next job) or "coalesced"
        (a next job was waiting already: this request replaces it, and it runs once)."""
        with self._cond:
            if self._stopping:
                raise RuntimeError("the queue is stopping")
            state = "coalesced" if self._has_next else "queued" if self.running is not None else "started"
            if self._has_next:
                self.coalesced += 1
            self._next, self._has_next = request, True
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="nerkit-training", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            return state

    @property
    def busy(self) -> bool:
        with self._cond:
            return self.running is not None or self._has_next

    @property
    def waiting(self) -> bool:
        """Whether a next job waits."""
        with self._cond:
            return self._has_next

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._has_next and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                request, self._next, self._has_next = self._next, None, False
                self.running = request
            error = None
            try:
                self.run(request)
            except BaseException as e:  # noqa: BLE001 - reported through `finished`, the loop goes on
                error = e
                log.debug("training job failed", exc_info=True)
            if self.finished is not None:  # before the queue is idle: its waiters see what the job changed
                try:
                    self.finished(request, error)
                except Exception:  # noqa: BLE001 - the next job must still run
                    log.exception("reporting a training job failed")
            with self._cond:
                self.running = None
                self.jobs += 1
                self._cond.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no job runs or waits (True), or `timeout` seconds pass (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.running is None and not self._has_next, timeout)

    def stop(self, timeout: float | None = None) -> None:
        """Run no further job (the one running is the caller's to end) and end the thread."""
        with self._cond:
            self._stopping = True
            self._next, self._has_next = None, False
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
