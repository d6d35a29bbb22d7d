"""Prediction throughput with worker processes (`nerkit predict --workers N`): characters per second
with 1 and 2 workers (by default), each with one torch thread, on the text of MSRA's test set,
measured in one run, in turns, so that the ratio is meaningful on a noisy machine. Also checks that
every run wrote the same bytes.

    python scripts/bench_predict_workers.py [--model runs/msra_bilstm] [--workers 1,2] [--rounds 3]
        [--data ${NERKIT_DATA}/msra/test.char.bmes] [--chars N] [--copies K] [--threads-per-worker 1]

Without --model a model is trained first, in seconds: configs/msra_bilstm.yaml on its first 2,000
training sentences for 30 steps; its sizes are the config's, which is what prediction's speed
depends on (its vocabulary is smaller, and its entities poor). chars/s counts prediction alone,
from the first line read to the last record written; the workers' start (each loads the model) is
reported on its own, as `start_s`.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from nerkit.data.corpus import read_corpus
from nerkit.inference.pipeline import Pipeline
from nerkit.inference.stream import predict_stream
from nerkit.inference.workers import Workers

DATA = Path(os.environ.get("NERKIT_DATA") or Path(__file__).resolve().parent.parent / "data")


def quick_model(out: Path) -> Path:
    import logging

    from nerkit.config import load_config
    from nerkit.training.loop import train

    logging.getLogger("nerkit").setLevel(logging.ERROR)  # not the note on how to resume the short run
    config = load_config(Path(__file__).resolve().parent.parent / "configs" / "msra_bilstm.yaml",
                         ["data.limit=2000", "train.epochs=1", "train.max_steps=30", "data.test=null",
                          "train.threads=1"])
    train(config, out=out)
    return out


def write_texts(data: Path, path: Path, chars: int, copies: int) -> int:
    """The texts of the gold file `data`, one per line (the first `chars` characters' worth, when
    given), `copies` times over; returns the number of characters."""
    texts, total = [], 0
    for sentence in read_corpus(data).sentences:
        if chars and total >= chars:
            break
        texts.append(sentence.text)
        total += len(sentence.text)
    path.write_text("".join(t + "\n" for t in texts) * copies, encoding="utf-8")
    return total * copies


def run(model: Path, workers: int, threads: int, source: Path, output: Path, pipe: Pipeline) -> tuple[float, float]:
    """(seconds to start the workers, seconds to predict `source` into `output`)."""
    if workers == 1:  # in this process, as `--workers 1` does
        torch.set_num_threads(threads)
        started = time.perf_counter()
        predict_stream(pipe, str(source), str(output))
        return 0.0, time.perf_counter() - started
    started = time.perf_counter()
    with Workers(model, workers, threads=threads * workers) as pool:
        ready = time.perf_counter()
        predict_stream(pool, str(source), str(output))
        done = time.perf_counter()
    return ready - started, done - ready


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="a model directory (default: train a quick one)")
    ap.add_argument("--data", type=Path, default=DATA / "msra" / "test.char.bmes", help="gold file whose text is read")
    ap.add_argument("--chars", type=int, default=0, help="only the first N characters' sentences (0 = all)")
    ap.add_argument("--copies", type=int, default=1, help="the text this many times over")
    ap.add_argument("--workers", default="1,2", help="worker counts to compare, e.g. 1,2,4")
    ap.add_argument("--threads-per-worker", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="each count this many times, in turns; the best is kept")
    args = ap.parse_args()
    counts = [int(n) for n in args.workers.split(",")]

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = args.model or quick_model(tmp / "model")
        source = tmp / "texts.txt"
        chars = write_texts(args.data, source, args.chars, args.copies)
        torch.set_num_threads(args.threads_per_worker)
        pipe = Pipeline.load(model)
        best: dict[int, tuple[float, float]] = {}
        outputs: dict[int, bytes] = {}
        for _ in range(args.rounds):
            for count in counts:
                start_s, predict_s = run(model, count, args.threads_per_worker, source, tmp / "out.jsonl", pipe)
                outputs[count] = (tmp / "out.jsonl").read_bytes()
                if count not in best or predict_s < best[count][1]:
                    best[count] = (start_s, predict_s)
        same = len(set(outputs.values())) == 1

    base = chars / best[counts[0]][1]
    print(f"{chars:,} characters, {len(counts)} worker counts, best of {args.rounds}, "
          f"{args.threads_per_worker} torch thread(s) per worker, {os.cpu_count()} cores; outputs identical: {same}")
    for count in counts:
        start_s, predict_s = best[count]
        print(f"workers {count}: {chars / predict_s:12,.0f} chars/s  x{chars / predict_s / base:.2f}  "
              f"(predict {predict_s:.2f} s, start {start_s:.2f} s)")
    print(json.dumps({"chars": chars, "model": str(args.model or "quick"), "same_output": same,
                      "results": [{"workers": c, "chars_per_s": round(chars / best[c][1]), "predict_s": round(best[c][1], 3),
                                   "start_s": round(best[c][0], 3)} for c in counts]}))
    if not same:
        raise SystemExit("the worker counts wrote different outputs")


if __name__ == "__main__":
    main()
