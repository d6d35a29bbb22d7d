"""Training and prediction throughput: the model's own math on fixed batches versus the real
commands (`nerkit train`, `nerkit predict`), measured in one run so the ratio is meaningful on a
noisy machine.

    python scripts/bench_speed.py --config configs/msra_bilstm.yaml [--steps 200] [--threads 2] [--device cuda]

The model is built from the config's training data (vocabulary sizes matter) with random weights;
weights do not change the cost of the math.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from nerkit.config import load_config
from nerkit.data.splits import read_splits
from nerkit.features.batch import bucketed_batches, collate
from nerkit.inference.pipeline import Pipeline
from nerkit.training.build import build_pipeline
from nerkit.training.loop import train_step
from nerkit.training.schedule import make_optimizer


def model_only(pipe: Pipeline, examples, batch_size: int, steps: int, train: bool) -> float:
    """chars/s of loss+backward+step (train) or decode (predict) over pre-collated batches (already on
    the model's device: the figure is the model's math alone)."""
    lengths = [len(e) for e in examples]
    batches = [collate([examples[i] for i in idx]).to(pipe.device)
               for idx in bucketed_batches(lengths, batch_size, random.Random(0))]
    batches = (batches * (steps // len(batches) + 1))[:steps]
    optimizer = make_optimizer(pipe.config, pipe.model)
    pipe.model.train(train)
    for b in batches[:5]:  # warm-up
        if train:
            pipe.model.loss(b).backward()
        else:
            pipe.model.decode(b)
    chars, t0 = 0, time.perf_counter()
    params = [p for p in pipe.model.parameters() if p.requires_grad]
    for b in batches:
        if train:
            train_step(pipe.model, b, optimizer, params=params, clip_norm=pipe.config.train.clip_norm)
        else:
            with torch.inference_mode():
                pipe.model.decode(b)
        chars += b.num_chars
    if pipe.device.type == "cuda":
        torch.cuda.synchronize()
    return chars / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu | cuda")
    ap.add_argument("--predict-repeat", type=int, default=4, help="copies of the test text fed to nerkit predict")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    config = load_config(args.config)
    splits = read_splits(config)
    pipe = build_pipeline(config, splits, device=args.device)
    train_examples = [pipe.featurizer.training_example(s) for s in splits.train[: 20 * config.train.batch_size * 10]]
    test_sentences = splits.test or splits.dev
    test_examples = [pipe.featurizer.example(s.tokens) for s in test_sentences]
    torch.manual_seed(0)
    results = {"config": args.config, "threads": torch.get_num_threads(), "torch": torch.__version__,
               "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    results["model_train_chars_s"] = model_only(pipe, train_examples, config.train.batch_size, args.steps, True)
    results["model_predict_chars_s"] = model_only(pipe, test_examples, 64, args.steps, False)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = pipe.save(tmp / "model")
        text = tmp / "text.txt"
        lines = ["".join(s.tokens) for s in test_sentences] * args.predict_repeat
        text.write_text("\n".join(lines) + "\n", encoding="utf-8")
        n_chars = sum(len(line) for line in lines)
        cmd = [sys.executable, "-m", "nerkit", "predict", "--model", str(model_dir), str(text),
               "--output", str(tmp / "out.jsonl"), "--batch-size", "64", "--device", args.device]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        wall = time.perf_counter() - t0
        results["predict_command_chars_s"] = n_chars / wall
        results["predict_command_chars"] = n_chars
        results["predict_command_wall_s"] = wall

        cmd = [sys.executable, "-m", "nerkit", "train", "--config", args.config, "--out", str(tmp / "run"),
               "--set", f"train.max_steps={args.steps + 20}", "--set", "train.epochs=1",
               "--set", f"train.device={args.device}"]
        if args.threads:
            cmd += ["--set", f"train.threads={args.threads}"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        metrics = json.loads((tmp / "run" / "metrics.json").read_text())
        results["train_command_chars_s_steady"] = metrics["train_chars_per_s_steady"]
    results["train_ratio"] = results["train_command_chars_s_steady"] / results["model_train_chars_s"]
    results["predict_ratio"] = results["predict_command_chars_s"] / results["model_predict_chars_s"]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
