"""The span head's cost against the CRF on the same BiLSTM (docs/nested.md#what-it-costs): train and
predict characters per second on one thread, and the process's peak memory. Each head runs in a
process of its own, so that the peak is its own; the heads alternate, so that a busy machine slows
both alike.

    NERKIT_DATA=... python scripts/head_cost.py [--hidden 100 200] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def measure(head: str, hidden: int, train_file: str) -> dict:
    """One head's figures, in this process: 30 training steps of 32 sentences, then 300 dev texts."""
    import torch

    torch.set_num_threads(1)
    from nerkit.config import build_config
    from nerkit.data.splits import read_splits
    from nerkit.features.batch import bucketed_batches, collate
    from nerkit.training.build import build_pipeline
    from nerkit.training.loop import train_step
    from nerkit.training.schedule import make_optimizer

    overrides = [f"data.train={train_file}", "data.dev_split=0.05", "data.limit=1200", "data.max_len=128",
                 f"model.head={head}", "encoder.name=bilstm", f"encoder.hidden_size={hidden}",
                 "embeddings.char_dim=50", "embeddings.bichar_dim=50", "train.threads=1", "train.device=cpu"]
    if head == "crf":  # the CRF learns CMeEE's flat projection
        overrides.append("data.flat=outer")
    config = build_config({}, "<head cost>", overrides)
    torch.manual_seed(0)
    splits = read_splits(config)
    pipe = build_pipeline(config, splits, "cpu")
    examples = [pipe.featurizer.training_example(s) for s in splits.train]
    optimizer = make_optimizer(config, pipe.model)
    pipe.model.train()
    chars, started = 0, time.perf_counter()
    for idx in bucketed_batches([len(e) for e in examples], 32)[:30]:
        batch = collate([examples[j] for j in idx])
        train_step(pipe.model, batch, optimizer)
        chars += int(batch.mask.sum())
    train_rate = chars / (time.perf_counter() - started)
    texts = [s.text for s in splits.train[:300]]  # speed alone: any text of the corpus
    pipe.predict(texts[:20])  # warm-up
    rates = {}
    for scores in (False, True):
        started = time.perf_counter()
        found = pipe.predict(texts, batch_size=64, scores=scores)
        rates[scores] = sum(map(len, texts)) / (time.perf_counter() - started)
    head_params = sum(p.numel() for n, p in pipe.model.named_parameters() if n.startswith(("span.", "emission.", "crf.")))
    return {"head": head, "hidden": hidden, "head_params": head_params, "train_chars_s": round(train_rate),
            "predict_chars_s": round(rates[False]), "predict_scored_chars_s": round(rates[True]),
            "entities_predicted": sum(map(len, found)),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[100, 200])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--train", default=os.path.join(os.environ.get("NERKIT_DATA", "data"), "cmeee", "train.jsonl"))
    parser.add_argument("--one", nargs=2, metavar=("HEAD", "HIDDEN"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args.train)))
        return
    for _ in range(args.repeats):
        for hidden in args.hidden:
            for head in ("crf", "span"):
                found = subprocess.run([sys.executable, __file__, "--train", args.train, "--one", head, str(hidden)],
                                       capture_output=True, text=True, check=True, cwd=REPO,
                                       env={**os.environ, "PYTHONPATH": str(REPO)})
                print(found.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
