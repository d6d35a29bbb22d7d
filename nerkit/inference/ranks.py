"""Prediction across processes and machines: `torchrun ... -m nerkit predict --model DIR big.txt
--output out.jsonl`. Every rank reads the same input into the same chunks (nerkit.inference.stream),
predicts every WORLD_SIZE-th chunk from its RANK on, and hands its output to rank 0, which writes the
chunks in input order: the file is byte-identical to one process's. The ranks meet once per round of
WORLD_SIZE chunks (a gloo `gather_object`), so rank 0 holds at most one round of output, and the
input need not be on a shared disk, only readable at the same path on every machine.

torchrun's conventions (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment), as
`nerkit train` follows them; only rank 0 writes.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Iterable, Iterator

from nerkit.errors import UserError
from nerkit.inference.formats import predict_chunk

TIMEOUT = timedelta(minutes=30)  # how long a rank waits for the others in one round


class Ranks:
    """This process's place among torchrun's: rank and size, and the group they gather in."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size

    @classmethod
    def from_env(cls) -> "Ranks | None":
        """The ranks torchrun started, or None for a plain process (WORLD_SIZE unset or 1)."""
        size = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if size <= 1:
            return None
        return cls(int(os.environ.get("RANK", "0")), size)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def start(self) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo", timeout=TIMEOUT)

    def stop(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def gather(self, item) -> list | None:
        """Every rank's `item`, in rank order, on rank 0 (None on the others)."""
        import torch.distributed as dist

        found = [None] * self.size if self.main else None
        dist.gather_object(item, found, dst=0)
        return found


def check_ranked(source: str, output: str | None) -> None:
    """Several ranks read the input again each and only rank 0 writes: a file in, a file out."""
    if source == "-":
        raise UserError("with several processes (torchrun) the input must be a file, not stdin",
                        fix="pass the text file's path, readable at the same path on every machine")
    if output is None:
        raise UserError("with several processes (torchrun) the output must be a file", fix="pass --output FILE")


def predicted_by_ranks(pipe, chunks: Iterable[tuple[list[str], int, list[dict] | None]], fmt: str, batch_size: int,
                       window: int | None, ranks: Ranks, min_score: float | None = None
                       ) -> Iterator[tuple[bytes, int, int]]:
    """Each chunk's output in input order on rank 0 (nothing on the others), as `stream._predicted`
    yields it: rank r predicts chunks r, r + size, ... and every round of `size` chunks is gathered."""
    chunks = iter(chunks)
    while True:
        round_ = [chunk for _, chunk in zip(range(ranks.size), chunks)]  # every rank reads the same round
        mine = round_[ranks.rank] if ranks.rank < len(round_) else None
        done = None
        if mine is not None:
            texts, size, keys = mine
            done = (predict_chunk(pipe, texts, fmt, batch_size, window, keys, min_score), len(texts), size)
        gathered = ranks.gather(done)
        if ranks.main:
            yield from (item for item in gathered if item is not None)
        if len(round_) < ranks.size:
            return
