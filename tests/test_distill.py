"""`nerkit distill` (nerkit.tools.distill, nerkit.training.distill, nerkit.training.distill_cache):
the soft loss against the CRF's exact marginals (zero when they are equal, its gradient against
finite differences), a student that reaches its teacher's tags, resume after a kill, the teacher
cache (reused, rebuilt when the teacher or the text changes, continued after a cut build), the
lines overlapping dev taken out, and the student as an ordinary model directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import FIXTURES, REPO, TINY_TRAIN, tiny_raw_config

from nerkit.config import build_config
from nerkit.data.corpus import read_corpus
from nerkit.errors import UserError
from nerkit.model.crf import CRF

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def crf_inputs(seed: int = 0):
    torch.manual_seed(seed)
    crf = CRF(TAGS).double()
    emissions = torch.randn(3, 6, len(TAGS), dtype=torch.float64)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] + [0] * 5], dtype=torch.bool)
    return crf, emissions, mask


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_soft_loss_is_zero_for_equal_marginals_and_positive_otherwise(temperature):
    crf, emissions, mask = crf_inputs()
    targets = crf.marginals(emissions, mask, temperature)
    assert crf.posterior_kl(emissions, mask, targets, temperature).abs().item() < 1e-10
    other = emissions + torch.randn_like(emissions)
    assert crf.posterior_kl(other, mask, targets, temperature).item() > 1e-3
    # the marginals of the differentiable forward-backward are the no-grad ones
    assert torch.allclose(crf.log_marginals(emissions, mask, temperature).exp()[mask], targets[mask])


def test_soft_loss_gradient_matches_finite_differences():
    crf, emissions, mask = crf_inputs(1)
    targets = crf.marginals(torch.randn_like(emissions), mask, 1.5)
    emissions.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: crf.posterior_kl(e, mask, targets, 1.5), (emissions,))


# ------------------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    from nerkit.training.loop import train

    out = tmp_path_factory.mktemp("teacher") / "model"
    train(build_config(tiny_raw_config(), "<teacher>", ["train.epochs=8"]), out=out)
    return out


def lines_of(path: Path) -> list[str]:
    return [s.text for s in read_corpus(path).sentences]


def student_config(tmp_path: Path, *sets: str):
    return build_config(tiny_raw_config(), "<student>", [f"distill.cache={tmp_path / 'cache'}", "train.epochs=2",
                                                         *sets])


def write_text(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_lines_overlapping_dev_are_excluded_and_recorded(teacher, tmp_path):
    from nerkit.tools.distill import distill

    dev = lines_of(FIXTURES / "tiny_dev.bio")
    train_only = [line for line in lines_of(TINY_TRAIN) if line not in dev][:20]
    text = write_text(tmp_path / "text.txt", train_only + dev[:3])
    result = distill(student_config(tmp_path, "train.epochs=1"), [teacher], [text], tmp_path / "student")
    record = result["distillation"]["texts"][0]
    assert record["lines"] == 23 and record["lines_excluded"] >= 3
    assert record["lines_used"] == 23 - record["lines_excluded"]
    meta = json.loads((tmp_path / "student" / "nerkit.json").read_text(encoding="utf-8"))
    assert meta["distilled_from"]["texts"][0]["lines_excluded"] == record["lines_excluded"]
    assert meta["distilled_from"]["teachers"][0]["path"] == str(teacher)


def test_cache_is_reused_and_rebuilt_when_teacher_or_text_changes(teacher, tmp_path):
    import shutil

    from nerkit.inference.pipeline import Pipeline
    from nerkit.tools.distill import distill

    text = write_text(tmp_path / "text.txt", lines_of(TINY_TRAIN)[:30])
    config = student_config(tmp_path, "train.epochs=1")
    first = distill(config, [teacher], [text], tmp_path / "a")["cache"][0]
    assert first["scored"] > 0 and first["bytes"] > 0
    again = distill(config, [teacher], [text], tmp_path / "b")["cache"][0]
    assert again["scored"] == 0 and again["cache"] == first["cache"]  # no teacher forward the second time
    write_text(text, lines_of(TINY_TRAIN)[:31])
    changed_text = distill(config, [teacher], [text], tmp_path / "c")["cache"][0]
    assert changed_text["scored"] > 0 and changed_text["cache"] != first["cache"]
    other = tmp_path / "teacher2"
    shutil.copytree(teacher, other)
    pipe = Pipeline.load(other)
    with torch.no_grad():
        pipe.model.emission.bias.add_(0.1)
    pipe.write_weights(other)
    changed_teacher = distill(config, [other], [text], tmp_path / "d")["cache"][0]
    assert changed_teacher["scored"] > 0 and changed_teacher["cache"] != changed_text["cache"]


def test_cut_cache_build_continues_where_it_stopped(teacher, tmp_path):
    from nerkit.inference.pipeline import Pipeline
    from nerkit.training.distill_cache import MANIFEST, cached_targets

    pipe = Pipeline.load(teacher)
    units = [list(line) for line in lines_of(TINY_TRAIN)]
    options = {"window": 0, "temperature": 1.0}
    whole = cached_targets(pipe, teacher, "t", "x", units, options, tmp_path, shard_units=16)
    shards = sorted(whole.directory.glob("shard-*.safetensors"))
    assert len(shards) == -(-len(units) // 16)
    shards[-1].unlink()  # a build killed before its last shard was in place
    (whole.directory / MANIFEST).write_text((whole.directory / MANIFEST).read_text())
    again = cached_targets(pipe, teacher, "t", "x", units, options, tmp_path, shard_units=16)
    assert again.scored == len(units) - 16 * (len(shards) - 1)
    assert torch.equal(again.marginals, whole.marginals) and torch.equal(again.paths, whole.paths)
    assert whole.marginals.dtype == torch.float16
    assert torch.allclose(whole.marginals.float().sum(1), torch.ones(len(whole.marginals)), atol=1e-2)


@pytest.mark.slow  # trains a student for several seconds
@pytest.mark.parametrize("targets", ["soft", "hard"])
def test_student_reaches_its_teachers_tags(teacher, tmp_path, targets):
    from nerkit.inference.pipeline import Pipeline
    from nerkit.tools.distill import distill

    dev = set(lines_of(FIXTURES / "tiny_dev.bio"))
    lines = [line for line in lines_of(TINY_TRAIN) if line not in dev]
    text = write_text(tmp_path / "text.txt", lines)
    # a few gold sentences; the teacher's targets teach the rest
    config = student_config(tmp_path, "data.limit=8", "train.epochs=25", "distill.ratio=4", "distill.weight=2",
                            f"distill.targets={targets}")
    distill(config, [teacher], [text], tmp_path / "student")
    teacher_spans = Pipeline.load(teacher).predict(lines)
    student_spans = Pipeline.load(tmp_path / "student").predict(lines)
    agree = sum(a == b for a, b in zip(teacher_spans, student_spans)) / len(lines)
    assert agree == 1.0, agree


def test_a_teacher_with_other_tags_or_an_onnx_export_is_refused(teacher, tmp_path):
    from nerkit.tools.distill import distill

    text = write_text(tmp_path / "text.txt", lines_of(TINY_TRAIN)[:5])
    with pytest.raises(UserError, match="tags") as info:
        distill(student_config(tmp_path, "data.scheme=bioes"), [teacher], [text], tmp_path / "s1")
    assert "data.scheme" in info.value.fix
    onnx = tmp_path / "export"
    onnx.mkdir()
    (onnx / "model.onnx").write_bytes(b"onnx")
    with pytest.raises(UserError, match="ONNX"):
        distill(student_config(tmp_path), [onnx], [text], tmp_path / "s2")
    with pytest.raises(UserError, match="student has model.head: span"):
        distill(student_config(tmp_path, "model.head=span"), [teacher], [text], tmp_path / "s3")
    from nerkit.training.loop import train

    span_teacher = tmp_path / "span-teacher"
    train(build_config(tiny_raw_config(), "<span>", ["train.max_steps=1", "model.head=span"]), out=span_teacher)
    with pytest.raises(UserError, match="cannot teach"):
        distill(student_config(tmp_path), [span_teacher], [text], tmp_path / "s4")


@pytest.mark.slow  # runs the command line and `nerkit predict`
def test_cli_student_is_an_ordinary_model_directory(teacher, tmp_path, nerkit, write_file):
    config = write_file(json.dumps(tiny_raw_config()), "student.yaml")  # JSON is YAML
    dev = set(lines_of(FIXTURES / "tiny_dev.bio"))
    text = write_text(tmp_path / "text.txt", [line for line in lines_of(TINY_TRAIN) if line not in dev][:20])
    out = tmp_path / "student"
    result = nerkit("distill", "--teacher", teacher, "--text", text, "--config", config, "--out", out,
                    "--set", "train.epochs=2", "--set", f"distill.cache={tmp_path / 'cache'}")
    assert json.loads(result.stdout)["unlabelled_sequences"] == 20
    predicted = nerkit("predict", text, "--model", out)
    assert len(predicted.stdout.splitlines()) == 20


# Runs `nerkit distill` and SIGKILLs it right after its checkpoint N is in place.
KILLED = r"""
import os, signal, sys
n = int(sys.argv[1])
sys.argv = ["nerkit", *sys.argv[2:]]
import nerkit.training.loop as T
calls = [0]
save = T.save_checkpoint
def patched(out, *args, **kwargs):
    save(out, *args, **kwargs)
    calls[0] += 1
    if calls[0] == n:
        os.kill(os.getpid(), signal.SIGKILL)
