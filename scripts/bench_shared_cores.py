"""Training throughput alone and on shared cores, under OpenMP's two wait policies: the same short
`nerkit train` run (the MSRA BiLSTM config on its first 5,000 sentences, 60 steps, two torch threads)
alone, and beside a second copy of itself started at the same moment, each run under
OMP_WAIT_POLICY=ACTIVE (OpenMP's spinning) and PASSIVE (nerkit's default). Prints steady-state
training chars/s of each run (metrics.json `train_chars_per_s_steady`) and the ratios.

    python scripts/bench_shared_cores.py [--config configs/msra_bilstm.yaml] [--steps 60] [--limit 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def start(config: str, out: Path, policy: str, steps: int, limit: int, threads: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_WAIT_POLICY": policy}
    env.pop("OMP_NUM_THREADS", None)
    cmd = [sys.executable, "-m", "nerkit", "--quiet", "train", "--config", config, "--out", str(out), "--force",
           "--set", f"data.limit={limit}", "--set", "train.epochs=1", "--set", f"train.max_steps={steps}",
           "--set", f"train.threads={threads}", "--set", "train.device=cpu", "--set", "data.test=null"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)


def steady(out: Path) -> float:
    return json.loads((out / "metrics.json").read_text())["train_chars_per_s_steady"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", default="configs/msra_bilstm.yaml")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--limit", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for policy in ("ACTIVE", "PASSIVE"):
            print(f"load average before {policy} alone: {os.getloadavg()[0]:.2f}", flush=True)
            proc = start(args.config, tmp / "alone", policy, args.steps, args.limit, args.threads)
            if proc.wait():
                sys.exit(f"the run alone failed under {policy}")
            results[f"{policy} alone"] = steady(tmp / "alone")
            print(f"load average before {policy} shared: {os.getloadavg()[0]:.2f}", flush=True)
            pair = [start(args.config, tmp / f"shared{i}", policy, args.steps, args.limit, args.threads) for i in (1, 2)]
            if any(p.wait() for p in pair):
                sys.exit(f"a shared run failed under {policy}")
            results[f"{policy} shared (each of 2)"] = [steady(tmp / f"shared{i}") for i in (1, 2)]
            print(f"{policy}: alone {results[f'{policy} alone']:,.0f} chars/s; two at once "
                  + ", ".join(f"{v:,.0f}" for v in results[f"{policy} shared (each of 2)"]) + " chars/s", flush=True)
    alone, shared = results["PASSIVE alone"], results["PASSIVE shared (each of 2)"]
    active_alone, active_shared = results["ACTIVE alone"], results["ACTIVE shared (each of 2)"]
    print(json.dumps({**results,
                      "passive / active alone": alone / active_alone,
                      "passive / active shared (sum of both runs)": sum(shared) / sum(active_shared),
                      "shared / alone, passive (sum of both runs)": sum(shared) / alone,
                      "shared / alone, active (sum of both runs)": sum(active_shared) / active_alone}, indent=2))


if __name__ == "__main__":
    main()
