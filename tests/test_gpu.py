"""`make gpu-check`: on a machine with CUDA, a short timing of every encoder (BiLSTM, the absolute and
relative attentions, FLAT) training a few steps in float32 and under bf16 and fp16 autocast, printed as
a table; each step's loss must be finite. Without CUDA the timing is skipped and the same code runs a
step of two encoders on the CPU, and the Makefile target says it is skipped."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
ATTENTION = ["encoder.n_heads=4", "encoder.head_dim=32", "encoder.num_layers=2"]
ENCODERS = {
    "bilstm": ["encoder.name=bilstm"],
    "transformer": ["encoder.name=transformer", *ATTENTION],  # absolute sinusoids
    "learned": ["encoder.name=transformer", "encoder.attention=learned", *ATTENTION],
    "tener": ["encoder.name=tener", *ATTENTION],
    "xl": ["encoder.name=tener", "encoder.attention=xl", *ATTENTION],
    "shaw": ["encoder.name=tener", "encoder.attention=shaw", *ATTENTION],
    "rope": ["encoder.name=tener", "encoder.attention=rope", *ATTENTION],
    "alibi": ["encoder.name=tener", "encoder.attention=alibi", *ATTENTION],
    "flat": ["encoder.name=flat", "embeddings.word_dim=50", *ATTENTION],
}
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# Known to fail, and why: listed in the table and below it, not failing the check. Remove an entry once fixed.
KNOWN_FAILURES: dict[tuple[str, str], str] = {}  # (encoder, precision) -> why, while one is known
WORDS = "北京\n上海\n武汉\n张伟\n王芳\n赵磊\n高铁\n清华大学\n大学\n中国\n"


def training_rate(encoder: str, precision: str, device: str, steps: int, lexicon: Path) -> tuple[float, float]:
    """Characters a second over `steps` optimiser steps (after two to warm up) of `encoder` on the tiny
    training corpus, batches of 32 sentences, under `precision`'s autocast (fp16 with a gradient
    scaler); and the last loss."""
    from nerkit.config import build_config
    from nerkit.data.splits import read_splits
    from nerkit.features.batch import collate
    from nerkit.training.build import build_pipeline

    raw = {"data": {"train": str(FIXTURES / "tiny_train.bio"), "dev": str(FIXTURES / "tiny_dev.bio"), "max_len": 250},
           "lexicon": {"source": str(lexicon)}, "train": {"device": device, "seed": 1}}
    config = build_config(raw, "<gpu check>", ENCODERS[encoder])
    torch.manual_seed(1)
    splits = read_splits(config)
    pipe = build_pipeline(config, splits, device)
    model = pipe.model.train()
    examples = [pipe.featurizer.example(s.tokens, s.tags) for s in splits.train]
    batches = [collate(examples[i:i + 32]).to(pipe.device) for i in range(0, len(examples), 32)]
    chars = [sum(len(s) for s in splits.train[i:i + 32]) for i in range(0, len(examples), 32)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dtype = PRECISIONS[precision]
    scaler = torch.amp.GradScaler(device, enabled=dtype is torch.float16)
    done, started, loss = 0, 0.0, float("nan")
    for step in range(steps + 2):
        if step == 2:
            synchronize(device)
            started, done = time.perf_counter(), 0
        batch = batches[step % len(batches)]
        with torch.autocast(pipe.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            value = model.loss(batch)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(value).backward()
        scaler.step(optimizer)
        scaler.update()
        loss, done = value.item(), done + chars[step % len(batches)]
    synchronize(device)
    return done / (time.perf_counter() - started), loss


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def rates_table(device: str, steps: int, encoders, precisions, lexicon: Path) -> tuple[str, list[str]]:
    """The table of `training_rate`s, a row per encoder and a column per precision, and what failed."""
    rows, failed = [f"| encoder | {' | '.join(f'{p} chars/s' for p in precisions)} |",
                    "|---|" + "---:|" * len(precisions)], []
    for encoder in encoders:
        cells = []
        for precision in precisions:
            try:
                rate, loss = training_rate(encoder, precision, device, steps, lexicon)
            except Exception as error:  # noqa: BLE001 - every combination is tried; the failures are listed
                cells.append("error")
                failed.append(f"{encoder} {precision}: {type(error).__name__}: {error}")
                continue
            cells.append(f"{rate:,.0f}" if math.isfinite(loss) else "loss not finite")
            if not math.isfinite(loss):
                failed.append(f"{encoder} {precision}: the loss is {loss}")
        rows.append(f"| {encoder} | {' | '.join(cells)} |")
    return "\n".join(rows), failed


@pytest.fixture
def lexicon(tmp_path) -> Path:
    path = tmp_path / "words.txt"
    path.write_text(WORDS, encoding="utf-8")
    return path


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_training_timing_of_every_encoder_and_precision(lexicon, capsys):
    table, failed = rates_table("cuda", 20, ENCODERS, PRECISIONS, lexicon)
    known = [f"known: {encoder} {precision}: {why}" for (encoder, precision), why in KNOWN_FAILURES.items()]
    with capsys.disabled():
        print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}: training steps of the tiny corpus, "
              f"batches of 32 sentences\n{table}\n" + "\n".join([*failed, *known]))
    unknown = [f for f in failed if tuple(f.split(":")[0].split()) not in KNOWN_FAILURES]
    assert not unknown, "\n".join(unknown)


@pytest.mark.slow
def test_the_timing_runs_on_the_cpu_too(lexicon):
    """The CUDA timing's code path on the CPU, a step each: float32 and bf16 autocast, FLAT included
    (its block scores once failed under autocast, gathering half-precision tables into float32 buffers)."""
    table, failed = rates_table("cpu", 1, ["bilstm", "tener", "flat"], ["fp32", "bf16"], lexicon)
    assert failed == []
    assert "| flat | " in table and "error" not in table


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_gpu_check_says_it_is_skipped_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: `make gpu-check` runs the check itself")
    done = subprocess.run(["make", "-s", "gpu-check", f"PY={sys.executable}", "STAMP="], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "gpu-check skipped: no CUDA device\n"
