"""How a model with Transformer-XL memory reads the right edge of a segment, and what a look-ahead
margin (characters encoded with a segment but emitted by the next, `MemoryReader(margin=...)`) buys:
on a gold corpus, entity F1 overall and on sentences longer than `--long` characters, for each
margin, beside the same model reading in windows; and the error rate of characters by their place
in the segment (does the last character of a segment, which sees nothing to its right, go wrong
more often than the rest?).

    python scripts/bench_xl_margin.py --model runs/M --data $NERKIT_DATA/msra/test.char.bmes \
        [--margins 0,8,16,32] [--windows 64,250]
"""

from __future__ import annotations

import argparse
import time

from nerkit.data.corpus import read_corpus
from nerkit.data.tags import spans_to_tags
from nerkit.inference.evaluate import score
from nerkit.inference.pipeline import Pipeline
from nerkit.inference.recurrence import MemoryReader


def f1(gold: list, predicted: list) -> float:
    return round(100 * score(gold, predicted)["f1"], 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--margins", default="0,8,16,32")
    ap.add_argument("--windows", default="64,250")
    ap.add_argument("--long", type=int, default=250)
    args = ap.parse_args()
    pipe = Pipeline.load(args.model)
    segment = pipe.config.encoder.options.segment
    corpus = read_corpus(args.data)
    sentences = corpus.sentences
    gold = [s.spans() for s in sentences]
    is_long = [len(s) > args.long for s in sentences]
    tokens = [s.tokens for s in sentences]
    short_spans = pipe.predict_tokens([t if len(t) <= segment else [] for t in tokens])  # the same for every margin
    print(f"model {args.model}: segment {segment}, memory {pipe.config.encoder.options.memory}; "
          f"{len(sentences)} sentences, {sum(len(t) > segment for t in tokens)} longer than a segment, "
          f"{sum(is_long)} longer than {args.long} characters ({sum(len(g) for g, x in zip(gold, is_long) if x)} "
          f"of {sum(len(g) for g in gold)} entities)\n")
    print(f"| reading | F1 | F1 on sentences > {args.long} | seconds |\n|---|---:|---:|---:|")
    by_place = None
    for margin in [int(m) for m in args.margins.split(",")]:
        reader = MemoryReader(pipe, margin=margin)
        started = time.perf_counter()
        predicted = list(short_spans)
        errors, counts = [0] * segment, [0] * segment
        for i, t in enumerate(tokens):
            if len(t) <= segment:
                continue
            tag_ids = reader.read(t)
            predicted[i] = pipe.spans_of(t, tag_ids)
            gold_tags = spans_to_tags(len(t), gold[i], pipe.scheme)
            for position, (tag_id, right) in enumerate(zip(tag_ids, gold_tags)):
                counts[position % segment] += 1
                errors[position % segment] += pipe.tags[tag_id] != right
        seconds = time.perf_counter() - started
        long_gold = [g for g, x in zip(gold, is_long) if x]
        long_predicted = [p for p, x in zip(predicted, is_long) if x]
        print(f"| memory, margin {margin} | {f1(gold, predicted)} | {f1(long_gold, long_predicted)} | {seconds:.1f} |",
              flush=True)
        if margin == 0:
            by_place = (errors, counts)
    for window in [int(w) for w in args.windows.split(",")]:
        started = time.perf_counter()
        predicted = pipe.predict_tokens(tokens, window=window)
        seconds = time.perf_counter() - started
        long_gold = [g for g, x in zip(gold, is_long) if x]
        long_predicted = [p for p, x in zip(predicted, is_long) if x]
        print(f"| windows of {window} (no memory across them) | {f1(gold, predicted)} | "
              f"{f1(long_gold, long_predicted)} | {seconds:.1f} |", flush=True)
    errors, counts = by_place
    print(f"\nCharacter tag errors by place in the segment (margin 0, sentences longer than a segment; "
          f"{sum(counts):,} characters):\n")
    print("| places | characters | tag error % |\n|---|---:|---:|")
    edges = sorted({0, 1, segment // 8, segment // 2, segment - segment // 8, segment - 1, segment})
    for a, b in zip(edges, edges[1:]):
        n, e = sum(counts[a:b]), sum(errors[a:b])
        print(f"| {a}..{b - 1} | {n:,} | {100 * e / n if n else 0:.2f} |")


if __name__ == "__main__":
    main()
