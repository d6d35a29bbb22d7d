"""`nerkit calibrate` on a span-head model (issue 45): the threshold it chooses is the grid point of
best dev F1 found by a naive loop that evaluates the model at each (span.flat honoured), it is kept
in nerkit.json, and prediction, a save and load, an ONNX export and the server all use it."""

from __future__ import annotations

import json
import math
import shutil

import httpx
import pytest

from helpers import TINY_DEV, TINY_TRAIN, serving
from nerkit.errors import UserError
from nerkit.inference.pipeline import Pipeline
from nerkit.data.corpus import read_corpus
from nerkit.model.span_decode import logit
from nerkit.inference.span_threshold import GRID, best_threshold, platt_map

TEXTS = ["张三在北京大学读书", "李四住在上海", "王五去了中国科学院"]
DEV_TEXTS = [s.text for s in read_corpus(TINY_DEV).sentences]


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


@pytest.fixture(scope="module")
def span_model(tmp_path_factory):
    """A span-head model trained briefly on the tiny corpus: its probabilities spread across the
    grid, so that the threshold moves F1 and predictions."""
    from helpers import tiny_raw_config

    from nerkit.config import build_config
    from nerkit.training.loop import train

    root = tmp_path_factory.mktemp("span_threshold")
    config = build_config(tiny_raw_config(), "<tiny>", ["model.head=span", "span.size=8", "span.max_width=8", "encoder.dropout=0",
                                                        "train.epochs=2", "span.choose_threshold=false"])
    train(config, out=root / "model", progress_bar=False)
    return root / "model"


@pytest.mark.slow
def test_training_chooses_the_threshold_on_dev_for_selection_and_the_figures(tmp_path):
    """With span.choose_threshold (the default), every epoch's dev F1 is at the threshold chosen on
    dev (never below the F1 at span.threshold), the best epoch's choice is in nerkit.json, and test
    is scored at it: the saved model's own evaluation gives the reported figure."""
    from helpers import tiny_raw_config

    from nerkit.config import build_config
    from nerkit.inference.span_threshold import choose_threshold
    from nerkit.training.loop import train

    overrides = ["model.head=span", "span.size=8", "span.max_width=8", "encoder.dropout=0", "train.epochs=3"]
    raw = tiny_raw_config()
    raw["data"]["test"] = str(TINY_DEV)
    metrics = train(build_config(raw, "<tiny>", overrides), out=tmp_path / "model", progress_bar=False)
    epochs = [json.loads(line) for line in (tmp_path / "model" / "metrics.jsonl").read_text().splitlines()]
    assert all(e["dev_threshold"] in GRID and e["dev_f1"] >= e["dev_f1_at_default"] - 1e-12 for e in epochs)
    assert any(e["dev_threshold"] != 0.5 for e in epochs), "the threshold never moved: the test checks little"
    meta = json.loads((tmp_path / "model" / "nerkit.json").read_text())
    chosen = metrics["dev"]["span_threshold"]
    assert meta["span_threshold"] == chosen["span_threshold"] and meta["span_score_map"] == chosen["span_score_map"]
    saved = Pipeline.load(tmp_path / "model")
    assert saved.evaluate(str(TINY_DEV))["f1"] == pytest.approx(metrics["test"]["f1"])
    assert saved.evaluate(str(TINY_DEV))["f1"] == pytest.approx(metrics["dev"]["f1"])  # dev is the test file here
    # the same choice from the saved weights at the head's own scores: what training chose is reproducible
    saved.span_threshold, saved.span_score_map = None, None
    again = choose_threshold(saved, read_corpus(TINY_DEV).sentences, "dev")
    assert again["threshold"] == chosen["chosen"]
    plain = train(build_config(raw, "<tiny>", overrides + ["span.choose_threshold=false"]), out=tmp_path / "plain",
                  progress_bar=False)
    assert "span_threshold" not in plain["dev"] and "span_threshold" not in json.loads(
        (tmp_path / "plain" / "nerkit.json").read_text())


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


