"""Peak memory and time of `Pipeline.predict` on one long text, three ways, with the same weights:

* `memory`: a TENER with Transformer-XL memory reads the text segment by segment and the CRF settles
  tags as they come (nerkit.inference.recurrence): what `nerkit predict` does with a memory model.
* `memory-whole`: the same model decoding the text at once (features, emissions and the CRF's
  back-pointers of the whole text held together): what prediction did before the streamed reading.
* `windows`: the same weights without memory, the text read in overlapping windows of `--window`
  characters that are stitched, as `nerkit predict` reads a model without memory.

Random weights (TenerOptions' defaults: TENER's MSRA sizes) over a vocabulary from
the test fixtures, the emission of O raised so that about as few characters are in entities as in real
text (the output, which does grow with the entities found, stays small): what is measured is how
memory and time grow with the length, not accuracy. Each
(mode, length) runs in its own process, so that its peak RSS is its own; the baseline row is the same
process with the model built and nothing predicted.

    python scripts/bench_xl_memory.py [--lengths 1000,10000,100000,1000000] [--segment 128] [--memory 128]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tiny_train.bio"
MODES = ("baseline", "memory", "memory-whole", "windows")


def build(memory: int, segment: int):
    import torch

    from nerkit.config import build_config
    from nerkit.data.corpus import read_corpus
    from nerkit.data.tags import scheme_tags
    from nerkit.features.featurizer import Featurizer
    from nerkit.inference.pipeline import Pipeline

    corpus = read_corpus(FIXTURE)
    raw = {"data": {"train": str(FIXTURE)},
           "encoder": {"name": "transformer", "attention": "tener", "memory": memory, "segment": segment if memory else 0,
                       "dropout": 0.0, "attn_dropout": 0.0}}
    config = build_config(raw, "<bench>")
    featurizer = Featurizer.build(config, corpus.sentences, scheme_tags(corpus.types, corpus.scheme))
    torch.manual_seed(0)
    pipe = Pipeline(config, featurizer)
    with torch.no_grad():  # mostly O, as in real text: the output stays small beside what is measured
        pipe.model.emission.bias[featurizer.tags.index("O")] += 1.5
    return pipe, featurizer


def one(mode: str, length: int, segment: int, memory: int, window: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    pipe, featurizer = build(memory if mode.startswith("memory") else 0, segment)
    rng = random.Random(0)
    chars = featurizer.chars.tokens[2:]
    text = "".join(rng.choice(chars) for _ in range(length))
    started = time.perf_counter()
    if mode == "memory":
        found = pipe.predict(text)[0]
    elif mode == "memory-whole":
        from nerkit.features.batch import collate

        pipe.model.eval()
        with torch.inference_mode():
            tags = pipe.model.decode(collate([featurizer.example(list(text))]))[0]
        found = pipe.spans_of(text, tags)
    elif mode == "windows":
        found = pipe.predict(text, window=window)[0]
    else:
        found = []
    seconds = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"mode": mode, "length": length, "seconds": round(seconds, 3), "peak_rss_mib": round(peak_mib, 1),
            "chars_per_s": round(length / seconds) if seconds and length else 0, "entities": len(found)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lengths", default="1000,10000,100000,1000000")
    ap.add_argument("--segment", type=int, default=128)
    ap.add_argument("--memory", type=int, default=128)
    ap.add_argument("--window", type=int, default=250)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--modes", default=",".join(MODES[1:]))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        mode, length = args.one.split(":")
        print(json.dumps(one(mode, int(length), args.segment, args.memory, args.window, args.threads)))
        return
    print("| length | mode | seconds | chars/s | peak RSS (MiB) | entities |\n|---:|---|---:|---:|---:|---:|")
    runs = [("baseline", 0)] + [(mode, int(n)) for n in args.lengths.split(",") for mode in args.modes.split(",")]
    for mode, length in runs:
        done = subprocess.run([sys.executable, __file__, "--one", f"{mode}:{length}", "--segment", str(args.segment),
                               "--memory", str(args.memory), "--window", str(args.window),
                               "--threads", str(args.threads)], capture_output=True, text=True)
        if done.returncode:
            print(f"| {length:,} | {mode} | failed: {done.stderr.strip().splitlines()[-1]} | | | |", flush=True)
            continue
        r = json.loads(done.stdout)
        print(f"| {length:,} | {mode} | {r['seconds']} | {r['chars_per_s']:,} | {r['peak_rss_mib']} | {r['entities']:,} |",
              flush=True)


if __name__ == "__main__":
    main()
