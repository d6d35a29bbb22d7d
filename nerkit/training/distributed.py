"""Data-parallel training over the processes torchrun starts (RANK, LOCAL_RANK, WORLD_SIZE in their
environment): the process group, each rank's slice of a global batch, the agreements that keep
every rank at the same step (the loss, Ctrl-C, a time budget), and `nerkit train --nproc N`, which
starts torchrun on this machine. A run of one process goes through all of it unchanged.
"""

from __future__ import annotations

import datetime
import hashlib
import inspect
import json
import logging
import os
import signal
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nerkit.errors import JobError, UserError

log = logging.getLogger(__name__)

# Set by `nerkit train --nproc N` for the processes it starts: their resume command says --nproc N.
LAUNCHED_WITH = "NERKIT_NPROC"


@dataclass
class World:
    """This process's place among the ranks of a run (one rank, 0 of 1, without torchrun)."""

    rank: int = 0
    local_rank: int = 0  # on this machine: which GPU the rank takes
    size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where collectives run
    owns_group: bool = False  # whether `join` started the process group (and `leave` ends it)

    @classmethod
    def from_env(cls) -> "World":
        """The ranks torchrun describes in the environment; one rank when it does not."""
        try:
            size = int(os.environ.get("WORLD_SIZE", "1"))
            rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
        except ValueError:
            raise UserError("WORLD_SIZE, RANK and LOCAL_RANK must be whole numbers",
                            fix="start distributed training with torchrun or `nerkit train --nproc N`") from None
        return cls(rank, local_rank, max(size, 1))

    @property
    def main(self) -> bool:
        """Whether this is rank 0, the one that evaluates, logs and writes files."""
        return self.rank == 0

    # ------------------------------------------------------------------ the process group

    def join(self, device: torch.device, timeout: float) -> torch.device:
        """Join the run's process group (gloo on CPU, nccl on GPU; a group the caller has already
        started is used as it is) and quiet the logging of ranks other than 0. Returns the device
        this rank trains on: with GPUs, its LOCAL_RANK-th. `timeout`: seconds a rank waits in one
        collective before it gives up (train.dist_timeout)."""
        if self.size == 1:
            return device
        if device.type == "cuda":
            if self.local_rank >= torch.cuda.device_count():
                raise UserError(f"LOCAL_RANK {self.local_rank} has no GPU: torch sees {torch.cuda.device_count()}",
                                fix="start at most one process per GPU, or train on the CPU (--set train.device=cpu)")
            device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(device)
        self.device = device
        if not dist.is_initialized():
            if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
                raise UserError(f"WORLD_SIZE is {self.size} but MASTER_ADDR or MASTER_PORT is not set",
                                fix="start distributed training with torchrun or `nerkit train --nproc N`")
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                    timeout=datetime.timedelta(seconds=timeout))
            self.owns_group = True
        if not self.main:  # rank 0 says what the run does; the others speak only of errors
            logging.getLogger("nerkit").setLevel(logging.ERROR)
        return device

    def leave(self, finished: bool = False) -> None:
        """End the process group this rank started. After a finished run the ranks first wait for
        each other (rank 0 comes last, from writing the model): a rank that tore its group down
        while rank 0 still held its connections was seen to abort in gloo's teardown (SIGABRT,
        "terminate called without an active exception"). A rank that fails leaves at once."""
        if self.owns_group and dist.is_initialized():
            if finished and self.size > 1:
                try:
                    dist.barrier()
                except RuntimeError as e:  # another rank is gone: nothing to wait for
                    log.debug("leaving without the other ranks: %s", e)
            dist.destroy_process_group()
        self.owns_group = False

    def wrap(self, model: nn.Module):
        """What `train_step` calls `loss(batch)` on: the model itself, or with several ranks a
        `Replica` whose backward averages the gradients of all of them. Only the model's own state
        is ever saved (no `module.` prefixes)."""
        return model if self.size == 1 else Replica(model, self.device)

    # ------------------------------------------------------------------ the data

    def slice(self, batch: list[int]) -> tuple[list[int], float]:
        """This rank's sentences of a global batch (every size-th, from the rank-th: the batch is
        sorted by length, so the ranks get alike lengths and finish their steps together), and
        the weight of its loss. A model's loss is a mean over its batch's sentences and DDP averages
        the ranks' gradients; weighting rank r's mean by size * n_r / n makes that average the
        gradient of the mean over the whole global batch, even when the ranks' slices are uneven.
        A rank left without a sentence (a batch smaller than the world) runs the batch's first one
        with weight 0, so that it still takes part in the step's all-reduce."""
        if self.size == 1:
            return batch, 1.0
        mine = batch[self.rank::self.size]
        if not mine:
            return batch[:1], 0.0
        return mine, self.size * len(mine) / len(batch)

    # ------------------------------------------------------------------ agreements

    def sum(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks (every rank calls this at the same point)."""
        if self.size == 1:
            return list(values)
        summed = torch.tensor(values, dtype=torch.float64, device=self.device)  # (V,)
        dist.all_reduce(summed)
        return summed.tolist()

    def from_main(self, value: float) -> float:
        """Rank 0's `value`, on every rank."""
        if self.size == 1:
            return value
        shared = torch.tensor([value], dtype=torch.float64, device=self.device)  # (1,)
        dist.broadcast(shared, src=0)
        return shared.item()

    def gather(self, state: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's `state` (a 1-d tensor of the same size on each), in rank order."""
        if self.size == 1:
            return [state]
        state = state.to(self.device)
        states = [torch.empty_like(state) for _ in range(self.size)]
        dist.all_gather(states, state)
        return [s.cpu() for s in states]

    def check_same(self, what: str, value, where: str) -> None:
        """That every rank has what rank 0 has: `value` (JSON data describing `what`), compared over
        the first 60 bits of its sha256. Nodes that read their own copies of the data could otherwise
        differ, and DDP would fail on its own shape check with a traceback (or, worse, train on)."""
        if self.size == 1:
            return
        fingerprint = hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
        mine = torch.tensor([int(fingerprint[:15], 16)], dtype=torch.int64)  # (1,)
        everyone = [int(t.item()) for t in self.gather(mine)]
        differing = [str(rank) for rank, value in enumerate(everyone) if value != everyone[0]]
        if differing:
            ranks = f"rank{'s' if len(differing) > 1 else ''} {', '.join(differing)}"
            raise UserError(f"{what} of {ranks} differ from rank 0's", where=where,
                            fix="give every machine the same files at the same paths (a shared file system, "
                                "or copies whose sha256sum agree)")

    def lost(self, error: Exception, timeout: float, out) -> JobError | None:
        """The error to end this rank with when `error` says that another rank is gone (a closed
        connection) or silent (a collective past its timeout); None when it says something else."""
        text = str(error).strip()
        if self.size == 1 or not (isinstance(error, dist.DistError) or "gloo" in text.lower()):
            return None
        reason = text.splitlines()[0] if text else type(error).__name__
        reason = reason.split("] ", 1)[-1].split(". ")[0]  # gloo's messages start with its source file
        why = (f"another rank did not answer within train.dist_timeout = {timeout:g} s (stuck, or busy: "
               f"rank 0's dev evaluation must fit in it)" if "timed out" in text.lower() else
               "another rank failed or was killed (its own messages say why)")
        return JobError(f"rank {self.rank} lost the other training processes ({reason}): {why}; "
                        f"the last checkpoint continues with: {resume_command(out)}")


# DDP's option that turns off the buffers' broadcast before each forward (torch 2.13 renamed it).
_NO_BUFFER_SYNC = ("forward_sync_buffers" if "forward_sync_buffers" in
                   inspect.signature(DistributedDataParallel).parameters else "broadcast_buffers")


class _LossForward(nn.Module):
    """The model's training loss as a module's forward: DDP averages the gradients of what its
    forward computed."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch) -> torch.Tensor:
        return self.model.loss(batch)


class Replica(DistributedDataParallel):
    """A model replicated on each rank, whose `loss(batch)` backward all-reduces the gradients.
    Every trainable parameter takes part in each loss (nothing unused to search for), and no
    buffer changes while training (nothing to broadcast before each step)."""

    def __init__(self, model: nn.Module, device: torch.device):
        super().__init__(_LossForward(model), device_ids=[device] if device.type == "cuda" else None,
                         **{_NO_BUFFER_SYNC: False})

    def loss(self, batch) -> torch.Tensor:
        return self(batch)


def seed_rank(seed: int, rank: int, step: int = 0) -> None:
    """A rank's own torch random stream for dropout, from the run's seed, the rank and the step it
    starts at (a resume on more ranks than the run had). Rank 0 keeps the seed's stream, so a run
    of one process is what it always was."""
    if rank:
        torch.manual_seed(seed * 1_000_003 + rank * 10_007 + step)


def check_batch_size(batch_size: int, world_size: int) -> None:
    """train.batch_size is the global batch: the ranks split it evenly."""
    if batch_size % world_size:
        fit = max(world_size, round(batch_size / world_size) * world_size)
        raise UserError(f"train.batch_size = {batch_size} does not split evenly over {world_size} processes",
                        fix=f"it is the global batch: use a multiple of {world_size}, "
                            f"e.g. --set train.batch_size={fit}")


def resume_command(out) -> str:
    """How to continue the run in `out` with as many processes as this one has."""
    nproc = os.environ.get(LAUNCHED_WITH)
    size, local = int(os.environ.get("WORLD_SIZE", "1")), os.environ.get("LOCAL_WORLD_SIZE")
    if nproc:
        return f"nerkit train --resume {out} --nproc {nproc}"
    if size > 1 and local and int(local) == size:
        return f"torchrun --nproc_per_node {size} -m nerkit train --resume {out}"
    if size > 1:
        return f"torchrun (with this run's options) -m nerkit train --resume {out}"
    return f"nerkit train --resume {out}"


# ------------------------------------------------------------------------------ nerkit train --nproc


def without_nproc(argv: list[str]) -> list[str]:
    """The command line `argv` without its `--nproc N` (or `--nproc=N`)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            kept.append(arg)
    return kept


def launch(nproc: int, argv: list[str], out) -> int:
    """`nerkit train --nproc N ...`: torchrun on this machine (`--standalone`: a free port of its
    own) starting N processes of `python -m nerkit` with the same arguments, less --nproc. torchrun
    runs in this process (`python -m torch.distributed.run` is its `main`), so that its report of a
    failure becomes one line instead of a traceback and a table. Returns
    the exit code: 0, 130 after Ctrl-C (rank 0 saved a checkpoint and said how to resume), 2 when
    a rank stopped at a user error (it printed it); a process that crashed or was killed is a
    JobError naming it (torchrun stopped the others)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    if "WORLD_SIZE" in os.environ:
        raise UserError("--nproc starts torchrun, and this process is already one of torchrun's",
                        fix="drop --nproc (torchrun's --nproc_per_node says how many)")
    os.environ[LAUNCHED_WITH] = str(nproc)
    try:
        torchrun(["--standalone", "--nproc_per_node", str(nproc), "-m", "nerkit", *without_nproc(argv)])
    except SignalException as e:  # torchrun passed the signal on and waited for the processes
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        causes = _causes(e.failures)
        if causes[0][1].exitcode in (2, 130):  # a user error or Ctrl-C: the rank has said so
            return causes[0][1].exitcode
        said = "; then ".join(f"rank {rank} (pid {failure.pid}) {_ended(failure)}" for rank, failure in causes)
        raise JobError(f"training process {said}, and torchrun stopped the others; "
                       f"the last checkpoint continues with: {resume_command(out)}") from None
    return 0


def _causes(failures: dict) -> list:
    """The (rank, ProcessFailure) of a failed torchrun job that tell what happened, first first: not
    the processes torchrun itself stopped with SIGTERM (unless there is nothing else), and, of those
    seen at the same instant, deaths by a signal before exits (a rank that loses another exits 1)."""
    ordered = sorted(failures.items(), key=lambda item: (item[1].timestamp, item[1].exitcode >= 0, item[0]))
    return [(r, f) for r, f in ordered if f.exitcode != -signal.SIGTERM] or ordered


def _ended(failure) -> str:
    if failure.exitcode < 0:
        return f"was killed by {failure.signal_name()}"
    return f"ended with exit code {failure.exitcode}"
