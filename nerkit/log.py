"""Diagnostics go through `logging` (the `nerkit` logger and its children); results go to stdout.
The command line and the benchmark worker show them on stderr as plain lines; a library user
configures logging as for any other package."""

from __future__ import annotations

import logging
import os
import sys
import time


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


# ------------------------------------------------------------------------------------ progress

# Seconds between two progress lines when stderr is not a terminal (a log file under nohup, a pipe,
# a batch scheduler's capture): what Hugging Face's Trainer does with its periodic log lines.
PROGRESS_SECONDS_ENV = "NERKIT_PROGRESS_SECONDS"
PROGRESS_SECONDS = 30.0


def progress_display(desc: str, total: int | None, unit: str, initial: int = 0, shown: bool | None = None,
             unit_scale: bool = False):
    """The one progress display of every long step (training epochs, `lm adapt`, `predict`, LM
    features): with `shown` None, tqdm's bar when stderr is a terminal, else `ProgressLines`; True
    draws the bar anywhere, False shows nothing. Both have tqdm's `update`, `set_postfix`, `close`."""
    from tqdm import tqdm

    if shown is None and not sys.stderr.isatty():
        return ProgressLines(desc, total, unit, initial, unit_scale, progress_seconds())
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, unit_scale=unit_scale, leave=False,
                file=sys.stderr, dynamic_ncols=True, disable=shown is False)


def progress_seconds() -> float:
    """NERKIT_PROGRESS_SECONDS, else PROGRESS_SECONDS; 0 writes a line at every update."""
    from nerkit.errors import UserError

    value = os.environ.get(PROGRESS_SECONDS_ENV, "")
    if not value:
        return PROGRESS_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:  # also NaN
        raise UserError(f"{PROGRESS_SECONDS_ENV} must be a number of seconds, not {value!r}",
                        fix=f"set it to 0 or more (default {PROGRESS_SECONDS:.0f}), or unset it")
    return seconds


class ProgressLines:
    """Progress as a line through logging (`nerkit.progress`, INFO) every `seconds`, for a stderr
    that is not a terminal, where a bar's carriage returns would fill a log file with one endless
    line, and no bar at all leaves a long run silent: "predict: 1.2MB/4.8MB (25%), 41.0kB/s,
    lines 12,000, eta 01:28"."""

    def __init__(self, desc: str, total: int | None, unit: str, initial: int, unit_scale: bool, seconds: float):
        self.desc, self.total, self.unit, self.unit_scale, self.seconds = desc, total, unit, unit_scale, seconds
        self.n = self.initial = initial
        self.postfix: dict[str, object] = {}
        self.started = self.last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.seconds:
            self.last = now
            logging.getLogger("nerkit.progress").info(self.line(now - self.started))

    def set_postfix(self, **postfix: object) -> None:
        self.postfix = postfix

    def close(self) -> None:
        pass

    def line(self, elapsed: float) -> str:
        from tqdm import tqdm

        def amount(n: float) -> str:
            return tqdm.format_sizeof(n, self.unit) if self.unit_scale else f"{n:,.0f}"

        rate = (self.n - self.initial) / max(elapsed, 1e-9)
        done = amount(self.n) if self.total is None else f"{amount(self.n)}/{amount(self.total)}"
        if not self.unit_scale:
            done += f" {self.unit}{'es' if self.unit.endswith(('ch', 's')) else 's'}"
        if self.total is not None:
            done += f" ({100 * self.n / max(self.total, 1):.0f}%)"
        parts = [done, f"{amount(rate)}/s" if self.unit_scale else f"{rate:,.1f} {self.unit}/s"]
        parts += [f"{key} {value}" for key, value in self.postfix.items()]
        if self.total is not None and rate > 0:
            parts.append(f"eta {tqdm.format_interval(max(self.total - self.n, 0) / rate)}")
        return f"{self.desc}: {', '.join(parts)}"
