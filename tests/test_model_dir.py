"""A model directory is read in one place (issue 56, section 2): `ModelDir` reads nerkit.json once per
load and says what the directory is (runtime, calibration), and nothing else in the package reads the
file or decides by itself whether a directory is an ONNX export."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from nerkit.errors import ModelDirError
from nerkit.inference import model_dir as model_dir_module
from nerkit.inference.model_dir import META_FILE, ModelDir

PACKAGE = Path(__file__).resolve().parent.parent / "nerkit"


def test_loading_a_model_reads_its_nerkit_json_once(tiny_model_dir, monkeypatch):
    from nerkit.inference.loading import load_pipeline

    reads = []
    real = model_dir_module._read_json
    monkeypatch.setattr(model_dir_module, "_read_json", lambda path: reads.append(Path(path).name) or real(path))
    pipe = load_pipeline(tiny_model_dir)
    assert reads.count(META_FILE) == 1, reads
    assert pipe.model_dir.path == Path(tiny_model_dir) and pipe.model_dir.runtime == "torch"
    assert pipe.model_dir.weights == Path(tiny_model_dir) / "model.safetensors"


def test_what_a_directory_says_it_is(tiny_model_dir, tmp_path):
    found = ModelDir.read(tiny_model_dir)
    assert not found.is_export and found.score_temperature == 1.0 and found.span_threshold is None
    assert found.train_max_len is not None and found.train_max_len > 0
    assert ModelDir.read(tmp_path / "nothing here").meta == {}  # loading then says what is missing
    copy = tmp_path / "model"
    shutil.copytree(tiny_model_dir, copy)
    meta = json.loads((copy / META_FILE).read_text())
    (copy / META_FILE).write_text(json.dumps({**meta, "runtime": "onnx", "score_temperature": 0}))
    damaged = ModelDir.read(copy)
    assert damaged.is_export and damaged.weights == copy / "model.onnx"
    with pytest.raises(ModelDirError, match="score_temperature is 0"):
        damaged.score_temperature


def test_nothing_outside_model_dir_reads_nerkit_json_or_asks_for_onnx_files():
    """The sign of a second reader: nerkit.json parsed, a runtime compared, or a directory globbed for
    graphs anywhere but nerkit/inference/model_dir.py."""
    signs = re.compile(r"_read_json\([^)]*META_FILE|json\.loads\([^)]*META_FILE|glob\(\"\*\.onnx|"
                       r"(?<![\w.])runtime\(|\.suffix == \"\.onnx\"|meta\.get\(\"runtime\"")
    found = [f"{path.relative_to(PACKAGE)}:{n}" for path in sorted(PACKAGE.rglob("*.py"))
             if path.name != "model_dir.py"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if signs.search(line)]
    assert not found, found
