"""Data-parallel training throughput: the same short `nerkit train` run (by default the MSRA BiLSTM
config on its first 5,000 sentences, 200 steps of its global batch, one torch thread a process) on
one process and on `--nproc 2`, alternated for a few rounds in one invocation, so that the ratios
are meaningful on a machine whose load drifts. Prints each run's training chars/s (metrics.json:
`train_chars_per_s_steady`, after a session's first batches, and `train_chars_per_s`, all of them;
the global batch's characters over rank 0's step time), the speed-up over one process and the
efficiency (speed-up / processes), as a table and as JSON.

    python scripts/bench_ddp.py [--config configs/msra_bilstm.yaml] [--limit 5000] [--steps 200]
                                [--nproc 1,2] [--rounds 2] [--threads 1]

Give it the machine to itself: N processes want N cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def train(config: str, out: Path, nproc: int, args) -> dict:
    """One `nerkit train` run of `args.steps` steps on `nproc` processes; its metrics.json."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    command = [sys.executable, "-m", "nerkit", "--quiet", "train", "--config", config, "--out", str(out), "--force",
               "--set", f"data.limit={args.limit}", "--set", "train.epochs=1000", "--set", f"train.max_steps={args.steps}",
               "--set", f"train.threads={args.threads}", "--set", "train.device=cpu", "--set", "data.test=null",
               "--nproc", str(nproc)]
    started = time.perf_counter()
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, check=True)
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["processes"] == nproc and metrics["steps"] == args.steps, metrics
    return {"nproc": nproc, "steady": metrics["train_chars_per_s_steady"], "all": metrics["train_chars_per_s"],
            "wall_s": time.perf_counter() - started}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/msra_bilstm.yaml")
    ap.add_argument("--limit", type=int, default=5000, help="training sentences (data.limit)")
    ap.add_argument("--steps", type=int, default=200, help="optimiser steps of each run (train.max_steps)")
    ap.add_argument("--nproc", default="1,2", help="process counts to compare, the first the baseline")
    ap.add_argument("--rounds", type=int, default=2, help="times each count runs, alternated")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    args = ap.parse_args()
    counts = [int(n) for n in args.nproc.split(",")]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(1, args.rounds + 1):
            for n in counts:
                result = train(args.config, Path(tmp) / f"run{n}", n, args)
                runs.append({"round": round_, **result})
                print(f"round {round_}, {n} process(es): {result['steady']:,.0f} chars/s steady, "
                      f"{result['all']:,.0f} in all ({result['wall_s']:.0f} s)", file=sys.stderr)
    base = [r["steady"] for r in runs if r["nproc"] == counts[0]]
    baseline = sum(base) / len(base)
    print(f"\n{args.config}, first {args.limit:,} sentences, {args.steps} steps, {args.threads} thread(s) a process\n")
    print("| processes | steady chars/s (each round) | mean | speed-up | efficiency |")
    print("|---:|---|---:|---:|---:|")
    summary = []
    for n in counts:
        figures = [r["steady"] for r in runs if r["nproc"] == n]
        mean = sum(figures) / len(figures)
        speedup = mean / baseline
        summary.append({"processes": n, "steady_chars_per_s": figures, "speedup": speedup,
                        "efficiency": speedup * counts[0] / n})
        print(f"| {n} | {', '.join(f'{f:,.0f}' for f in figures)} | {mean:,.0f} | {speedup:.2f} | "
              f"{speedup * counts[0] / n:.2f} |")
    print("\n" + json.dumps({"config": args.config, "limit": args.limit, "steps": args.steps, "threads": args.threads,
                             "runs": runs, "summary": summary}))


if __name__ == "__main__":
    main()
