"""The CRF likelihood's forward algorithm, sequential (`loop`) against log-depth (`scan`): time of
one forward + backward and the number of operators it dispatches (each one a kernel launch on a
GPU, where a training step's CRF is launch-bound), in one run so the ratio is the figure.

    .venv/bin/python scripts/bench_crf.py [--device cuda] [--tags 13] [--batch 16] [--lengths 25,50,100,200]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from nerkit.model.crf import CRF


def bmes_tags(n_types: int) -> list[str]:
    return ["O"] + [f"{p}-T{i}" for i in range(n_types) for p in "BMES"]


def one_pass(crf: CRF, emissions: torch.Tensor, gold: torch.Tensor, mask: torch.Tensor) -> None:
    e = emissions.detach().requires_grad_()
    crf.neg_log_likelihood(e, gold, mask, reduction="mean").backward()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--types", type=int, default=3, help="entity types; BMES gives 4 x types + 1 tags")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lengths", default="25,50,100,200")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    tags = bmes_tags(args.types)
    print(f"CRF likelihood forward + backward, {len(tags)} tags, batch {args.batch}, {device}, "
          f"{torch.get_num_threads()} thread(s); constrained likelihood off (the configs' default)\n")
    print("| length | loop ms | scan ms | time ratio | loop ops | scan ops | ops ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for length in map(int, args.lengths.split(",")):
        generator = torch.Generator().manual_seed(length)
        emissions = torch.randn(args.batch, length, len(tags), generator=generator).to(device)
        lengths = torch.randint(max(1, length // 2), length + 1, (args.batch,), generator=generator)
        lengths[0] = length
        mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).to(device)
        gold = torch.zeros(args.batch, length, dtype=torch.long, device=device)
        row = {}
        for algorithm in ("loop", "scan"):
            crf = CRF(tags, algorithm=algorithm).to(device)
            for _ in range(3):
                one_pass(crf, emissions, gold, mask)
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.reps):
                one_pass(crf, emissions, gold, mask)
            if device.type == "cuda":
                torch.cuda.synchronize()
            ms = 1000 * (time.perf_counter() - t0) / args.reps
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            with profile(activities=activities) as prof:
                one_pass(crf, emissions, gold, mask)
            # top-level operators only: what the Python code dispatches, forward and backward
            ops = sum(1 for e in prof.events() if e.cpu_parent is None and e.name.startswith(("aten::", "autograd::")))
            row[algorithm] = (ms, ops)
        (lm, lo), (sm, so) = row["loop"], row["scan"]
        print(f"| {length} | {lm:.2f} | {sm:.2f} | {lm / sm:.1f}x | {lo} | {so} | {lo / so:.1f}x |")


if __name__ == "__main__":
    main()
