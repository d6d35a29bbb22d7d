"""Peak memory and time of one training pass (forward + backward) of the FLAT encoder: nerkit's
implementation against a naive one that materialises every pair as the official code does (the
(B, L, L, 4 d_model) concatenation, W_r applied per pair, W_R R_ij per pair), same model and weights.

    .venv/bin/python scripts/bench_flat.py                       # CPU, the cases below
    .venv/bin/python scripts/bench_flat.py --device cuda --cap-gb 60

Lattices are real: windows of N consecutive characters of the MSRA test set
($NERKIT_DATA/msra/test.char.bmes, else ../shared/data; read at run time, never copied) matched
against jieba's dictionary with no cap on words. Each case runs in a fresh subprocess: on the CPU
its peak memory is the process's peak resident set during the pass (VmHWM, reset through
/proc/self/clear_refs just before it; ru_maxrss would also count the parent's memory, which a child
inherits at exec) less its resident set before it; on CUDA, torch.cuda.max_memory_allocated over
the memory allocated before the pass. A case whose predicted memory exceeds --cap-gb is not run
and is reported as "would need X GB". Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from nerkit.config import FLATOptions
from nerkit.model.encoders import LatticeWords
from nerkit.model.encoders.flat import FLAT, LatticePositions

REPO = Path(__file__).resolve().parent.parent
INPUT_DIM, WORD_DIM = 100, 50  # char 50 + bigram 50, words 50: the paper's embedding sizes
CASES = [(100, 10), (200, 10), (400, 10), (1500, 10), (400, 1), (1500, 1)]  # (characters, batch)
# Bytes per (pair x d_model) at the peak, to predict a case's memory and skip it over the cap, until
# the largest case measured so far gives its own figure: the naive pass holds about 11 float32 tensors
# of (B, L, L, d_model) at its peak; nerkit a few (B, H, L, L) attention maps, H = d_model / 20.
PRIOR_BYTES = {"naive": 44.0, "nerkit": 1.0}


class NaivePositions(nn.Module):
    """The official code's position term (V0/modules.py, Four_Pos_Fusion_Embedding and the attention's
    B + D), with the parameters of a `LatticePositions`: sinusoid rows gathered for every pair and
    distance, concatenated, W_r and ReLU per pair, W_R per pair, then (q + v) . (W_R R_ij)."""

    def __init__(self, efficient: LatticePositions):
        super().__init__()
        self.efficient = efficient  # shares its parameters and sinusoid table

    def logits(self, q: torch.Tensor, spans) -> torch.Tensor:
        m = self.efficient
        batch, n_heads, length, head_dim = q.shape
        span = int(torch.maximum(spans.heads.max(), spans.tails.max())) + 1
        table = m.sinusoids(-(span - 1), span, like=q)  # (2S-1, D)
        ends = {"h": spans.heads, "t": spans.tails}
        encodings = [table[ends[name[0]][:, :, None] - ends[name[1]][:, None, :] + span - 1]  # (B, L, L, D)
                     for name in m.distances]
        relative = torch.relu(m.fusion(torch.cat(encodings, dim=-1)))  # (B, L, L, D) from (B, L, L, 4D)
        projected = m.projection(relative).view(batch, length, length, n_heads, head_dim)  # W_R R_ij
        position_q = q + m.position_bias[:, None, :]  # (B, H, L, d)
        return torch.einsum("bhid,bijhd->bhij", position_q, projected)

    def values(self, weights):
        return None


def build(impl: str, chunk: int | None = None, seed: int = 0) -> FLAT:
    torch.manual_seed(seed)
    config = FLATOptions() if chunk is None else FLATOptions(attention_chunk=chunk)
    encoder = FLAT(INPUT_DIM, config, word_dim=WORD_DIM)
    if impl == "naive":
        for layer in encoder.layers:
            layer.attention.positions = NaivePositions(layer.attention.positions)
    return encoder


def make_inputs(spec: dict, device, dtype=torch.float32, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    batch, chars = len(spec["heads"]), spec["chars"]
    width = max(1, max(len(h) for h in spec["heads"]))
    x = torch.randn(batch, chars, INPUT_DIM, generator=generator, dtype=dtype)
    words = torch.randn(batch, width, WORD_DIM, generator=generator, dtype=dtype)
    heads = torch.zeros(batch, width, dtype=torch.long)
    tails = torch.zeros(batch, width, dtype=torch.long)
    for b, (h, t) in enumerate(zip(spec["heads"], spec["tails"])):
        heads[b, : len(h)], tails[b, : len(t)] = torch.tensor(h, dtype=torch.long), torch.tensor(t, dtype=torch.long)
    word_mask = torch.arange(width)[None, :] < torch.tensor([len(h) for h in spec["heads"]])[:, None]
    mask = torch.ones(batch, chars, dtype=torch.bool)
    readout = torch.randn(batch, chars, 160, generator=generator, dtype=dtype)
    to = lambda t: t.to(device)  # noqa: E731
    return to(x), to(mask), LatticeWords(to(words), to(heads), to(tails), to(word_mask)), to(readout)


def resident_bytes(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+) kB", f.read()).group(1)) * 1024


def reset_peak_resident() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set (Linux >= 4.0)


def child(spec_path: str, impl: str, device: str, reps: int, chunk: int | None) -> None:
    """One case in this fresh process: print {"peak_bytes", "ms"} as JSON."""
    spec = json.loads(Path(spec_path).read_text())
    device = torch.device(device)
    encoder = build(impl, chunk).to(device).train()
    x, mask, lattice, readout = make_inputs(spec, device)
    cuda = device.type == "cuda"

    def one_pass() -> float:
        encoder.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        (encoder(x, mask, lattice) * readout).sum().backward()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        reset_peak_resident()
        before = resident_bytes()
    times = [one_pass()]
    if cuda:
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = resident_bytes("VmHWM") - before
    while len(times) < reps and sum(times) < 60:  # the first pass pays one-time costs: keep it out if we can
        times.append(one_pass())
    steady = times[1:] or times
    print(json.dumps({"peak_bytes": peak, "ms": 1000 * statistics.median(steady)}))


def read_text(path: Path) -> str:
    from nerkit.data.corpus import read_corpus

    return "".join(s.text for s in read_corpus(path).sentences)


def lattice_spec(text: str, lexicon, chars: int, batch: int) -> dict:
    """`batch` windows of `chars` consecutive characters, spread over the text, and their lattices."""
    from nerkit.features.lexicon import build_lattice

    heads, tails = [], []
    for b in range(batch):
        start = b * (len(text) - chars) // max(1, batch)
        lattice = build_lattice(text[start : start + chars], lexicon, max_words=None)
        heads.append(lattice.word_heads)
        tails.append(lattice.word_tails)
    return {"chars": chars, "heads": heads, "tails": tails}


def check_same_model(spec: dict) -> float:
    """Largest difference between the two implementations' outputs (float64, the first two sentences)."""
    small = {"chars": spec["chars"], "heads": spec["heads"][:2], "tails": spec["tails"][:2]}
    outputs = []
    for impl in ("nerkit", "naive"):
        encoder = build(impl).double().eval()
        x, mask, lattice, _ = make_inputs(small, "cpu", dtype=torch.float64)
        with torch.no_grad():
            outputs.append(encoder(x, mask, lattice))
    return float((outputs[0] - outputs[1]).abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.environ.get("NERKIT_DATA") or REPO.parent / "shared" / "data",
                        help="the benchmark data root (default: $NERKIT_DATA, else ../shared/data)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cap-gb", type=float, default=16.0, help="skip a case predicted to need more")
    parser.add_argument("--reps", type=int, default=3, help="passes per case (stops early after 60 s)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads in each case (0: torch's default); 1 gives steadier times on shared cores")
    parser.add_argument("--cases", default=",".join(f"{c}x{b}" for c, b in CASES),
                        help="characters x batch, comma-separated")
    parser.add_argument("--chunk", type=int, default=None,
                        help="attention_chunk of nerkit's FLAT (default: the encoder's default)")
    parser.add_argument("--impls", default="nerkit,naive", help="which implementations to run")
    parser.add_argument("--child", nargs=2, metavar=("SPEC", "IMPL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        child(args.child[0], args.child[1], args.device, args.reps, args.chunk)
        return

    from nerkit.features.lexicon import Lexicon

    text = read_text(Path(args.data) / "msra" / "test.char.bmes")
    lexicon = Lexicon.from_jieba()
    cases = [tuple(int(n) for n in case.split("x")) for case in args.cases.split(",")]
    bytes_per = dict(PRIOR_BYTES)  # per (pair x d_model), from the largest case measured so far
    largest = {impl: 0 for impl in bytes_per}
    d_model = FLATOptions().n_heads * FLATOptions().head_dim
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for chars, batch in cases:
            spec = lattice_spec(text, lexicon, chars, batch)
            if not rows:
                print(f"check: nerkit and naive outputs differ by at most {check_same_model(spec):.1e} (float64)",
                      file=sys.stderr)
            words = [len(h) for h in spec["heads"]]
            nodes = chars + max(words)
            pairs = batch * nodes * nodes * d_model
            spec_path = Path(tmp) / f"{chars}x{batch}.json"
            spec_path.write_text(json.dumps(spec))
            result = {"chars": chars, "batch": batch, "nodes": nodes, "words_per_char": sum(words) / (batch * chars)}
            for impl in ("nerkit", "naive"):
                if impl not in args.impls.split(","):
                    result[impl] = {"not run": True}
                    continue
                predicted = bytes_per[impl] * pairs
                if predicted > args.cap_gb * 2**30:
                    result[impl] = {"skipped": predicted}
                    continue
                command = [sys.executable, __file__, "--device", args.device, "--reps", str(args.reps),
                           "--threads", str(args.threads), "--child", str(spec_path), impl]
                if args.chunk is not None:
                    command[2:2] = ["--chunk", str(args.chunk)]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode != 0:
                    result[impl] = {"failed": done.stderr.strip().splitlines()[-1:]}
                    continue
                measured = json.loads(done.stdout.strip().splitlines()[-1])
                result[impl] = measured
                if pairs > largest[impl]:  # fixed costs weigh less in bigger cases: trust the biggest
                    bytes_per[impl], largest[impl] = measured["peak_bytes"] / pairs, pairs
            print(json.dumps(result), file=sys.stderr)
            rows.append(result)
    print(table(rows, args))


def table(rows: list[dict], args) -> str:
    gib = 2**30
    threads = args.threads or torch.get_num_threads()
    lines = [
        f"FLAT encoder (1 layer, 8 heads x 20, ff 480, fusion four, attention_chunk "
        f"{FLATOptions().attention_chunk if args.chunk is None else args.chunk}), one forward + backward pass, float32, "
        f"{args.device}, {threads} thread(s); MSRA test windows, jieba lattices (no word cap).",
        "",
        "| chars | batch | nodes (max) | nerkit peak | naive peak | memory ratio | nerkit ms | naive ms | time ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ours, naive = r["nerkit"], r["naive"]

        def memory(m):
            if "skipped" in m:
                return f"would need ~{m['skipped'] / gib:.0f} GB"
            if "failed" in m or "not run" in m:
                return "-"
            return f"{m['peak_bytes'] / gib:.2f} GB"

        def ratio(key):
            if key in ours and key in naive:
                return f"{naive[key] / ours[key]:.1f}x"
            if "skipped" in naive and "peak_bytes" in ours and key == "peak_bytes":
                return f"~{naive['skipped'] / ours['peak_bytes']:.0f}x (predicted)"
            return "-"

        ms = lambda m: f"{m['ms']:,.0f}" if "ms" in m else "-"  # noqa: E731
        lines.append(f"| {r['chars']} | {r['batch']} | {r['nodes']} | {memory(ours)} | {memory(naive)} | "
                     f"{ratio('peak_bytes')} | {ms(ours)} | {ms(naive)} | {ratio('ms')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
