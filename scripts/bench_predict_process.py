"""`nerkit predict` as a user runs it, whole process (start-up and loading included), over the MSRA
test text: characters per second for each model and option, alone and beside a busy process.

Each model directory (a PyTorch one, an ONNX export) runs with each option set in turn, the sets
interleaved round by round so that a slow minute of a shared VM does not land on one of them. A
run's figure is the characters of the texts (line ends not counted) over the wall seconds of the
process; its peak RSS comes from the kernel (wait4). `--model DIR::TREE` runs DIR with the nerkit of
another checkout TREE (a `git worktree` of an older commit), to compare code in the same run.
`--beside-busy` runs each again one second after a busy process (a Python loop on one core, as
scripts/bench_auto_policy.py's) and reports what that process kept of its own rate. `--startup` adds a run over one line (start-up and loading alone).

    python scripts/bench_predict_process.py --model runs/msra_bilstm --model runs/msra_bilstm-onnx \\
        --options "" --options "--threads 1" --options "--workers 2" --rounds 3 --beside-busy --startup
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_auto_policy import beside_a_hog, environment, hog_alone, msra_test_text  # noqa: E402


def run_once(model: str, options: str, text: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one `nerkit predict` process (`DIR::TREE`: TREE's nerkit)."""
    model, _, tree = model.partition("::")
    cmd = [sys.executable, "-m", "nerkit", "--quiet", "predict", "--model", str(Path(model).resolve()), str(text),
           "--output", os.devnull, *shlex.split(options)]
    started = time.perf_counter()
    process = subprocess.Popen(cmd, env=environment("auto"), cwd=tree or None)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise SystemExit(f"{shlex.join(cmd)} exited with {process.returncode}")
    return seconds, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, help="A model directory (repeatable).")
    ap.add_argument("--options", action="append", default=None,
                    help='`nerkit predict` options of one set, quoted ("" for the defaults; repeatable).')
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--beside-busy", action="store_true", help="Also run each beside a busy process.")
    ap.add_argument("--startup", action="store_true", help="Also time each model over one line.")
    args = ap.parse_args()
    data = os.environ.get("NERKIT_DATA") or str(Path(__file__).resolve().parents[2] / "shared" / "data")
    work = Path(tempfile.mkdtemp())
    text, one_line = work / "msra_test.txt", work / "one_line.txt"
    chars = msra_test_text(data, text)
    lines = text.read_text(encoding="utf-8").splitlines()
    one_line.write_text(lines[0] + "\n", encoding="utf-8")
    option_sets = args.options or [""]
    solo_hog = hog_alone() if args.beside_busy else None
    print(f"{chars:,} characters in {len(lines):,} lines; "
          f"{os.cpu_count()} cores" + (f"; busy process alone {solo_hog:,.0f} iterations/s" if solo_hog else ""))
    seen: dict[tuple, list] = {}
    for round_ in range(args.rounds):
        for model in args.model:
            for options in option_sets:
                seconds, rss = run_once(model, options, text)
                seen.setdefault((model, options, "alone"), []).append((seconds, rss, None))
                print(f"round {round_ + 1} | {model} | {options or 'default'} | alone | {seconds:.2f} s | "
                      f"{chars / seconds:,.0f} chars/s | {rss:.0f} MiB", flush=True)
                if args.beside_busy:
                    (seconds, rss), hog = beside_a_hog(lambda: run_once(model, options, text), seconds=600.0)
                    seen.setdefault((model, options, "beside a busy process"), []).append((seconds, rss, hog / solo_hog))
                    print(f"round {round_ + 1} | {model} | {options or 'default'} | beside busy | {seconds:.2f} s | "
                          f"{chars / seconds:,.0f} chars/s | {rss:.0f} MiB | busy keeps {hog / solo_hog:.2f}", flush=True)
    if args.startup:
        for model in args.model:
            seconds = [run_once(model, "", one_line)[0] for _ in range(3)]
            print(f"start-up | {model} | one line | {', '.join(f'{s:.2f}' for s in seconds)} s")
    print("\n| model | options | where | seconds (runs) | chars/s (median) | peak RSS MiB | busy process keeps |")
    print("|---|---|---|---|---:|---:|---:|")
    for (model, options, where), runs in seen.items():
        median = statistics.median(s for s, _, _ in runs)
        keeps = [k for _, _, k in runs if k is not None]
        print(f"| {model} | {options or 'default'} | {where} | {', '.join(f'{s:.2f}' for s, _, _ in runs)} | "
              f"{chars / median:,.0f} | {max(r for _, r, _ in runs):.0f} | "
              f"{', '.join(f'{k:.2f}' for k in keeps) if keeps else ''} |")


if __name__ == "__main__":
    main()
