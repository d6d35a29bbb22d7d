"""Speed of the language-model features (nerkit/lm.py) on this machine: characters per second for
frozen feature extraction (no_grad forward) and for fine-tuning (forward + backward + fused AdamW
step of the LM and a linear tag layer), in fp32 and under bf16 autocast, for each thread count.

    .venv/bin/python scripts/bench_lm.py [--model lm/m3e-small] [--threads 1,2] [--batch 16] [--length 50] [--unfused]

Sentences are MSRA training sentences of --length +- 10 characters when the data is there
(NERKIT_DATA, else ../shared/data), else random characters of the LM's vocabulary.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

import torch
from torch import nn

from nerkit.pretrained.bert import LMEmbedder
from nerkit.pretrained.loading import load_lm


def sentences(embedder: LMEmbedder, count: int, length: int, seed: int = 0) -> list[list[str]]:
    rng = random.Random(seed)
    root = Path(os.environ.get("NERKIT_DATA") or Path(__file__).resolve().parents[1].parent / "shared" / "data")
    path = root / "msra" / "train_dev.char.bmes"
    if path.is_file():
        from nerkit.data.corpus import read_corpus

        pool = [s.tokens for s in read_corpus(path).sentences if abs(len(s.tokens) - length) <= 10]
        print(f"sentences: {len(pool)} MSRA training sentences of {length} +- 10 characters, {count} drawn")
        return [rng.choice(pool) for _ in range(count)]
    chars = [t for t in embedder.vocab.tokens if len(t) == 1 and "\u4e00" <= t <= "\u9fff"]
    print(f"sentences: random vocabulary characters ({path} not found)")
    return [[rng.choice(chars) for _ in range(rng.randint(length - 10, length + 10))] for _ in range(count)]


def batches(embedder: LMEmbedder, sents: list[list[str]], size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for first in range(0, len(sents), size):
        group = sents[first:first + size]
        width = max(len(s) for s in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)  # (B, T)
        mask = torch.zeros(len(group), width, dtype=torch.bool)  # (B, T)
        for b, s in enumerate(group):
            ids[b, :len(s)] = torch.tensor(embedder.vocab.ids(s))
            mask[b, :len(s)] = True
        out.append((ids, mask))
    return out


def timed(step, data, seconds: float, warmup: int = 2) -> float:
    """Characters per second of `step` over `data` (cycled) for about `seconds`, after a warm-up."""
    for ids, mask in data[:warmup]:
        step(ids, mask)
    chars, began, k = 0, time.perf_counter(), 0
    while time.perf_counter() - began < seconds or k < 3:
        ids, mask = data[k % len(data)]
        step(ids, mask)
        chars += int(mask.sum())
        k += 1
    return chars / (time.perf_counter() - began)


def frozen_step(embedder: LMEmbedder):
    @torch.no_grad()
    def step(ids, mask):
        embedder(ids, mask)  # (B, T, D)
    return step


def finetune_step(embedder: LMEmbedder, fused: bool, tags: int = 13):
    head = nn.Linear(embedder.output_dim, tags)
    # fused AdamW: on a CPU the plain one spends ~0.3 s a step on m3e-small's 24M parameters, fused ~0.03 s
    optimizer = torch.optim.AdamW(list(embedder.parameters()) + list(head.parameters()), lr=2e-5, fused=fused)
    embedder.train()
    generator = torch.Generator().manual_seed(0)

    def step(ids, mask):
        gold = torch.randint(0, tags, ids.shape, generator=generator)  # (B, T)
        logits = head(embedder(ids, mask))  # (B, T, K)
        loss = nn.functional.cross_entropy(logits[mask], gold[mask])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="lm/m3e-small")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=8.0, help="timed seconds per measurement")
    ap.add_argument("--unfused", action="store_true", help="torch's default (unfused) AdamW instead of fused")
    args = ap.parse_args()
    probe = load_lm(args.model)
    data = batches(probe, sentences(probe, args.batch * 8, args.length), args.batch)
    config = probe.lm.config
    print(f"{args.model}: {config.num_hidden_layers} layers, hidden {config.hidden_size}; batch {args.batch}, "
          f"{sum(int(m.sum()) for _, m in data) / (len(data) * args.batch):.1f} characters per sentence; "
          f"torch {torch.__version__}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    print(f"{'mode':<10} {'precision':<10} {'threads':>7} {'chars/s':>9}")
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for mode in ("frozen", "finetune"):
            for bf16 in (False, True):
                torch.manual_seed(0)
                embedder = load_lm(args.model, finetune=mode == "finetune", bf16=bf16)
                step = frozen_step(embedder) if mode == "frozen" else finetune_step(embedder, not args.unfused)
                rate = timed(step, data, args.seconds)
                print(f"{mode:<10} {'bf16' if bf16 else 'fp32':<10} {threads:>7} {rate:>9.0f}", flush=True)


if __name__ == "__main__":
    main()
