"""The LAC-small port (nerkit/lac.py) on its own, scored on MSRA test: LAC tags every character
with a word class, and its PER, LOC and ORG words become NR, NS and NT entities (its other
classes, TIME included, are outside), scored by nerkit's one entity scorer. A wrong gate order,
weight layout or direction takes F1 near zero, so this checks the port end to end.

    python scripts/lac_msra.py [--lac lm/lac-small] [--data FILE] [--jieba-lookup] [--threads 1]

Without --lac the model is read from the installed jieba's Paddle files. --jieba-lookup looks
characters up as jieba's own reader does (no folding of full-width forms, upper case and CJK
punctuation), which reproduces jieba's paddle mode.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from nerkit.data.corpus import read_corpus
from nerkit.errors import UserError
from nerkit.inference.evaluate import format_table, score
from nerkit.pretrained.lac import LACVocab, lac_spans, tag_sentences
from nerkit.pretrained.lac_files import load_tagger
from nerkit.pretrained.paddle import read_jieba_lac


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lac", type=Path, help="an exported LAC directory (default: jieba's files)")
    parser.add_argument("--data", type=Path, help="a corpus with NR/NS/NT entities "
                        "(default: $NERKIT_DATA/msra/test.char.bmes)")
    parser.add_argument("--jieba-lookup", action="store_true", help="look characters up as jieba does (no folding)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    try:
        data = args.data or Path(os.environ.get("NERKIT_DATA", "data")) / "msra" / "test.char.bmes"
        sentences = read_corpus(data).sentences
        tagger, vocab, tags = load_tagger(args.lac) if args.lac else read_jieba_lac()
    except UserError as error:
        print(f"lac_msra: error: {error}", file=sys.stderr)
        return 2
    vocab = LACVocab(vocab.entries, fold=not args.jieba_lookup)
    started = time.perf_counter()
    predicted = tag_sentences(tagger, vocab, tags, [s.tokens for s in sentences], args.batch_size)
    seconds = time.perf_counter() - started
    metrics = score([s.spans() for s in sentences], [lac_spans(p) for p in predicted])
    characters = sum(len(s) for s in sentences)
    print(format_table(metrics))
    print(f"{data}: {len(sentences):,} sentences, {characters:,} characters tagged in {seconds:.1f} s "
          f"({characters / seconds:,.0f} chars/s, {args.threads} thread(s)); characters "
          f"{'as jieba looks them up' if args.jieba_lookup else 'folded as LAC was trained'}")
    print(f"P {100 * metrics['precision']:.2f}  R {100 * metrics['recall']:.2f}  F1 {100 * metrics['f1']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
