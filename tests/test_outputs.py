"""Nothing a user has is lost to a command's output: every command that writes a directory refuses a
non-empty one without --force, replaces with --force only its own earlier output, and never a
directory that holds (or is) what it reads or the current directory; every command that writes a file
refuses a directory and its own input. Each case runs the real command line and then checks that
what was there before is still there, byte for byte."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import TINY_TRAIN, tiny_raw_config


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` (relative path -> bytes): what must survive a refused command."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refused(result, *words: str) -> None:
    """Exit 2 with one `nerkit: error:` line holding `words`, and no traceback."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stderr.startswith("nerkit: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


@pytest.fixture
def user_dir(tmp_path) -> Path:
    """A directory of the user's: a note and a copy of the tiny training corpus."""
    root = tmp_path / "mine"
    root.mkdir()
    (root / "notes.txt").write_text("keep me\n", encoding="utf-8")
    shutil.copyfile(TINY_TRAIN, root / "train.bio")
    return root


# ----------------------------------------------------------------------------------- export


def test_export_never_deletes_the_directory_that_holds_its_model(tmp_path, tiny_model_dir, nerkit):
    """The reported case: `nerkit export --model p/m --out p` deleted p/m and p/notes.txt with exit 0."""
    p = tmp_path / "p"
    shutil.copytree(tiny_model_dir, p / "m")
    (p / "notes.txt").write_text("keep\n", encoding="utf-8")
    before = snapshot(p)
    for force in ([], ["--force"]):
        refused(nerkit("export", "--model", str(p / "m"), "--out", str(p), *force, check=False), "holds the input")
        assert snapshot(p) == before
    refused(nerkit("export", "--model", str(p / "m"), "--out", str(p / "m"), "--force", check=False), "holds the input")
    assert snapshot(p) == before


def test_export_to_the_current_directory_is_refused_with_a_message(tmp_path, tiny_model_dir, nerkit, monkeypatch):
    """`nerkit export --model ../m --out .` was a traceback (ValueError: PosixPath('.') has an empty name)."""
    shutil.copytree(tiny_model_dir, tmp_path / "m")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for out in (".", "..", str(tmp_path)):
        refused(nerkit("export", "--model", "../m", "--out", out, "--force", check=False), "current directory")
    assert snapshot(tmp_path / "m") == snapshot(tiny_model_dir)


@pytest.mark.slow
def test_export_replaces_only_an_earlier_export_and_only_with_force(user_dir, tmp_path, tiny_model_dir, nerkit):
    before = snapshot(user_dir)
    refused(nerkit("export", "--model", str(tiny_model_dir), "--out", str(user_dir), check=False), "not empty", "--force")
    refused(nerkit("export", "--model", str(tiny_model_dir), "--out", str(user_dir), "--force", check=False),
            "not an earlier ONNX export")
    assert snapshot(user_dir) == before
    # a copy of the PyTorch model is not an export either: --force leaves it alone
    model_copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, model_copy)
    refused(nerkit("export", "--model", str(tiny_model_dir), "--out", str(model_copy), "--force", check=False),
            "not an earlier ONNX export")
    assert snapshot(model_copy) == snapshot(tiny_model_dir)
    pytest.importorskip("onnxruntime")
    out = tmp_path / "onnx"
    nerkit("export", "--model", str(tiny_model_dir), "--out", str(out))
    refused(nerkit("export", "--model", str(tiny_model_dir), "--out", str(out), check=False), "not empty")
    nerkit("export", "--model", str(tiny_model_dir), "--out", str(out), "--force")
    assert (out / "model.onnx").is_file()


# ---------------------------------------------------------------------------------- vectors


def test_export_lac_refuses_a_directory_it_did_not_write(user_dir, nerkit):
    """`nerkit vectors export-lac --out q` deleted q/notes.txt with exit 0."""
    before = snapshot(user_dir)
    refused(nerkit("vectors", "export-lac", "--out", str(user_dir), check=False), "not empty")
    refused(nerkit("vectors", "export-lac", "--out", str(user_dir), "--force", check=False), "not an earlier LAC export")
    assert snapshot(user_dir) == before


def test_vectors_train_refuses_a_directory_of_other_files_and_one_holding_its_text(user_dir, nerkit):
    before = snapshot(user_dir)
    text = user_dir / "train.bio"
    refused(nerkit("vectors", "train", "--text", str(text), "--out", str(user_dir), check=False), "holds the input")
    other = user_dir.parent / "other"
    shutil.copytree(user_dir, other)
    for force in ([], ["--force"]):
        refused(nerkit("vectors", "train", "--text", str(text), "--out", str(other), *force, check=False), "not empty")
    assert snapshot(user_dir) == before and snapshot(other) == before


