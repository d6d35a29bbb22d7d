"""Plain helpers of the engines' tests (fixtures are in conftest.py): the sample text, the crash of one
worker process (nerkit.inference.engines.tagging's CRASH_VARIABLE) and a deadline for a run."""

from __future__ import annotations

import random
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

from helpers import REPO

from nerkit.data.corpus import read_corpus

LINES = 4000  # of the sample text
FILES = 4  # it is cut into
CRASH_AT = 3  # the batch of a worker process at which the armed crash happens


def sample_lines(count: int, seed: int = 0) -> list[str]:
    """`count` texts made of data/sample's sentences, one or two to a line (about 30 characters each)."""
    sentences = [s.text for name in ("train", "dev", "test")
                 for s in read_corpus(REPO / "data" / "sample" / f"{name}.bio").sentences]
    rng = random.Random(seed)
    return [rng.choice(sentences) + (rng.choice(sentences) if rng.random() < 0.3 else "") for _ in range(count)]


def crash_setting(marker: Path) -> str:
    """CRASH_VARIABLE's value for `marker`."""
    return f"{CRASH_AT}:{marker}"


@contextmanager
def deadline(seconds: float):
    """Raise TimeoutError in the test if the block runs longer than `seconds`: an engine that hangs
    (a scheduler waiting for resources it will never have) fails the test instead of the suite."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum, frame):
        raise TimeoutError(f"the engine did not finish within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def assert_tagged_as_predict(rows: list[dict], entities: list[list[dict]]) -> None:
    """`rows` ({path, line, entities, error} each, from the sample's files in any order) hold every
    line once, none lost or repeated, and each line's entities are `nerkit predict`'s, scores and all."""
    keys = [(Path(row["path"]).name, row["line"]) for row in rows]  # Spark's paths are file: URLs
    assert len(set(keys)) == len(keys) == len(entities), (len(set(keys)), len(keys), len(entities))
    ordered = [row for _, row in sorted(zip(keys, rows), key=lambda pair: pair[0])]
    assert [row["error"] for row in ordered] == [None] * len(entities)
    assert [row["entities"] for row in ordered] == entities


@contextmanager
def one_crash(marker: Path, who: str):
    """The crash of one worker process (`who`, for the message) armed for the block: the marker taken
    away, which the crash puts back; the block must have crashed one, and the marker is back after it
    whatever happened."""
    marker.unlink()
    try:
        yield
    finally:
        crashed = marker.exists()
        marker.touch()
    assert crashed, f"no {who} crashed"
