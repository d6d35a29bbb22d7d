"""How a nerkit process ends once its command is done: without the interpreter's teardown.

With torch loaded, Python's exit (finalising thousands of modules and torch's objects) took
0.3-0.5 s after a command's last line (docs/notebook/speed.md, session 43): 2-3% of a short
training run's wall time. `end_process` does what that exit does for the user first (logging's
handlers flushed and closed, the `atexit` functions, stdout and stderr flushed) and then ends the
process at once. Only an entry point calls it (`python -m nerkit`, the `nerkit` script, the
benchmark's worker): `nerkit.cli.app.main`, which the tests call in-process, still raises
SystemExit.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import sys
import threading


def end_process(code: int | str | None) -> None:
    """Exit with `code` as `sys.exit(code)` would. The interpreter's own exit where its teardown
    still matters: a code that is a message (printed by it), another non-daemon thread still
    running (it waits for them), a profiler or tracer on (`python -m cProfile`, coverage: they
    write their results after the program returns), or stdout or stderr that cannot be flushed (a
    closed pipe: it reports it as before)."""
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    watched = sys.getprofile() is not None or sys.gettrace() is not None
    if not (code is None or isinstance(code, int)) or others or watched:
        sys.exit(code)
    logging.shutdown()
    atexit._run_exitfuncs()  # runs them once and clears them (the interpreter's exit would find none)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code or 0)


def stop_child(process: subprocess.Popen, seconds: float) -> None:
    """End a child process as a person would: SIGTERM (it drains, saves and exits), then SIGKILL if
    it has not ended `seconds` later; nothing if it has already ended."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