def test_vectors_export_jieba_refuses_a_directory(user_dir, nerkit):
    before = snapshot(user_dir)
    refused(nerkit("vectors", "export-jieba", "--out", str(user_dir), check=False), "is a directory")
    assert snapshot(user_dir) == before


# --------------------------------------------------------------------------------- lm adapt


def test_lm_adapt_refuses_what_it_did_not_write_even_with_force(user_dir, tmp_path, nerkit):
    """Refused before any model is read: the --lm here is only a directory."""
    lm = tmp_path / "lm"
    lm.mkdir()
    before = snapshot(user_dir)
    args = ["lm", "adapt", "--lm", str(lm), "--text", str(user_dir / "train.bio")]
    refused(nerkit(*args, "--out", str(user_dir), check=False), "holds the input")
    refused(nerkit(*args, "--out", str(lm), "--force", check=False), "holds the input")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep\n", encoding="utf-8")
    refused(nerkit(*args, "--out", str(other), check=False), "not empty")
    refused(nerkit(*args, "--out", str(other), "--force", check=False), "not an earlier adaptation")
    assert snapshot(user_dir) == before and (other / "notes.txt").read_text(encoding="utf-8") == "keep\n"


# ----------------------------------------------------------------------------------- bench


def test_bench_writes_only_into_its_own_directory(user_dir, tmp_path, nerkit):
    matrix = tmp_path / "m.yaml"
    matrix.write_text(f"runs:\n  - name: tiny\n    dataset: sample\n    config: {tmp_path / 'c.yaml'}\n",
                      encoding="utf-8")
    import yaml

    (tmp_path / "c.yaml").write_text(yaml.safe_dump(tiny_raw_config()), encoding="utf-8")
    before = snapshot(user_dir)
    refused(nerkit("bench", "--matrix", str(matrix), "--out", str(user_dir), check=False), "not a benchmark's directory")
    refused(nerkit("bench", "--matrix", str(matrix), "--out", str(tmp_path), check=False), "holds the input")
    assert snapshot(user_dir) == before


# ------------------------------------------------------------------------------------ train


def test_train_force_replaces_only_an_earlier_run_and_never_its_data(user_dir, tmp_path, nerkit):
    import yaml

    config = tmp_path / "c.yaml"
    raw = tiny_raw_config()
    raw["data"]["train"] = str(user_dir / "train.bio")
    config.write_text(yaml.safe_dump(raw), encoding="utf-8")
    before = snapshot(user_dir)
    refused(nerkit("train", "--config", str(config), "--out", str(user_dir), "--force", check=False), "holds the input")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep\n", encoding="utf-8")
    refused(nerkit("train", "--config", str(config), "--out", str(other), "--force", "--dry-run", check=False),
            "not an earlier run's directory")
    assert snapshot(user_dir) == before and (other / "notes.txt").is_file()


# ------------------------------------------------------------------------------ file outputs


def test_commands_that_write_a_file_refuse_a_directory_and_their_input(user_dir, tmp_path, tiny_model_dir, nerkit):
    """report, plot, data convert, data validate --repair, predict --output and eval --output."""
    before = snapshot(user_dir)
    gold = user_dir / "train.bio"
    texts = user_dir / "notes.txt"
    model = str(tiny_model_dir)
    image_dir = tmp_path / "figure.png"  # a directory that looks like an image
    image_dir.mkdir()
    cases = [
        (["report", "--model", model, "--data", str(gold), "--out", str(user_dir)], "is a directory"),
        (["report", "--model", model, "--data", str(gold), "--out", str(gold)], "is the input file"),
        (["plot", "curves", model, "--out", str(image_dir)], "is a directory"),
        (["data", "convert", str(gold), str(user_dir), "--to", "jsonl"], "is a directory"),
        (["data", "convert", str(gold), str(gold), "--to", "bioes"], "is the input file"),
        (["data", "validate", str(gold), "--repair", str(user_dir)], "is a directory"),
        (["predict", "--model", model, str(texts), "--output", str(user_dir)], "is a directory"),
        (["predict", "--model", model, str(texts), "--output", str(texts)], "is the input file"),
        (["eval", "--model", model, "--data", str(gold), "--output", str(user_dir)], "is a directory"),
        (["eval", "--model", model, "--data", str(gold), "--output", str(gold)], "is the input file"),
    ]
    for args, words in cases:
        refused(nerkit(*args, check=False), words)
        assert snapshot(user_dir) == before, args
    assert image_dir.is_dir() and not any(image_dir.iterdir())
    assert (tiny_model_dir / "model.safetensors").is_file()
