"""Resumable checkpoints: everything a training run needs to continue exactly where it stopped (model,
best model so far, optimiser, schedule, random state, `Progress` and, inside an epoch of document
streams, the memory their next segments read), as safetensors + JSON in OUT/checkpoint, written
as one atomic directory. Never pickle. A run of several processes keeps
each rank's random state too, so that its resume on as many processes is exact."""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes
from torch import nn

from nerkit.errors import UserError
from nerkit.files import CHECKPOINT, atomic_directory, recover_directory
from nerkit.weights import load_checked


@dataclass
class Progress:
    """Where a run stands: everything besides tensors that a checkpoint must restore."""

    epoch: int = 1  # the epoch in progress
    batch: int = 0  # batches of this epoch already done (the sampler position)
    step: int = 0
    best_f1: float = -1.0
    best_epoch: int = 0
    bad_epochs: int = 0
    epoch_loss: float = 0.0
    epoch_chars: int = 0
    epoch_seconds: float = 0.0
    epoch_distill_loss: float = 0.0  # `nerkit distill`: the part of epoch_loss from unlabelled batches
    epoch_distill_batches: int = 0
    train_chars: int = 0
    train_seconds: float = 0.0
    steady_chars: int = 0  # after the first WARMUP_BATCHES of a session: allocator and caches settled
    steady_seconds: float = 0.0
    elapsed: float = 0.0  # wall seconds of earlier sessions of this run
    epochs_logged: int = 0  # lines of metrics.jsonl that belong to this state
    stopped: str = ""  # why the run ends (epochs, early_stopping, max_steps, time_budget); "" while it goes on
    cut_dev_f1: float = -1.0  # dev F1 of the model where a limit cut the epoch short (-1: none)
    checksums: dict = field(default_factory=dict)
    world_size: int = 1  # the processes the run trains with (nerkit.training.distributed)


def _rng_state() -> tuple[dict, dict]:
    np_state = np.random.get_state()
    tensors = {"rng.torch": torch.get_rng_state(), "rng.numpy": torch.from_numpy(np_state[1].astype(np.int64))}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    meta = {"python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
            "numpy": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])]}
    return tensors, meta


