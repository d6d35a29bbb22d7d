"""PyTorch against its ONNX export, side by side (issue 30, section 2): for each runtime, in a fresh
process of its own, the model is loaded and evaluated on a gold file (the one evaluation path), and
the script reports F1, prediction speed in characters per second (loading excluded), the time to
load, and the process's peak resident memory (loading included; an ONNX process never imports torch);
then, in one process, how many sentences of the file get exactly the PyTorch model's tags from each
export, and the largest difference of their emissions.

    python scripts/bench_export.py --model runs/msra_bilstm [--onnx DIR] [--int8 DIR]
        [--data ${NERKIT_DATA}/msra/test.char.bmes] [--threads 1] [--batch-size 128] [--repeat 3] [--bf16]

Missing exports are written first (`nerkit export`, and `--quantize int8`) into DIR-onnx and
DIR-int8 beside the model. `--bf16` adds the PyTorch model under bf16 autocast (meant for a
language model's features, which then run as `embeddings.lm.bf16: true` runs them; the other
PyTorch row runs them in float32 whatever the config says; the CPU must support bf16 to gain
anything). Rows run one after the
other; each process predicts the file `--repeat` times and keeps its fastest pass. Prints one JSON
line per runtime and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(os.environ.get("NERKIT_DATA") or Path(__file__).resolve().parent.parent.parent / "shared" / "data")


def measure(model: str, data: str, threads: int, batch_size: int, repeat: int, bf16: bool) -> dict:
    """In this process: load `model`, evaluate it on `data` `repeat` times; F1, the fastest pass's
    characters per second, load seconds, peak RSS."""
    import nerkit
    from nerkit.data.splits import read_gold
    from nerkit.inference.loading import load_pipeline

    started = time.perf_counter()
    pipe = load_pipeline(model, threads=threads)
    loaded = time.perf_counter() - started
    sentences = read_gold(data, pipe.config.data.repair, "").sentences
    chars = sum(len(s) for s in sentences)
    lm = getattr(getattr(pipe, "model", None), "lm", None)
    for source in (lm.sources if lm is not None else ()):  # the row says the precision, not the config
        source.bf16 = bf16
    best, metrics = float("inf"), None
    for _ in range(repeat):
        if bf16 and lm is None:
            import torch

            with torch.autocast("cpu", dtype=torch.bfloat16):
                result = pipe.predict_and_score(sentences, batch_size)
        else:
            result = pipe.predict_and_score(sentences, batch_size)
        best, metrics = min(best, result.seconds), result.metrics
    return {"model": model, "runtime": type(pipe).__name__ + (" bf16" if bf16 else ""), "f1": round(100 * metrics["f1"], 2),
            "chars": chars, "chars_per_s": round(chars / best), "load_s": round(loaded, 2),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "torch_imported": "torch" in sys.modules, "threads": threads, "nerkit": nerkit.__version__}


def agreement(model: str, exports: list[str], data: str, batch_size: int) -> dict:
    """Each export's graph against the PyTorch model (its language model, if any, in float32 as the
    graph runs it) on every sentence of `data`: the graph itself on the sentences it reads whole, in
    batches of similar lengths (identical tag sequences, the largest emission difference); a sentence
    longer than a language model's window, which neither runtime reads whole, through each runtime's
    windows and stitching (identical spans)."""
    from nerkit.data.splits import read_gold
    from nerkit.features.padding import bucketed_batches
    from nerkit.inference.loading import load_pipeline
    from nerkit.tools.export import compare

    pipe = load_pipeline(model, threads=0)
    for source in pipe.model.lm_sources():
        source.bf16 = False
    tokens = [s.tokens for s in read_gold(data, pipe.config.data.repair, "").sentences]
    found = {"sentences": len(tokens)}
    for export in exports:
        runtime = load_pipeline(export, threads=0)
        limit = runtime.max_length or max(map(len, tokens))
        whole = [t for t in tokens if len(t) <= limit]
        longer = [t for t in tokens if len(t) > limit]
        same = difference = 0.0
        for idx in bucketed_batches([len(t) for t in whole], batch_size):
            result = compare(pipe, runtime.session, [whole[i] for i in idx])
            same += result["same_tags"] * result["sentences"]
            difference = max(difference, result["max_emission_difference"])
        windowed = sum(a == b for a, b in zip(runtime.predict_tokens(longer, window=limit),
                                              pipe.predict_tokens(longer, window=limit)))
        found[export] = {"identical_tags": int(round(same)), "max_emission_difference": difference,
                         "whole": len(whole), "longer": len(longer), "longer_identical_spans": windowed}
    return found


def run_worker(model: str, args, bf16: bool = False) -> dict:
    command = [sys.executable, __file__, "--worker", "--model", model, "--data", args.data, "--threads", str(args.threads),
               "--batch-size", str(args.batch_size), "--repeat", str(args.repeat)] + (["--bf16"] if bf16 else [])
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def ensure_export(model: str, target: str, quantize: str | None) -> str:
    if not Path(target, "nerkit.json").is_file():
        subprocess.run([sys.executable, "-m", "nerkit", "--quiet", "export", "--model", model, "--out", target]
                       + (["--quantize", quantize] if quantize else []), check=True, stdout=subprocess.DEVNULL)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model directory written by nerkit train")
    parser.add_argument("--onnx", help="its ONNX export (default: MODEL-onnx, written if missing)")
    parser.add_argument("--int8", help="its int8 export (default: MODEL-int8, written if missing)")
    parser.add_argument("--data", default=str(DATA / "msra" / "test.char.bmes"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bf16", action="store_true", help="also the PyTorch model under bf16 autocast")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.model, args.data, args.threads, args.batch_size, args.repeat, args.bf16)))
        return
    model = args.model.rstrip("/")
    onnx = ensure_export(model, args.onnx or f"{model}-onnx", None)
    int8 = ensure_export(model, args.int8 or f"{model}-int8", "int8")
    rows = [run_worker(model, args)] + ([run_worker(model, args, bf16=True)] if args.bf16 else []) + \
        [run_worker(onnx, args), run_worker(int8, args)]
    for row in rows:
        print(json.dumps(row))
    agreed = agreement(model, [onnx, int8], args.data, args.batch_size)
    print(json.dumps(agreed))
    base = rows[0]
    print(f"\n{Path(args.data).name}, {base['chars']:,} characters, {args.threads} thread(s), batch {args.batch_size}\n")
    print("| runtime | F1 | chars/s | vs PyTorch | load (s) | peak RSS (MiB) | torch imported |")
    print("|---|---:|---:|---:|---:|---:|---|")
    names = ["PyTorch fp32"] + (["PyTorch bf16"] if args.bf16 else []) + ["ONNX Runtime fp32", "ONNX Runtime int8"]
    for name, row in zip(names, rows):
        print(f"| {name} | {row['f1']:.2f} | {row['chars_per_s']:,} | {row['chars_per_s'] / base['chars_per_s']:.2f}x "
              f"| {row['load_s']:.2f} | {row['peak_rss_mib']:,} | {'yes' if row['torch_imported'] else 'no'} |")
    for name, export in (("fp32", onnx), ("int8", int8)):
        a = agreed[export]
        print(f"\n{name}: {a['identical_tags']:,} of the {a['whole']:,} sentences the graph reads whole with the "
              f"PyTorch model's tags, emissions within {a['max_emission_difference']:.1e}", end="")
        if a["longer"]:
            print(f"; {a['longer_identical_spans']:,} of the {a['longer']:,} longer ones with its spans "
                  "(windows and stitching)", end="")
    print()


if __name__ == "__main__":
    main()