@pytest.mark.parametrize("seed", range(5))
def test_platt_map_minimises_the_log_loss_of_platts_targets(seed):
    """Against a naive grid search of the same loss around the answer, on logits drawn from a known
    map; a set the logits separate still gets a finite map; one class alone keeps the scores."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(0.5, 2.0, 400)
    right = rng.random(400) < 1 / (1 + np.exp(-(0.6 * x - 0.4)))
    scale, shift = platt_map(x.tolist(), right.tolist())
    positives, negatives = int(right.sum()), int((~right).sum())
    target = np.where(right, (positives + 1) / (positives + 2), 1 / (negatives + 2))

    def loss(a, b):
        p = 1 / (1 + np.exp(-(a * x + b)))
        return float(-(target * np.log(p) + (1 - target) * np.log(1 - p)).sum())

    best = loss(scale, shift)
    for da in np.linspace(-0.05, 0.05, 11):
        for db in np.linspace(-0.05, 0.05, 11):
            assert best <= loss(scale + da, shift + db) + 1e-9
    assert 0.3 < scale < 0.9 and -0.8 < shift < 0.0  # near the map the labels were drawn from
    separable = platt_map([-2.0, -1.0, 1.0, 2.0], [False, False, True, True])
    assert 0 < separable[0] < 100 and math.isfinite(separable[1])
    assert platt_map([1.0, 2.0], [True, True]) == (1.0, 0.0)


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
    result = json.loads(nerkit("calibrate", "--min-entities", "1", "--model", str(model), "--data", str(TINY_DEV)).stdout)
    assert result["grid"] == {str(t): round(f, 6) for t, f in naive.items()}
    assert result["threshold"] == max(naive, key=lambda t: (naive[t], -round(abs(t - 0.5), 6), t))
    assert result["after"]["f1"] == naive[result["threshold"]] >= result["before"]["f1"] == naive[0.5]
    assert len(set(naive.values())) > 3  # the fixture's scores spread: the choice means something
    if not flat:  # flat, 0.5 itself has the best dev F1 of this fixture (or ties it, and a tie goes to 0.5)
        assert result["threshold"] != 0.5
    # the scores' map fitted on the spans predicted at the chosen threshold, and the threshold carried
    # onto its scale: the same spans predicted, scored sigmoid(scale * logit(old score) + shift)
    fitted = result["score_map"]
    meta = json.loads((model / "nerkit.json").read_text())
    assert meta["span_threshold"] == fitted["threshold"]
    assert meta["span_score_map"] == {"scale": fitted["scale"], "shift": fitted["shift"]} and fitted["scale"] > 0
    assert fitted["threshold"] == pytest.approx(sigmoid(fitted["scale"] * logit(result["threshold"]) + fitted["shift"]))
    pipe.span_threshold = result["threshold"]
    unmapped = pipe.predict(DEV_TEXTS, scores=True)
    after = Pipeline.load(model)
    assert after.span_score_map == (fitted["scale"], fitted["shift"])
    mapped = after.predict(DEV_TEXTS, scores=True)
    assert strip(mapped) == strip(unmapped)
    assert [e["score"] for f in mapped for e in f] == pytest.approx(
        [sigmoid(fitted["scale"] * logit(e["score"]) + fitted["shift"]) for f in unmapped for e in f], abs=2e-6)
    assert after.evaluate(TINY_DEV)["f1"] == result["after"]["f1"]
    assert fitted["ece_after"] <= fitted["ece_before"]
    assert after.predict_and_score(read_corpus(TINY_DEV).sentences, with_calibration=True).metrics[
        "calibration"]["ece"] == pytest.approx(fitted["ece_after"], abs=1e-4)
    # without --data: the dev split the model was selected on (the fixture's data.dev is TINY_DEV)
    (tmp_path / "again").mkdir()
    again = copy_of(span_model, tmp_path / "again", flat)
    default = json.loads(nerkit("calibrate", "--min-entities", "1", "--model", str(again)).stdout)
    assert default["grid"] == result["grid"] and default["threshold"] == result["threshold"]


@pytest.mark.slow
def test_the_saved_threshold_is_what_predict_save_load_and_export_use(span_model, tmp_path, nerkit):
    from nerkit.data.corpus import read_corpus
    from nerkit.inference.onnx_runtime import OnnxPipeline
    from nerkit.tools.onnx.export import export_model

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
def test_the_saved_score_map_is_what_predict_save_load_export_and_the_server_use(span_model, tmp_path, nerkit):
    """A map (scale 0.5, shift 0.2) with the threshold 0.3 carried onto its scale: the spans predicted
    at 0.3 without it, each scored sigmoid(0.5 logit(p) + 0.2), by the API, the command line, a saved
    and loaded copy, an ONNX export and the server."""
    from nerkit.data.corpus import read_corpus
    from nerkit.inference.onnx_runtime import OnnxPipeline
    from nerkit.tools.onnx.export import export_model

    model = copy_of(span_model, tmp_path)
    texts = [s.text for s in read_corpus(TINY_TRAIN).sentences[:20]] + TEXTS
    pipe = Pipeline.load(model)
    pipe.span_threshold = 0.3
    expected = [[{**e, "score": round(sigmoid(0.5 * logit(e["score"]) + 0.2), 6)} for e in found]
                for found in pipe.predict(texts, scores=True)]
    assert any(expected), "the fixture predicts nothing at 0.3: the test would check nothing"
    meta = json.loads((model / "nerkit.json").read_text())
    mapped_threshold = sigmoid(0.5 * logit(0.3) + 0.2)
    (model / "nerkit.json").write_text(json.dumps({**meta, "span_threshold": mapped_threshold,
                                                   "span_score_map": {"scale": 0.5, "shift": 0.2}}))

    def same(found):
        return [[{**e, "score": pytest.approx(e["score"], abs=2e-6)} for e in f] for f in found]

    pipe = Pipeline.load(model)
    assert pipe.span_score_map == (0.5, 0.2) and pipe.predict(texts, scores=True) == same(expected)
    # `data select` reads the decision on the same scale: each text alone, the band mapped by hand
    import torch

    from nerkit.features.batch import collate_padded
    from nerkit.model.span import band_valid, decision_log_probability
    from nerkit.model.span_decode import band_cut
    from nerkit.tools.annotation.select import path_confidence

    by_hand = []
    for text in texts:
        batch = collate_padded([pipe.featurizer.example(list(text))], 1, len(text))
        with torch.no_grad():
            band = pipe.model.head.band(pipe.model.hidden(batch)) * 0.5 + 0.2
        by_hand.append(decision_log_probability(band, band_valid(batch.mask, band.size(-1)),
                                                band_cut(mapped_threshold)).item() / len(text))
    assert path_confidence(pipe, texts, window=0) == pytest.approx(by_hand, abs=1e-5)
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    cli = [json.loads(line)["entities"] for line in nerkit("predict", "--model", str(model), "--format", "jsonl",
                                                           "--scores", str(tmp_path / "texts.txt")).stdout.splitlines()]
    assert cli == same(expected)
    pipe.save(tmp_path / "again")
    assert Pipeline.load(tmp_path / "again").predict(texts, scores=True) == same(expected)
    export_model(model, tmp_path / "onnx")
    onnx = OnnxPipeline.load(tmp_path / "onnx", threads=1)
    assert onnx.span_score_map == (0.5, 0.2)
    assert [[{**e, "score": pytest.approx(e["score"], abs=1e-4)} for e in f] for f in expected] == \
        onnx.predict(texts, scores=True)
    with serving(model, tmp_path, "--scores") as server:
        info = httpx.get(f"{server.url}/info", timeout=30).json()
        assert info["score"]["map"] == {"scale": 0.5, "shift": 0.2}
        answer = httpx.post(f"{server.url}/predict", json={"texts": texts}, timeout=60).json()["records"]
        assert [r["entities"] for r in answer] == same(expected)
    (model / "nerkit.json").write_text(json.dumps({**meta, "span_score_map": {"scale": -1, "shift": 0}}))
    refused = nerkit("predict", "--model", str(model), "-", check=False)
    assert refused.returncode == 2 and "span_score_map is" in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.slow
def test_a_damaged_threshold_is_refused_when_the_model_loads(span_model, tmp_path, nerkit):
    model = copy_of(span_model, tmp_path)
    meta = json.loads((model / "nerkit.json").read_text())
    (model / "nerkit.json").write_text(json.dumps({**meta, "span_threshold": 1.5}))
    result = nerkit("predict", "--model", str(model), "-", check=False)
    assert result.returncode == 2 and "span_threshold is 1.5" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_dev_file_without_entities_is_refused(span_model, tmp_path, nerkit):
    from nerkit.tools.annotation.calibrate import calibrate

    model = copy_of(span_model, tmp_path)
    empty = tmp_path / "texts.jsonl"
    empty.write_text("".join(json.dumps({"text": t, "entities": []}, ensure_ascii=False) + "\n" for t in TEXTS),
                     encoding="utf-8")
    before = (model / "nerkit.json").read_text()
    with pytest.raises(UserError, match="no entities"):
        calibrate(model, empty)
    assert (model / "nerkit.json").read_text() == before
    result = nerkit("calibrate", "--min-entities", "1", "--model", str(model), "--data", str(empty), check=False)
    assert result.returncode == 2 and "no entities" in result.stderr and "Traceback" not in result.stderr


def test_platt_map_of_far_logits_neither_overflows_nor_warns():
    """A head trained to certainty scores spans thousands of logits from zero (the contract suite's
    Transformer did, once training fitted the map every epoch): the fit stays finite and silent."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scale, shift = platt_map([-3000.0, -2000.0, 1500.0, 2500.0, 900.0], [False, False, True, True, False])
    assert math.isfinite(scale) and math.isfinite(shift) and scale > 0


