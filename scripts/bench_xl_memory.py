"""Peak memory and time of a Transformer encoder reading one long text: with Transformer-XL's memory
(segment by segment, nerkit.model.encoders.transformer) against the same encoder without memory
reading the text in overlapping windows, as `nerkit predict` does (windows of `--window` characters
that overlap by half). Encoder forward passes only, random weights and inputs (TENER's MSRA sizes):
what is measured is how memory and time grow with the length, not accuracy. Each (mode, length) runs
in its own process, so that its peak RSS is its own.

    python scripts/bench_xl_memory.py [--lengths 1000,10000,100000,1000000] [--segment 128] [--memory 128]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def one(mode: str, length: int, segment: int, memory: int, window: int, threads: int) -> dict:
    import torch

    from nerkit.config import TenerOptions
    from nerkit.inference.windows import text_windows
    from nerkit.model.encoders.transformer import Transformer

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    options = TenerOptions(dropout=0.0, attn_dropout=0.0, memory=memory if mode == "memory" else 0,
                           segment=segment if mode == "memory" else 0)
    encoder = Transformer(100, options).eval()
    x = torch.randn(1, length, 100)
    started = time.perf_counter()
    with torch.no_grad():
        if mode == "memory":
            out = encoder(x, torch.ones(1, length, dtype=torch.bool))
            rows = out.size(1)
        else:
            rows = 0
            spans = text_windows(length, window)
            for k in range(0, len(spans), 64):  # 64 windows a batch, as a prediction batch
                batch = torch.stack([x[0, a:b] for a, b in spans[k:k + 64]])
                rows += encoder(batch, torch.ones(batch.shape[:2], dtype=torch.bool)).size(0)
    seconds = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"mode": mode, "length": length, "seconds": round(seconds, 3), "peak_rss_mib": round(peak_mib, 1),
            "chars_per_s": round(length / seconds)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lengths", default="1000,10000,100000,1000000")
    ap.add_argument("--segment", type=int, default=128)
    ap.add_argument("--memory", type=int, default=128)
    ap.add_argument("--window", type=int, default=250)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        mode, length = args.one.split(":")
        print(json.dumps(one(mode, int(length), args.segment, args.memory, args.window, args.threads)))
        return
    print("| length | mode | seconds | chars/s | peak RSS (MiB) |\n|---:|---|---:|---:|---:|")
    for length in [int(n) for n in args.lengths.split(",")]:
        for mode in ("memory", "windows"):
            done = subprocess.run([sys.executable, __file__, "--one", f"{mode}:{length}", "--segment", str(args.segment),
                                   "--memory", str(args.memory), "--window", str(args.window),
                                   "--threads", str(args.threads)], capture_output=True, text=True, check=True)
            r = json.loads(done.stdout)
            print(f"| {length:,} | {mode} | {r['seconds']} | {r['chars_per_s']:,} | {r['peak_rss_mib']} |", flush=True)


if __name__ == "__main__":
    main()
