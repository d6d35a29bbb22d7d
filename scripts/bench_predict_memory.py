"""Memory of prediction in one process (issue 33, item 3): the resident set size after each of many
chunks of texts of different lengths, predicted one after the other through the Python API. Memory
that grows with every new chunk (a native cache keyed by the batch's shape, heap fragmentation)
shows as a rising series; bounded memory as a flat one once the first chunks have run.

    python scripts/bench_predict_memory.py [--model runs/demo] [--chunks 40] [--lines 600]
        [--data ${NERKIT_DATA}/msra/test.char.bmes] [--threads 1] [--batch-size 64] [--seed 1] [--window N]

Each chunk holds `--lines` lines made of 1 to 4 consecutive sentences of the gold file's text
(joined without separator), drawn at random: every chunk brings batches of lengths the ones before
did not. Prints one line per chunk (its number, characters, RSS in MiB, the distinct batch shapes
(B, T) the model has seen so far) and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

DATA = Path(os.environ.get("NERKIT_DATA") or Path(__file__).resolve().parent.parent.parent / "shared" / "data")


def rss_mib() -> float:
    """This process's resident set size now, in MiB (Linux)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def chunks_of_text(data: Path, chunks: int, lines: int, seed: int) -> list[list[str]]:
    from nerkit.data.corpus import read_corpus

    sentences = [s.text for s in read_corpus(data).sentences]
    rnd = random.Random(seed)
    found = []
    for _ in range(chunks):
        chunk = []
        for _ in range(lines):
            start, count = rnd.randrange(len(sentences)), rnd.randint(1, 4)
            chunk.append("".join(sentences[start:start + count]))
        found.append(chunk)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/demo")
    parser.add_argument("--data", default=str(DATA / "msra" / "test.char.bmes"))
    parser.add_argument("--chunks", type=int, default=40)
    parser.add_argument("--lines", type=int, default=600)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--window", type=int, default=None, help="the prediction window (default: the model's)")
    args = parser.parse_args()

    import torch

    import nerkit

    torch.set_num_threads(args.threads)
    chunks = chunks_of_text(Path(args.data), args.chunks, args.lines, args.seed)
    pipe = nerkit.load(args.model)
    shapes, decode = set(), pipe.model.decode

    def counted_decode(batch):  # the shapes the model is run on: a native cache keeps one entry each
        shapes.add(tuple(batch.char_ids.shape))
        return decode(batch)

    pipe.model.decode = counted_decode
    before = rss_mib()
    print(f"model loaded: {before:.0f} MiB", flush=True)
    series, started = [], time.perf_counter()
    for number, texts in enumerate(chunks, 1):
        pipe.predict(texts, batch_size=args.batch_size, window=args.window)
        series.append(round(rss_mib(), 1))
        print(f"chunk {number:3d}  {sum(map(len, texts)):7,d} chars  RSS {series[-1]:7.1f} MiB  "
              f"{len(shapes):5,d} shapes", flush=True)
    summary = {"model": args.model, "window": pipe.check_window(args.window), "threads": args.threads, "chunks": args.chunks, "lines": args.lines,
               "loaded_mib": round(before, 1), "first_mib": series[0], "last_mib": series[-1],
               "max_mib": max(series), "growth_after_first_mib": round(series[-1] - series[0], 1), "batch_shapes": len(shapes),
               "seconds": round(time.perf_counter() - started, 1), "torch": torch.__version__}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
