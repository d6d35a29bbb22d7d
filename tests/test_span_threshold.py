"""`nerkit calibrate` on a span-head model (issue 45): the threshold it chooses is the grid point of
best dev F1 found by a naive loop that evaluates the model at each (span.flat honoured), it is kept
in nerkit.json, and prediction, a save and load, an ONNX export and the server all use it."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from helpers import TINY_DEV, TINY_TRAIN, serving
from nerkit.errors import UserError
from nerkit.inference.pipeline import Pipeline
from nerkit.tools.span_threshold import GRID, best_threshold

TEXTS = ["张三在北京大学读书", "李四住在上海", "王五去了中国科学院"]


@pytest.fixture(scope="module")
def span_model(tmp_path_factory):
    """A span-head model trained briefly on the tiny corpus: its probabilities spread across the
    grid, so that the threshold moves F1 and predictions."""
    from helpers import tiny_raw_config

    from nerkit.config import build_config
    from nerkit.training.loop import train

    root = tmp_path_factory.mktemp("span_threshold")
    config = build_config(tiny_raw_config(), "<tiny>", ["model.head=span", "span.size=8", "span.max_width=8", "encoder.dropout=0",
                                                        "train.epochs=2"])
    train(config, out=root / "model", progress_bar=False)
    return root / "model"


def copy_of(model, tmp_path, flat: bool = False):
    out = tmp_path / "model"
    shutil.copytree(model, out)
    if flat:
        config = out / "config.yaml"
        text = config.read_text(encoding="utf-8")
        assert "  flat: false\n" in text
        config.write_text(text.replace("  flat: false\n", "  flat: true\n"), encoding="utf-8")
    return out


def strip(found):
    return [[(e["start"], e["end"], e["type"]) for e in es] for es in found]


def test_ties_go_to_the_threshold_nearest_one_half_then_the_higher():
    assert best_threshold({0.3: 0.5, 0.45: 0.7, 0.55: 0.7, 0.9: 0.7}) == 0.55
    assert best_threshold({0.3: 0.8, 0.5: 0.7}) == 0.3
    assert GRID == [0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85,
                    0.9, 0.95]


@pytest.mark.slow
@pytest.mark.parametrize("flat", [False, True], ids=["nested", "flat"])
def test_calibrate_chooses_the_grid_point_of_best_dev_f1(span_model, tmp_path, nerkit, flat):
    model = copy_of(span_model, tmp_path, flat)
    pipe = Pipeline.load(model)
    assert pipe.config.span.flat is flat and pipe.span_threshold is None and pipe.threshold == 0.5
    naive = {}
    for t in GRID:  # the whole evaluation path at each threshold
        pipe.span_threshold = t
        naive[t] = pipe.evaluate(TINY_DEV)["f1"]
    result = json.loads(nerkit("calibrate", "--model", str(model), "--data", str(TINY_DEV)).stdout)
    assert result["grid"] == {str(t): round(f, 6) for t, f in naive.items()}
    assert result["threshold"] == max(naive, key=lambda t: (naive[t], -round(abs(t - 0.5), 6), t))
    assert result["after"]["f1"] == naive[result["threshold"]] >= result["before"]["f1"] == naive[0.5]
    assert len(set(naive.values())) > 3  # the fixture's scores spread: the choice means something
    if not flat:  # flat, 0.5 itself has the best dev F1 of this fixture (or ties it, and a tie goes to 0.5)
        assert result["threshold"] != 0.5
    assert json.loads((model / "nerkit.json").read_text())["span_threshold"] == result["threshold"]
    after = Pipeline.load(model)
    assert after.threshold == result["threshold"]
    assert after.evaluate(TINY_DEV)["f1"] == result["after"]["f1"]
    # without --data: the dev split the model was selected on (the fixture's data.dev is TINY_DEV)
    (tmp_path / "again").mkdir()
    again = copy_of(span_model, tmp_path / "again", flat)
    default = json.loads(nerkit("calibrate", "--model", str(again)).stdout)
    assert default["grid"] == result["grid"] and default["threshold"] == result["threshold"]


@pytest.mark.slow
def test_the_saved_threshold_is_what_predict_save_load_and_export_use(span_model, tmp_path, nerkit):
    from nerkit.data.corpus import read_corpus
    from nerkit.inference.onnx_runtime import OnnxPipeline
    from nerkit.tools.export import export_model

    model = copy_of(span_model, tmp_path)
    texts = [s.text for s in read_corpus(TINY_TRAIN).sentences[:20]] + TEXTS
    at_half = Pipeline.load(model).predict(texts, scores=True)
    meta = json.loads((model / "nerkit.json").read_text())
    (model / "nerkit.json").write_text(json.dumps({**meta, "span_threshold": 0.1}))
    pipe = Pipeline.load(model)
    predicted = pipe.predict(texts, scores=True)
    assert strip(predicted) != strip(at_half)  # more spans: those from 0.1 to 0.5
    assert all(e["score"] > 0.1 for found in predicted for e in found)
    assert any(e["score"] < 0.5 for found in predicted for e in found)
    assert [[e for e in found if e["score"] > 0.5] for found in predicted] == at_half
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    cli = [json.loads(line) for line in nerkit("predict", "--model", str(model), "--format", "jsonl",
                                               str(tmp_path / "texts.txt")).stdout.splitlines()]
    assert [[(e["start"], e["end"], e["type"]) for e in r["entities"]] for r in cli] == strip(predicted)
    pipe.save(tmp_path / "again")
    assert Pipeline.load(tmp_path / "again").span_threshold == 0.1
    assert Pipeline.load(tmp_path / "again").predict(texts, scores=True) == predicted
    export_model(model, tmp_path / "onnx")
    assert json.loads((tmp_path / "onnx" / "nerkit.json").read_text())["span_threshold"] == 0.1
    onnx = OnnxPipeline.load(tmp_path / "onnx", threads=1)
    assert onnx.threshold == 0.1 and strip(onnx.predict(texts, scores=True)) == strip(predicted)
    with serving(model, tmp_path) as server:  # the server says which threshold it decodes at, and uses it
        info = httpx.get(f"{server.url}/info", timeout=30).json()
        assert info["head"] == "span" and info["score"]["threshold"] == 0.1
        answer = httpx.post(f"{server.url}/predict", json={"texts": texts}, timeout=60).json()["records"]
        assert [[(e["start"], e["end"], e["type"]) for e in r["entities"]] for r in answer] == strip(predicted)


@pytest.mark.slow
def test_a_damaged_threshold_is_refused_when_the_model_loads(span_model, tmp_path, nerkit):
    model = copy_of(span_model, tmp_path)
    meta = json.loads((model / "nerkit.json").read_text())
    (model / "nerkit.json").write_text(json.dumps({**meta, "span_threshold": 1.5}))
    result = nerkit("predict", "--model", str(model), "-", check=False)
    assert result.returncode == 2 and "span_threshold is 1.5" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_dev_file_without_entities_is_refused(span_model, tmp_path, nerkit):
    from nerkit.tools.calibrate import calibrate

    model = copy_of(span_model, tmp_path)
    empty = tmp_path / "texts.jsonl"
    empty.write_text("".join(json.dumps({"text": t, "entities": []}, ensure_ascii=False) + "\n" for t in TEXTS),
                     encoding="utf-8")
    before = (model / "nerkit.json").read_text()
    with pytest.raises(UserError, match="no entities"):
        calibrate(model, empty)
    assert (model / "nerkit.json").read_text() == before
    result = nerkit("calibrate", "--model", str(model), "--data", str(empty), check=False)
    assert result.returncode == 2 and "no entities" in result.stderr and "Traceback" not in result.stderr
