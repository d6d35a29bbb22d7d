"""nerkit's own choice of OpenMP's wait policy and threads (nerkit/cores.py) against the two fixed
policies, alone and beside a busy process, for training and prediction.

Training: `nerkit train` with the MSRA BiLSTM config on its first 5,000 sentences, 60 steps (steady
chars/s from metrics.json). Prediction: `nerkit predict` of a model over the MSRA test text, whole
process, start-up and loading included (characters of input / wall seconds). Each under
OMP_WAIT_POLICY=ACTIVE, PASSIVE, and nerkit's choice (no policy set: `auto`); alone, and started one
second after a busy process (a Python loop on one core that counts its iterations, whose own rate
is reported too, against its rate alone).

    python scripts/bench_auto_policy.py --model runs/msra_bilstm [--rounds 2]
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

HOG = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
end = time.time() + float(sys.argv[1]); n = 0; started = time.time()
try:
    while time.time() < end:
        n += 1
finally:
    print(n / (time.time() - started), flush=True)
"""


def environment(policy: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "NERKIT_FREE_CORES", "OMP_NUM_THREADS")}
    if policy != "auto":
        env["OMP_WAIT_POLICY"] = policy
    return env


def train_once(policy: str, out: Path, data: str) -> float:
    cmd = [sys.executable, "-m", "nerkit", "--quiet", "train", "--config", "configs/msra_bilstm.yaml", "--out",
           str(out), "--force", "--set", "data.limit=5000", "--set", "train.epochs=1", "--set", "train.max_steps=60",
           "--set", "train.device=cpu", "--set", "data.test=null"]
    subprocess.run(cmd, env={**environment(policy), "NERKIT_DATA": data}, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "metrics.json").read_text())["train_chars_per_s_steady"]


def predict_once(policy: str, model: str, text: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "nerkit", "--quiet", "predict", "--model", model, str(text), "--output",
                    os.devnull], env=environment(policy), check=True)
    return len(text.read_text(encoding="utf-8")) / (time.perf_counter() - started)


def beside_a_hog(run, seconds: float = 120.0) -> tuple[float, float]:
    """`run()`'s figure with a busy process started a second before, and the hog's rate meanwhile."""
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(seconds)], stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    figure = run()
    hog.terminate()
    out, _ = hog.communicate()
    return figure, float(out or "nan") if out else float("nan")


def hog_alone(seconds: float = 5.0) -> float:
    return float(subprocess.run([sys.executable, "-c", HOG, str(seconds)], capture_output=True, text=True).stdout)


def msra_test_text(data: str, out: Path) -> int:
    """The MSRA test sentences one per line in `out`, as nerkit reads the corpus; returns their characters."""
    from nerkit.data.corpus import read_corpus

    sentences = [s.text for s in read_corpus(Path(data) / "msra" / "test.char.bmes").sentences]
    out.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    return sum(map(len, sentences))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True, help="A model directory for the prediction runs.")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    data = os.environ.get("NERKIT_DATA") or str(Path(__file__).resolve().parents[2] / "shared" / "data")
    text = Path(tempfile.mkdtemp()) / "msra_test.txt"
    msra_test_text(data, text)
    solo_hog = hog_alone()
    print(f"busy process alone: {solo_hog:,.0f} iterations/s")
    print("| task | policy | alone | beside a busy process | ratio | busy process keeps |\n|---|---|---:|---:|---:|---:|")
    for task in ("train", "predict"):
        for policy in ("ACTIVE", "PASSIVE", "auto"):
            for round_ in range(args.rounds):
                out = Path(tempfile.mkdtemp())
                run = (lambda: train_once(policy, out / "run", data)) if task == "train" else \
                      (lambda: predict_once(policy, args.model, text))
                alone = run()
                shared, hog = beside_a_hog(run)
                print(f"| {task} | {policy} | {alone:,.0f} | {shared:,.0f} | {shared / alone:.2f} | "
                      f"{hog / solo_hog:.2f} |", flush=True)


if __name__ == "__main__":
    main()