def _set_rng_state(tensors: dict, meta: dict) -> None:
    version, internal, gauss = meta["python"]
    random.setstate((version, tuple(internal), gauss))
    name, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((name, tensors["rng.numpy"].numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["rng.torch"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def rank_rng_state(device: torch.device) -> torch.Tensor:
    """This process's torch random state as one uint8 tensor: the CPU generator's, then that of
    `device` when it is a GPU (what draws the dropout of a rank's batches)."""
    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return torch.cat(states)


def set_rank_rng_state(state: torch.Tensor) -> None:
    cpu = torch.get_rng_state()
    torch.set_rng_state(state[:len(cpu)])
    if len(state) > len(cpu) and torch.cuda.is_available():
        torch.cuda.set_rng_state(state[len(cpu):])  # the current device: the rank's own


def _unshared(tensors: dict) -> dict:
    """Tied weights (an MLM head's decoder is the embedding table) are one tensor under two names;
    safetensors stores each name's own copy."""
    seen = set()
    for name, tensor in tensors.items():
        if tensor.data_ptr() in seen:
            tensors[name] = tensor.clone()
        seen.add(tensor.data_ptr())
    return tensors


def save_checkpoint(out: Path, model: nn.Module, optimizer, scheduler, progress: Progress,
                    best_state: dict | None, rank_states: list[torch.Tensor] = (), memory: list | None = None) -> None:
    """Everything needed to continue exactly, in safetensors + JSON, written as one atomic directory.
    `rank_states`: `rank_rng_state()` of the ranks after the first in a run of several processes;
    `memory`: document streams' Transformer-XL memory, a (states, mask) per layer (`load_memory`)."""
    tensors = _unshared({f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()})
    if best_state is not None:
        tensors.update({f"best.{k}": v.detach().cpu().contiguous() for k, v in best_state.items()})
    opt = optimizer.state_dict()
    opt_meta = {}
    for idx, state in opt["state"].items():
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{idx}.{name}"] = value.detach().cpu().contiguous()
            else:
                opt_meta[f"{idx}.{name}"] = value
    rng_tensors, rng_meta = _rng_state()
    tensors.update(rng_tensors)
    tensors.update({f"rng.rank{rank}": state.cpu() for rank, state in enumerate(rank_states, start=1)})
    for layer, (states, mask) in enumerate(memory or ()):
        tensors[f"memory.{layer}.states"] = states.detach().cpu().contiguous()  # (B, M, d)
        tensors[f"memory.{layer}.mask"] = mask.cpu().contiguous()  # (B, M) bool
    meta = {"progress": asdict(progress), "optimizer": {"param_groups": opt["param_groups"], "other": opt_meta},
            "scheduler": scheduler.state_dict(), "rng": rng_meta}
    with atomic_directory(out / CHECKPOINT) as tmp:
        (tmp / "state.safetensors").write_bytes(safetensors_bytes(tensors))
        (tmp / "state.json").write_text(json.dumps(meta), encoding="utf-8")


# The checksums of a run's teachers' targets start with this (nerkit distill: one per teacher and text).
TEACHING_KEY = "distill_"


def check_same_teaching(out: Path, started_with: dict, now: dict) -> None:
    """A run started by `nerkit distill` goes on only under distillation, and a plain run only without:
    the other way would change what every later step learns from and the schedule's length."""
    taught = any(k.startswith(TEACHING_KEY) for k in started_with)
    teaching = any(k.startswith(TEACHING_KEY) for k in now)
    if taught and not teaching:
        raise UserError("this run was started by nerkit distill", where=str(out),
                        fix="resume it with its `nerkit distill ... --resume` command (the same teachers and text)")
    if teaching and not taught:
        raise UserError("this run was started without distillation", where=str(out),
                        fix="resume it with `nerkit train --resume`, or distil into a new --out")


def load_checkpoint(out: Path, model: nn.Module, optimizer, scheduler, checksums: dict,
                    rank: int = 0) -> tuple[Progress, dict | None]:
    """Restore the model, optimiser, scheduler and random state of the run in `out`; `checksums`:
    the data files' now, which must be the ones the run started with. `rank`: this process's in a
    run of several, which takes its own random state when the run had that rank (a rank beyond
    the run's `Progress.world_size` is left with rank 0's, for the caller to reseed)."""
    directory = out / CHECKPOINT
    recover_directory(directory)
    if not (directory / "state.json").is_file() or not (directory / "state.safetensors").is_file():
        raise UserError("no checkpoint to resume from", where=str(directory),
                        fix="a run writes its checkpoint at the first epoch end or train.checkpoint_every steps")
    try:
        meta = json.loads((directory / "state.json").read_text(encoding="utf-8"))
        tensors = load_file(str(directory / "state.safetensors"))
    except Exception as e:  # a damaged file: json or safetensors errors
        raise UserError(f"the checkpoint cannot be read ({e})", where=str(directory)) from None
    # Checked before the weights are loaded: other data builds other vocabularies, i.e. other shapes.
    started_with = meta["progress"].get("checksums", {})
    check_same_teaching(out, started_with, checksums)
    changed = [k for k, v in checksums.items() if started_with.get(k) not in (None, v)]
    if changed:
        raise UserError(f"the {', '.join(changed)} data changed since the run started", where=str(out),
                        fix="resume with the same data files, or start a new run")
    load_checked(model, {k[6:]: v for k, v in tensors.items() if k.startswith("model.")},
                 "the checkpoint does not fit the model this config builds", where=str(directory),
                 fix="resume with the config and data the run started with")
    best = {k[5:]: v for k, v in tensors.items() if k.startswith("best.")} or None
    state: dict = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = value
    for key, value in meta["optimizer"]["other"].items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["optimizer"]["param_groups"]})
    scheduler.load_state_dict(meta["scheduler"])
    _set_rng_state(tensors, meta["rng"])
    if f"rng.rank{rank}" in tensors:
        set_rank_rng_state(tensors[f"rng.rank{rank}"])
    return Progress(**meta["progress"]), best


def load_memory(out: Path, device: torch.device | str = "cpu") -> list | None:
    """The memory `save_checkpoint` stored in the checkpoint of the run in `out` (read after
    `load_checkpoint`), on `device`: a (states, mask) per layer, or None when it has none."""
    from safetensors import safe_open

    with safe_open(str(out / CHECKPOINT / "state.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        layers = sum(1 for key in keys if key.startswith("memory.") and key.endswith(".states"))
        return [(f.get_tensor(f"memory.{k}.states").to(device), f.get_tensor(f"memory.{k}.mask").to(device))
                for k in range(layers)] or None
