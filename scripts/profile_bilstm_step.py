"""Where a BiLSTM-CRF training step goes on the CPU (issue 44, section 3): the MSRA BiLSTM config on
its first 5,000 sentences, the epoch's first batches in its seeded order at the config's batch size,
each phase timed on its own (milliseconds per step and share): collate, embedding (with its dropout),
the BiLSTM forward (with its output dropout), the emission layer, the CRF likelihood forward and
backward, the backward through the emissions, BiLSTM and embeddings, gradient clipping, Adam.

    NERKIT_DATA=... python scripts/profile_bilstm_step.py --threads 1 --steps 40
"""

import argparse
import random
import time

import torch

from nerkit.config import load_config
from nerkit.data.splits import read_splits
from nerkit.device import set_threads
from nerkit.features.batch import bucketed_batches, collate
from nerkit.training.build import build_pipeline
from nerkit.training.loop import seed_everything
from nerkit.training.schedule import make_optimizer

PHASES = ("collate", "embed", "lstm", "emission", "crf_fwd", "crf_bwd", "enc_bwd", "clip", "adam")
WARMUP = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/msra_bilstm.yaml")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--set", action="append", default=[], help="a config override, as nerkit train's")
    args = parser.parse_args()
    config = load_config(args.config, ["data.limit=5000", *args.set])
    set_threads(args.threads)
    seed_everything(config.train.seed)
    started = time.perf_counter()
    splits = read_splits(config)
    pipe = build_pipeline(config, splits, torch.device("cpu"))
    examples = [pipe.featurizer.training_example(s) for s in splits.train]
    print(f"reading, vocabularies and features: {time.perf_counter() - started:.2f} s")
    model, optimizer = pipe.model.train(), make_optimizer(pipe.config, pipe.model)
    params = [p for p in model.parameters() if p.requires_grad]
    batches = bucketed_batches([len(e) for e in examples], config.train.batch_size,
                               random.Random(config.train.seed * 1000 + 1))
    spent, chars = dict.fromkeys(PHASES, 0.0), 0
    for i, idx in enumerate(batches[:WARMUP + args.steps]):
        if i == WARMUP:
            spent, chars = dict.fromkeys(PHASES, 0.0), 0
        marks = [time.perf_counter()]
        batch = collate([examples[j] for j in idx])
        marks.append(time.perf_counter())
        x = model.embedder(batch)
        marks.append(time.perf_counter())
        h = model.encoder(x, batch.mask)
        marks.append(time.perf_counter())
        emissions = model.emission(model.output_dropout(h))
        marks.append(time.perf_counter())
        optimizer.zero_grad(set_to_none=True)
        cut = emissions.detach().requires_grad_()  # the CRF's backward timed apart from the encoder's
        loss = model.crf.neg_log_likelihood(cut, batch.tag_ids, batch.mask, reduction="mean")
        marks.append(time.perf_counter())
        loss.backward()
        marks.append(time.perf_counter())
        emissions.backward(cut.grad)
        marks.append(time.perf_counter())
        torch.nn.utils.clip_grad_norm_(params, config.train.clip_norm)
        marks.append(time.perf_counter())
        optimizer.step()
        loss.item()
        marks.append(time.perf_counter())
        for phase, a, b in zip(PHASES, marks, marks[1:]):
            spent[phase] += b - a
        chars += int(batch.mask.sum())
    total = sum(spent.values())
    print(f"{args.steps} steps, {chars / args.steps:,.0f} chars a step, {chars / total:,.0f} chars/s, "
          f"{torch.get_num_threads()} threads")
    for phase, seconds in spent.items():
        print(f"  {phase:9s} {1000 * seconds / args.steps:7.2f} ms  {100 * seconds / total:5.1f}%")
    print(f"  {'total':9s} {1000 * total / args.steps:7.2f} ms")


if __name__ == "__main__":
    main()
