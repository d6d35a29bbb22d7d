"""Where one training step's time goes, per encoder: the full step (loss, backward, optimiser), the
encoder alone (emissions forward + backward), the CRF likelihood with the emissions' forward, and
Viterbi decoding; ms per batch and chars/s over 40 length-bucketed batches of the config's batch
size, from the first 3,000 training sentences (vocabulary sizes are those of the slice).

    python scripts/profile_step.py cpu|cuda configs/msra_bilstm.yaml [configs/msra_tener.yaml ...] [crf.algorithm=scan ...]

Arguments of the form section.key=value override every config (as `--set` does for `nerkit train`).
"""

from __future__ import annotations

import random
import sys
import time

import torch

from nerkit.config import load_config
from nerkit.data.splits import read_splits
from nerkit.features.batch import bucketed_batches, collate
from nerkit.training.build import build_pipeline
from nerkit.training.loop import train_step
from nerkit.training.schedule import make_optimizer


def main(device: str, args: list[str]) -> None:
    overrides = [a for a in args if "=" in a]
    configs = [a for a in args if "=" not in a]
    print(f"overrides: {' '.join(overrides) or 'none'}\n")
    print("| config | part | ms per batch | chars/s |\n|---|---|---:|---:|")
    for path in configs:
        config = load_config(path, ["data.limit=3000", *overrides])
        splits = read_splits(config)
        pipe = build_pipeline(config, splits, device=device)
        examples = [pipe.featurizer.training_example(s) for s in splits.train]
        lengths = [len(e) for e in examples]
        batches = [collate([examples[i] for i in idx]).to(pipe.device)
                   for idx in bucketed_batches(lengths, config.train.batch_size, random.Random(0))][:40]
        optimizer = make_optimizer(config, pipe.model)
        model = pipe.model.train()

        def full(b):
            train_step(model, b, optimizer)

        def encoder(b):
            model.emissions(b).sum().backward()

        def crf(b):
            emissions = model.emissions(b).detach().requires_grad_()
            model.crf.neg_log_likelihood(emissions, b.tag_ids, b.mask, reduction="mean").backward()

        def decode(b):
            with torch.inference_mode():
                model.decode(b)

        parts = [("full step", full), ("encoder fwd+bwd", encoder), ("emissions fwd + CRF loss fwd+bwd", crf),
                 ("decode", decode)]
        for name, fn in parts:
            for b in batches[:3]:  # warm-up
                fn(b)
            if pipe.device.type == "cuda":
                torch.cuda.synchronize()
            t0, chars = time.perf_counter(), 0
            for b in batches:
                fn(b)
                chars += b.num_chars
            if pipe.device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            print(f"| {path} | {name} | {1000 * seconds / len(batches):.1f} | {chars / seconds:,.0f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
