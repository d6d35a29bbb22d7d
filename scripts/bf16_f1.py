"""F1 and speed of a language-model run evaluated with the LM under bf16 autocast and in float32.

Training under bf16 and under float32 are two runs of an hour each on a CPU; this measures the
cheaper half of the question, what bf16 does at inference to a trained model: the same weights,
the dev split the run was selected on (carved again from its config) and its test set, each scored
both ways, with the characters per second and how many sentences got other entities.

    python scripts/bf16_f1.py runs/bench_pretrained/runs/msra_lm_crf_s1 --threads 1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import nerkit
from nerkit.data.splits import read_splits
from nerkit.inference.evaluate import score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    pipeline = nerkit.load(args.model)
    lm = pipeline.model.embedder.lm
    if lm is None:
        sys.exit(f"{args.model}: the model has no language model")
    splits = read_splits(pipeline.config)
    rows = []
    for name, sentences in (("dev", splits.dev), ("test", splits.test or [])):
        tokens = [s.tokens for s in sentences]
        gold = [s.spans() for s in sentences]
        chars = sum(len(t) for t in tokens)
        by_precision = {}
        for bf16 in (False, True):
            lm.bf16 = bf16
            evaluation = pipeline.predict_and_score(sentences, args.batch_size)
            by_precision[bf16] = evaluation.predicted
            f1 = score(gold, evaluation.predicted)["f1"]
            rows.append({"split": name, "precision": "bf16" if bf16 else "fp32", "f1": round(100 * f1, 2),
                         "chars_per_s": round(chars / evaluation.seconds)})
        differing = sum(a != b for a, b in zip(by_precision[False], by_precision[True]))
        rows.append({"split": name, "sentences_whose_entities_differ": differing, "sentences": len(sentences)})
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
