"""Where and how torch runs: the device a config or an option names, and torch's thread count.

OpenMP's wait policy and the default thread count are chosen in nerkit/cores.py, when nerkit is
imported, because the policy must be set before torch loads.
"""

from __future__ import annotations

import torch

from nerkit.config import DEVICES
from nerkit.cores import default_threads
from nerkit.errors import UserError


def set_threads(threads: int) -> None:
    """torch's intra-op threads for this process; 0: the cores nerkit found free when it started
    (nerkit/cores.py), or OMP_NUM_THREADS when that is set."""
    if threads < 0:
        raise UserError(f"--threads must not be negative, not {threads}", fix="use 0 for the free cores, or N >= 1")
    threads = threads or default_threads()
    if threads:
        torch.set_num_threads(threads)


def resolve_device(name: str, option: str = "--device") -> torch.device:
    """`auto` is the GPU when torch sees one, else the CPU. `option` names where the choice came from,
    for the message when it cannot be honoured."""
    setting = f"--set {option}=" if "." in option else f"{option} "  # a config key, or a command's option
    if name not in DEVICES:
        raise UserError(f"{option} {name!r} is not one of {', '.join(DEVICES)}", fix=f"use {setting}cpu, cuda or auto")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError(f"{option} is cuda but torch sees no GPU", fix=f"use {setting}cpu or {setting}auto")
    return torch.device(name)
