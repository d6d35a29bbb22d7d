"""Entity F1 of a trained model by sentence length, on its dev split and on a test file.

Where does a model lose its test points? A sentence longer than `data.max_len` is predicted in
overlapping windows (`Pipeline.predict_tokens`), and MSRA's test set has far longer sentences than its
training split, so the scores are split by length: each bucket is scored on its own sentences with
nerkit's one scoring function.

    python scripts/f1_by_length.py runs/bench_lmcrf5/runs/msra_lm_crf_s1 [--threads 1] [--bounds 50,100,250] [--train N]

`--train N` also scores the first N sentences of the training split (as the model was trained, dev
carved off): how closely the model fits what it learned from, beside dev and test.
"""

from __future__ import annotations

import argparse
import sys

from nerkit.data.splits import read_splits
from nerkit.device import set_threads
from nerkit.inference.evaluate import score
from nerkit.inference.pipeline import Pipeline


def buckets(lengths: list[int], bounds: list[int]) -> list[tuple[str, list[int]]]:
    """(label, sentence indices) per length bucket: up to bounds[0], ..., above bounds[-1]."""
    edges = [0, *bounds, None]
    out = []
    for lo, hi in zip(edges, edges[1:]):
        label = f"{lo + 1}-{hi}" if hi is not None else f">{lo}"
        out.append((label, [i for i, n in enumerate(lengths) if n > lo and (hi is None or n <= hi)]))
    return out


def table(name: str, sentences, predicted, bounds: list[int]) -> list[str]:
    """Markdown rows: every sentence, each length bucket, then every sentence up to bounds[-1]."""
    gold = [s.spans() for s in sentences]
    lengths = [len(s.tokens) for s in sentences]
    rows = []
    for label, idx in [("all", range(len(sentences))), *buckets(lengths, bounds), buckets(lengths, bounds[-1:])[0]]:
        if not idx:
            continue
        m = score([gold[i] for i in idx], [predicted[i] for i in idx])
        rows.append(f"| {name} | {label} | {len(idx):,} | {sum(lengths[i] for i in idx):,} | "
                    f"{sum(len(gold[i]) for i in idx):,} | {100 * m['f1']:.2f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a model directory (nerkit train's --out, or a bench run's runs/NAME)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bounds", default="50,100,250", help="bucket upper bounds in characters")
    ap.add_argument("--train", type=int, default=0, help="also score the first N training sentences")
    args = ap.parse_args(argv)
    set_threads(args.threads)
    bounds = [int(b) for b in args.bounds.split(",")]
    pipe = Pipeline.load(args.model)
    splits = read_splits(pipe.config)  # the dev the model was selected on (carved from train as in training)
    print(f"model {args.model}; data.max_len {pipe.config.data.max_len}")
    print("| split | length (chars) | sentences | chars | gold entities | F1 |")
    print("|---|---|---:|---:|---:|---:|")
    for name, sentences in (("train", splits.train[:args.train]), ("dev", splits.dev), ("test", splits.test)):
        if sentences:
            predicted = pipe.predict_tokens([s.tokens for s in sentences])
            print("\n".join(table(name, sentences, predicted, bounds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