def test_a_threshold_rounded_to_0_or_1_keeps_every_span_or_none():
    """A steep score map can round the threshold on its scale to 1.0 (a degenerate fit on a model
    that is barely trained): decoding then keeps nothing rather than dividing by zero."""
    import math

    import numpy as np

    from nerkit.model.span_decode import decode_band, logit

    assert logit(1.0) == math.inf and logit(0.0) == -math.inf and logit(0.5) == 0.0
    band = np.full((1, 1, 3, 2), 5.0, dtype=np.float32)
    assert decode_band(band, [3], 1.0, flat=False) == [[]]
    assert len(decode_band(band, [3], 0.0, flat=False)[0]) == 5  # every valid cell of 3 characters, width 2


def test_a_map_of_the_scores_never_overflows_and_a_steep_one_rounds_to_the_edges():
    """Negative sampling's first epochs fitted a map steep enough that exp() overflowed in training
    (OverflowError); the map is computed through tanh, and fit_scores keeps no map under which the
    threshold itself rounds to 0 or 1."""
    from nerkit.inference.span_threshold import mapped_probability

    assert mapped_probability(0.5, 1.0, 0.0) == pytest.approx(0.5)
    assert mapped_probability(0.9, 2.0, 0.0) == pytest.approx(0.81 / (0.81 + 0.01))  # odds squared
    assert mapped_probability(1e-12, 1e4, -50.0) == 0.0 and mapped_probability(1 - 1e-12, 1e4, 50.0) == 1.0
    assert mapped_probability(-1e6, 1.0, 0.0, is_logit=True) == 0.0