T.save_checkpoint = patched
from nerkit.cli.app import main
main()
"""


@pytest.mark.slow  # starts and kills a process
def test_resume_after_a_kill_gives_the_same_student(teacher, tmp_path, write_file):
    from nerkit.tools.distill import distill

    config_file = write_file(json.dumps(tiny_raw_config()), "student.yaml")
    text = write_text(tmp_path / "text.txt", lines_of(TINY_TRAIN)[:40])
    sets = [f"distill.cache={tmp_path / 'cache'}", "train.epochs=3", "train.checkpoint_every=4",
            "embeddings.dropout=0.3"]
    args = ["distill", "--teacher", teacher, "--text", text, "--config", config_file, "--out", tmp_path / "killed"]
    args += [a for s in sets for a in ("--set", s)]
    killed = subprocess.run([sys.executable, "-c", KILLED, "3", *map(str, args)], cwd=REPO, capture_output=True,
                            text=True, timeout=180)
    assert killed.returncode == -9, killed.stderr
    assert not (tmp_path / "killed" / "metrics.json").exists()
    config = build_config(tiny_raw_config(), "<student>", sets)
    distill(config, [teacher], [text], tmp_path / "killed", resume=True)
    distill(config, [teacher], [text], tmp_path / "whole")
    for name in ("model.safetensors", "last/model.safetensors"):
        assert (tmp_path / "killed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
