"""How nerkit uses the CPU's cores, decided once when nerkit is imported (before torch, whose OpenMP
reads its wait policy only then): whether OpenMP's threads spin while they wait, and how many torch
threads a process takes by default.

Spinning (OMP_WAIT_POLICY=ACTIVE) made a BiLSTM step 1.5x faster on a machine of its own, and cut
two runs side by side to a quarter of one run's work (docs/notebook/speed.md, "Shared cores"):
neither fixed policy is right for everyone. So nerkit looks: it samples how busy the cores are for a
few tens of milliseconds, spins only when no other process is using them, and otherwise waits
passively and takes the cores left free. What it cannot see is a process that starts after it. An
explicit OMP_WAIT_POLICY, OMP_NUM_THREADS or `train.threads` / `--threads` always wins.
"""

from __future__ import annotations

import os
import time

SAMPLE_SECONDS = 0.05
BUSY = 0.5  # cores kept busy by other processes from which nerkit stops spinning
FREE_CORES = "NERKIT_FREE_CORES"  # the cores found free, for child processes and `default_threads`


def busy_cores(seconds: float = SAMPLE_SECONDS, stat: str = "/proc/stat") -> float | None:
    """How many cores other processes keep busy, from the kernel's CPU counters over `seconds` (this
    process sleeps meanwhile, so what runs is someone else); None where there are no such counters."""
    def sample() -> tuple[int, int]:
        with open(stat, encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]), idle  # user nice system idle iowait irq softirq steal

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    elapsed = total1 - total0
    if elapsed <= 0:
        return None
    return (elapsed - (idle1 - idle0)) / elapsed * (os.cpu_count() or 1)


def choose(environ: dict, busy: float | None, cores: int) -> dict[str, str]:
    """The variables to set: OMP_WAIT_POLICY (ACTIVE when the cores are free, PASSIVE when others use
    them or nothing can be measured) and NERKIT_FREE_CORES; a value already in `environ` is kept."""
    if busy is None:
        policy, free = "PASSIVE", cores
    else:
        policy = "ACTIVE" if busy < BUSY else "PASSIVE"
        free = max(1, min(cores, round(cores - busy)))
    chosen = {"OMP_WAIT_POLICY": policy, FREE_CORES: str(free)}
    return {k: v for k, v in chosen.items() if k not in environ}


def configure(environ=os.environ) -> None:
    """Decide once per process tree: a child process (a worker, a torchrun rank) inherits the parent's
    decision through the environment instead of measuring its siblings."""
    if "OMP_WAIT_POLICY" in environ and FREE_CORES in environ:
        return
    busy = None if "OMP_WAIT_POLICY" in environ else busy_cores()
    environ.update(choose(environ, busy, os.cpu_count() or 1))


def default_threads() -> int:
    """torch threads when the user sets none: the cores found free at start (all when no measure)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return 0  # torch reads it itself
    try:
        return max(1, int(os.environ.get(FREE_CORES, "0")))
    except ValueError:
        return 0


def runtime_threads() -> int:
    """Threads for a runtime that does not read OMP_NUM_THREADS itself (ONNX Runtime): its first
    number when it is one, else the cores found free at start (all when none were measured)."""
    for name in ("OMP_NUM_THREADS", FREE_CORES):
        try:
            return max(1, int(os.environ.get(name, "").split(",")[0]))
        except ValueError:  # unset, or not a number (OpenMP ignores it too)
            continue
    return os.cpu_count() or 1
