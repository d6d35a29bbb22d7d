"""Diagnostics go through `logging` (the `nerkit` logger and its children); results go to stdout.
The command line and the benchmark worker show them on stderr as plain lines; a library user
configures logging as for any other package."""

from __future__ import annotations

import logging
import sys


class _Stderr(logging.Handler):
    """Writes to whatever sys.stderr is when a record arrives (it may be replaced, as tests do)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - a closed or broken stderr must not end the program
            self.handleError(record)


def configure_logging(level: int = logging.INFO) -> None:
    """Show nerkit's messages at `level` and above on stderr, once (calling it again replaces it)."""
    logger = logging.getLogger("nerkit")
    for handler in [h for h in logger.handlers if isinstance(h, _Stderr)]:
        logger.removeHandler(handler)
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
