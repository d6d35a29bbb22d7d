"""User-facing errors: anything a user can fix (a file, a config key, a corpus line).

The CLI turns a `UserError` into a one-line message and exit code 2, and an `Interrupted` (training
stopped by a signal after its checkpoint) into its message and the signal's exit code; everything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class UserError(Exception):
    """An error the user can fix. `where` is `FILE` or `FILE:LINE`; `fix` says what to do."""

    def __init__(self, message: str, where: str | None = None, fix: str | None = None):
        self.message = message
        self.where = where
        self.fix = fix
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.fix:
            text += f"; {self.fix}"
        return text

    def lines(self) -> list[str]:
        """What the CLI prints, each line after `nerkit: error: `."""
        return [str(self)]


class ManyErrors(UserError):
    """Several errors of one file reported at once (`nerkit data validate`): the first few, and
    `total`, how many there are in all. The CLI prints each, then the count."""

    def __init__(self, errors: list[UserError], total: int, where: str | None = None):
        self.errors, self.total = errors, total
        listed = f", the first {len(errors)} listed" if total > len(errors) else ""
        super().__init__(f"{total} errors{listed}", where=where)

    def lines(self) -> list[str]:
        return [str(e) for e in self.errors] + [str(self)]


class CorpusError(UserError):
    """A malformed corpus file, always with `FILE:LINE`."""


class ConfigError(UserError):
    """A bad config file, key or value."""


class ModelDirError(UserError):
    """A model directory that is missing, incomplete, of another format version, or unsafe."""


class Interrupted(Exception):
    """Training (or a benchmark of trainings) stopped by SIGINT or SIGTERM after a checkpoint was
    written. Its message (rank 0's alone; the other ranks' is empty) says how to go on; `exit_code`
    is the shell's for the signal (130 for SIGINT, 143 for SIGTERM; 130 on a rank that only followed
    the others). The CLI prints the message and exits with that code."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.exit_code = 128 + int(signum)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C, and `kill` or a batch scheduler's preemption


@contextmanager
def stop_signals_handled(handler):
    """`handler(signum, frame)` for the STOP_SIGNALS while the block runs, the handlers before it
    back after. Signals reach only the main thread: anywhere else it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before if before is not None else signal.SIG_DFL)


class JobError(Exception):
    """A distributed training job that lost one of its processes (killed, crashed, or silent for
    longer than `train.dist_timeout`). Not the user's mistake: the CLI prints it as one line and
    exits 1 (a UserError exits 2)."""


def killed_by(returncode: int) -> str:
    """How a child process that a signal ended (`returncode` < 0) ended: "killed by SIGTERM", and
    for SIGKILL, most often the kernel's out-of-memory killer, "killed by SIGKILL (out of memory?)"."""
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"killed by {name}" + (" (out of memory?)" if returncode == -signal.SIGKILL else "")


def did_you_mean(word: str, choices) -> str | None:
    """"did you mean 'x'?" for the choice closest to a mistyped `word`, or None when none is close."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.5)
    return f"did you mean {close[0]!r}?" if close else None
