"""Entity scores end to end (the CRF's own probabilities are tested against brute force in
test_crf.py): every predicted entity of `predict(..., scores=True)` carries the probability the CRF
gives exactly its span and type, the same in a batch as alone, the same whether a short text is read
in one window or stitched from several, and `min_score` keeps exactly the entities at or above it."""

from __future__ import annotations

import pytest

from nerkit.errors import UserError
from nerkit.features.batch import collate_padded
from nerkit.inference.pipeline import Pipeline

TEXTS = ["张三在北京大学读书。", "李四去了上海", "王五和赵六在武汉的华中科技大学见面，然后去了北京。", "。"]


@pytest.fixture(scope="module")
def pipe(tiny_model_dir) -> Pipeline:
    return Pipeline.load(tiny_model_dir)


def test_scores_are_the_crf_probabilities_of_the_entities(pipe):
    found = pipe.predict(TEXTS, scores=True, window=0)  # each text whole, as the reference reads it
    assert any(found), "the tiny model finds no entity: the test would check nothing"
    for text, entities in zip(TEXTS, found):
        example = pipe.featurizer.example(list(text))
        batch = collate_padded([example], 1, len(text))
        emissions = pipe.model.emissions(batch)
        paths = pipe.model.head.crf.decode(emissions, batch.mask)
        expected = pipe.model.head.crf.entity_probabilities(emissions, batch.mask, paths)[0]
        assert [e["score"] for e in entities] == pytest.approx(expected, abs=1e-6)
        assert all(0 < e["score"] <= 1 for e in entities)
    plain = pipe.predict(TEXTS, window=0)
    assert [[{k: v for k, v in e.items() if k != "score"} for e in es] for es in found] == plain
    assert all("score" not in e for es in plain for e in es)


def test_scores_batched_equal_one_at_a_time(pipe):
    together = pipe.predict(TEXTS, scores=True, batch_size=4)
    alone = [pipe.predict(t, scores=True, batch_size=1)[0] for t in TEXTS]
    for a, b in zip(together, alone):
        assert [(e["start"], e["end"], e["type"]) for e in a] == [(e["start"], e["end"], e["type"]) for e in b]
        assert [e["score"] for e in a] == pytest.approx([e["score"] for e in b], abs=1e-5)


def test_a_long_text_takes_each_score_from_the_window_that_holds_the_entity(pipe):
    """A text repeated so that windows cut it: every entity found whole keeps the score its copy has
    in a text of its own when the window holds the copy with the same context."""
    text = TEXTS[2]
    whole = pipe.predict(text * 6, scores=True, window=0)[0]
    windowed = pipe.predict(text * 6, scores=True, window=2 * len(text))[0]
    assert [(e["start"], e["end"], e["type"]) for e in windowed] == [(e["start"], e["end"], e["type"]) for e in whole]
    assert all(0 < e["score"] <= 1 for e in windowed)
    # far from any window's edge the context is the same, and so is the probability, nearly
    middle = [e for e in windowed if 2 * len(text) <= e["start"] < 4 * len(text)]
    by_place = {(e["start"], e["end"]): e["score"] for e in whole}
    assert middle and all(abs(e["score"] - by_place[(e["start"], e["end"])]) < 0.05 for e in middle)


def test_min_score_keeps_what_is_at_or_above_it(pipe):
    scored = pipe.predict(TEXTS, scores=True)
    values = sorted(e["score"] for es in scored for e in es)
    threshold = values[len(values) // 2]
    kept = pipe.predict(TEXTS, min_score=threshold)
    assert kept == [[e for e in es if e["score"] >= threshold] for es in scored]
    assert pipe.predict(TEXTS, min_score=0.0) == scored
    for bad in (-0.1, 1.5, "0.5", True):
        with pytest.raises(Exception, match="probability from 0 to 1"):
            pipe.predict(TEXTS, min_score=bad)


def test_gold_spans_ignore_scores_when_compared():
    from nerkit.data.tags import Span

    assert Span(0, 2, "PER", 0.3) == Span(0, 2, "PER") and len({Span(0, 2, "PER", 0.3), Span(0, 2, "PER")}) == 1


def test_calibration_by_hand():
    """Four predictions, two right: ECE and the bins worked out on paper."""
    from nerkit.data.tags import Span
    from nerkit.inference.evaluate import calibration

    gold = [[Span(0, 2, "PER"), Span(3, 5, "LOC")], [Span(1, 3, "ORG")]]
    predicted = [[Span(0, 2, "PER", 0.95), Span(3, 5, "ORG", 0.85)], [Span(1, 3, "ORG", 0.45), Span(4, 5, "LOC", 0.05)]]
    found = calibration(gold, predicted)
    assert found["entities"] == 4
    by_bin = {b["low"]: b for b in found["bins"] if b["count"]}
    assert set(by_bin) == {0.0, 0.4, 0.8, 0.9}
    assert by_bin[0.9]["accuracy"] == 1.0 and by_bin[0.8]["accuracy"] == 0.0
    # |1 - .95| + |0 - .85| + |1 - .45| + |0 - .05| over 4
    assert found["ece"] == pytest.approx((0.05 + 0.85 + 0.55 + 0.05) / 4)
    assert found["brier"] == pytest.approx((0.05 ** 2 + 0.85 ** 2 + 0.55 ** 2 + 0.05 ** 2) / 4)
    at_half = next(t for t in found["thresholds"] if t["threshold"] == 0.5)
    assert at_half["precision"] == pytest.approx(1 / 2) and at_half["recall"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="scored predictions"):
        calibration(gold, [[Span(0, 2, "PER")], []])


def test_eval_calibration_through_the_command_line(tiny_model_dir, nerkit):
    import json

    from helpers import TINY_DEV

    result = nerkit("eval", "--model", str(tiny_model_dir), "--data", str(TINY_DEV), "--json", "--calibration")
    metrics = json.loads(result.stdout)
    found = metrics["calibration"]
    assert found["entities"] == metrics["counts"]["predicted"] and 0 <= found["ece"] <= 1
    assert found["thresholds"][0]["f1"] == pytest.approx(metrics["f1"])  # threshold 0 keeps every entity
    assert "calibration" not in json.loads(nerkit("eval", "--model", str(tiny_model_dir), "--data", str(TINY_DEV),
                                                  "--json").stdout)


def test_calibrate_fits_a_temperature_that_changes_scores_not_tags(tiny_model_dir, tmp_path, nerkit):
    import json
    import shutil

    from helpers import TINY_DEV

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    before = Pipeline.load(model)
    assert before.score_temperature == 1.0
    result = json.loads(nerkit("calibrate", "--min-entities", "1", "--model", str(model), "--data", str(TINY_DEV)).stdout)
    assert 0.1 <= result["temperature"] <= 10 and result["entities"] > 0
    assert result["after"]["log_loss"] <= result["before"]["log_loss"] + 1e-12
    assert json.loads((model / "nerkit.json").read_text())["score_temperature"] == result["temperature"]
    after = Pipeline.load(model)
    assert after.score_temperature == result["temperature"]
    old, new = before.predict(TEXTS, scores=True, window=0), after.predict(TEXTS, scores=True, window=0)
    strip = lambda found: [[(e["start"], e["end"], e["type"]) for e in es] for es in found]  # noqa: E731
    assert strip(old) == strip(new)  # the tags do not move
    example = after.featurizer.example(list(TEXTS[0]))
    batch = collate_padded([example], 1, len(TEXTS[0]))
    emissions = after.model.emissions(batch)
    paths = after.model.head.crf.decode(emissions, batch.mask)
    expected = after.model.head.crf.entity_probabilities(emissions, batch.mask, paths, result["temperature"])[0]
    assert [e["score"] for e in new[0]] == pytest.approx(expected, abs=1e-6)
    if result["temperature"] != 1.0 and new[0]:
        assert [e["score"] for e in new[0]] != pytest.approx([e["score"] for e in old[0]], abs=1e-6)
    after.save(tmp_path / "saved")  # a saved copy keeps the temperature, so its scores
    saved = Pipeline.load(tmp_path / "saved")
    assert saved.score_temperature == result["temperature"] and saved.predict(TEXTS, scores=True, window=0) == new


def test_calibrate_without_data_fits_on_the_dev_split_the_model_was_selected_on(tiny_model_dir, tmp_path, nerkit):
    import json
    import shutil

    import yaml
    from helpers import TINY_DEV

    from nerkit.config import load_config
    from nerkit.data.splits import train_and_dev
    from nerkit.tools.annotation.calibrate import decode, fit_temperature

    def copy(name: str):
        shutil.copytree(tiny_model_dir, tmp_path / name)
        return tmp_path / name

    given = json.loads(nerkit("calibrate", "--min-entities", "1", "--model", str(copy("given")), "--data", str(TINY_DEV)).stdout)
    default = json.loads(nerkit("calibrate", "--min-entities", "1", "--model", str(copy("default"))).stdout)
    assert default["temperature"] == given["temperature"] and default["entities"] == given["entities"]
    assert default["data"] == f"the dev split of {tmp_path / 'default' / 'config.yaml'}"
    # without data.dev, the share of data.train that training carved off, as training carves it
    carved = copy("carved")
    config = yaml.safe_load((carved / "config.yaml").read_text(encoding="utf-8"))
    config["data"]["dev"] = None
    (carved / "config.yaml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    result = nerkit("calibrate", "--min-entities", "1", "--model", str(carved), check=False)
    pipe = Pipeline.load(carved)
    dev = train_and_dev(load_config(carved / "config.yaml"))[2]
    assert 0 < len(dev) < len(train_and_dev(load_config(carved / "config.yaml"))[1])
    try:
        expected = round(fit_temperature(pipe, decode(pipe, dev, 128, None)), 4)
    except UserError:  # a few training sentences, every entity right: the loss falls to the range's edge
        assert result.returncode == 2 and "edge of the search" in result.stderr
        assert f"the dev split of {carved / 'config.yaml'}" in result.stderr
    else:
        assert json.loads(result.stdout)["temperature"] == expected
    # a training file that is not there: one line naming it, and the fix
    config["data"]["train"] = str(tmp_path / "gone.bio")
    (carved / "config.yaml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    failed = nerkit("calibrate", "--min-entities", "1", "--model", str(carved), check=False)
    assert failed.returncode == 2 and "gone.bio" in failed.stderr and "--data" in failed.stderr and "Traceback" not in failed.stderr


def copy_model(tiny_model_dir, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    return model


def write_jsonl(path, records) -> None:
    import json

    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


def gold_records(shift: int = 0) -> list[dict]:
    """The tiny dev set as JSON lines, each entity moved `shift` characters to the right (where it still fits)."""
    from helpers import TINY_DEV

    from nerkit.data.corpus import read_corpus

    records = []
    for s in read_corpus(TINY_DEV).sentences:
        spans = [g for g in s.spans() if g.end + shift <= len(s.tokens)]
        records.append({"text": "".join(s.tokens), "entities": [
            {"start": g.start + shift, "end": g.end + shift, "type": g.type} for g in spans]})
    return records


def test_calibrate_refuses_a_file_without_entities_and_leaves_the_model_as_it_was(tiny_model_dir, tmp_path, nerkit):
    model = copy_model(tiny_model_dir, tmp_path)
    before = (model / "nerkit.json").read_bytes()
    empty = tmp_path / "empty.jsonl"
    write_jsonl(empty, [{**r, "entities": []} for r in gold_records()])
    result = nerkit("calibrate", "--min-entities", "1", "--model", str(model), "--data", str(empty), check=False)
    assert result.returncode == 2 and "no entities" in result.stderr and str(empty) in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert (model / "nerkit.json").read_bytes() == before
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    kept = nerkit("predict", "--model", str(model), "--min-score", "0.5", str(texts)).stdout
    assert kept == nerkit("predict", "--model", str(tiny_model_dir), "--min-score", "0.5", str(texts)).stdout


def test_calibrate_refuses_fewer_entities_than_its_minimum(tiny_model_dir, tmp_path, nerkit):
    from helpers import TINY_DEV

    from nerkit.inference.evaluate import MIN_CALIBRATION_ENTITIES

    model = copy_model(tiny_model_dir, tmp_path)
    before = (model / "nerkit.json").read_bytes()
    gold = sum(len(r["entities"]) for r in gold_records())
    assert gold < MIN_CALIBRATION_ENTITIES  # the tiny dev set is below the default minimum
    result = nerkit("calibrate", "--model", str(model), "--data", str(TINY_DEV), check=False)
    assert result.returncode == 2 and f"{gold:,} gold entities" in result.stderr and "--min-entities" in result.stderr
    assert (model / "nerkit.json").read_bytes() == before
    too_many = nerkit("calibrate", "--min-entities", str(gold + 1), "--model", str(model), "--data", str(TINY_DEV),
                      check=False)
    assert too_many.returncode == 2 and (model / "nerkit.json").read_bytes() == before
    assert nerkit("calibrate", "--min-entities", str(gold), "--model", str(model), "--data", str(TINY_DEV),
                  check=False).returncode in (0, 2)  # the bar is inclusive; whatever the fit, never a traceback


def test_calibrate_refuses_a_fit_at_the_edge_of_its_range(tiny_model_dir, tmp_path, nerkit):
    """Labels the model never agrees with (every entity moved a character on): the log loss falls
    with T to the end of the range, which is no fit, and is said so rather than written."""
    model = copy_model(tiny_model_dir, tmp_path)
    before = (model / "nerkit.json").read_bytes()
    moved = tmp_path / "moved.jsonl"
    write_jsonl(moved, gold_records(shift=1))
    result = nerkit("calibrate", "--min-entities", "1", "--model", str(model), "--data", str(moved), check=False)
    assert result.returncode == 2 and "edge of the search" in result.stderr and "Traceback" not in result.stderr
    assert (model / "nerkit.json").read_bytes() == before


def test_the_temperature_search_finds_the_grid_minimum_in_few_passes(pipe, monkeypatch):
    """The coarse-then-golden search against a fine grid of log T over the same range: the same
    minimum within the search's tolerance, in at most COARSE + REFINE + 1 forward-backward passes."""
    import math

    from helpers import TINY_DEV

    from nerkit.data.corpus import read_corpus
    from nerkit.tools.annotation import calibrate as module

    decoded = module.decode(pipe, read_corpus(TINY_DEV).sentences, 128, None)
    calls = []
    real = module.log_loss
    monkeypatch.setattr(module, "log_loss", lambda p, d, t: calls.append(t) or real(p, d, t))
    fitted = module.fit_temperature(pipe, decoded)
    assert len(calls) <= module.COARSE + module.REFINE + 1
    grid = [math.exp(math.log(module.LOW) + k * math.log(module.HIGH / module.LOW) / 400) for k in range(401)]
    best = min(grid, key=lambda t: real(pipe, decoded, t))
    assert abs(math.log(fitted) - math.log(best)) < 0.03, (fitted, best)


def test_calibrate_fits_on_the_stitched_entities_each_counted_once(tiny_model_dir, tmp_path, nerkit):
    """Read in half-overlapping windows of 6 characters, each predicted entity counts once, as
    `nerkit eval` counts it, not once for every window that found it."""
    import json

    from helpers import TINY_DEV

    model = copy_model(tiny_model_dir, tmp_path)
    evaluated = json.loads(nerkit("eval", "--model", str(model), "--data", str(TINY_DEV), "--window", "6",
                                  "--json", "--calibration").stdout)
    result = nerkit("calibrate", "--min-entities", "1", "--model", str(model), "--data", str(TINY_DEV),
                    "--window", "6", check=False)
    assert result.returncode in (0, 2) and "Traceback" not in result.stderr
    from nerkit.data.corpus import read_corpus
    from nerkit.tools.annotation.calibrate import decode

    pipe = Pipeline.load(model)
    decoded = decode(pipe, read_corpus(TINY_DEV).sentences, 128, 6)
    assert len(decoded.pieces) > len(read_corpus(TINY_DEV).sentences)  # windows overlap: the test means something
    assert len(decoded.right) == evaluated["counts"]["predicted"] == evaluated["calibration"]["entities"]
    assert sum(decoded.right) == evaluated["counts"]["correct"]


def test_a_damaged_temperature_is_refused_when_the_model_loads(tiny_model_dir, tmp_path, nerkit):
    import json
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    meta = json.loads((model / "nerkit.json").read_text())
    (model / "nerkit.json").write_text(json.dumps({**meta, "score_temperature": -1}))
    result = nerkit("predict", "--model", str(model), "-", check=False)
    assert result.returncode == 2 and "score_temperature is -1" in result.stderr and "Traceback" not in result.stderr


# ------------------------------------------------------------------ every way out: files, workers, exports


def read_lines(text: str) -> list[dict]:
    import json

    return [json.loads(line) for line in text.split("\n") if line]


def test_predict_writes_scores_in_every_json_format_and_min_score_filters(tiny_model_dir, tmp_path, nerkit):
    import json

    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    model = str(tiny_model_dir)
    records = read_lines(nerkit("predict", "--model", model, str(source), "--scores").stdout)
    entities = [e for r in records for e in r["entities"]]
    assert entities and all(0 < e["score"] <= 1 for e in entities)
    plain = read_lines(nerkit("predict", "--model", model, str(source)).stdout)  # jsonl: no scores unless asked
    assert all("score" not in e for r in plain for e in r["entities"])
    assert [[{k: v for k, v in e.items() if k != "score"} for e in r["entities"]] for r in records] == \
        [r["entities"] for r in plain]
    threshold = sorted(e["score"] for e in entities)[len(entities) // 2]
    kept = read_lines(nerkit("predict", "--model", model, str(source), "--min-score", str(threshold)).stdout)
    assert kept == [{**r, "entities": [e for e in r["entities"] if e["score"] >= threshold]} for r in records]
    two = read_lines(nerkit("predict", "--model", model, str(source), "--workers", "2", "--scores").stdout)
    assert two == records
    tasks = json.loads(nerkit("predict", "--model", model, str(source), "--format", "label-studio").stdout)  # scored
    for task, record in zip(tasks, records):
        prediction = task["predictions"][0]
        assert [r["score"] for r in prediction["result"]] == [e["score"] for e in record["entities"]]
        assert prediction.get("score") == (min(e["score"] for e in record["entities"]) if record["entities"] else None)
    doccano = read_lines(nerkit("predict", "--model", model, str(source), "--format", "doccano").stdout)
    assert [d.get("scores", []) for d in doccano] == [[e["score"] for e in r["entities"]] for r in records]
    out = tmp_path / "tasks.json"
    nerkit("predict", "--model", model, str(source), "--format", "label-studio", "--output", str(out))
    nerkit("data", "convert", str(out), str(tmp_path / "back.jsonl"), "--from", "label-studio", "--to", "jsonl")
    back = read_lines((tmp_path / "back.jsonl").read_text(encoding="utf-8"))  # read back, scores and all
    assert [[(e["start"], e["end"], e["type"]) for e in r["entities"]] for r in back] == \
        [[(e["start"], e["end"], e["type"]) for e in r["entities"]] for r in records]


@pytest.mark.slow
def test_an_export_gives_the_pytorch_scores_without_torch(tiny_model_dir, tmp_path, nerkit):
    pytest.importorskip("onnxruntime")
    from nerkit.inference.onnx_runtime import OnnxPipeline

    exported = tmp_path / "onnx"
    nerkit("--quiet", "export", "--model", str(tiny_model_dir), "--out", str(exported))
    torch_pipe, onnx_pipe = Pipeline.load(tiny_model_dir), OnnxPipeline.load(exported, threads=1)
    texts = TEXTS + [TEXTS[2] * 5]
    expected, found = torch_pipe.predict(texts, scores=True), onnx_pipe.predict(texts, scores=True)
    strip = lambda es: [[(e["start"], e["end"], e["type"]) for e in r] for r in es]  # noqa: E731
    assert strip(found) == strip(expected) and any(found)
    for a, b in zip(found, expected):
        assert [e["score"] for e in a] == pytest.approx([e["score"] for e in b], abs=1e-5)
    # an export written before scores (no crf.safetensors) still predicts, its entities unscored
    (exported / "crf.safetensors").unlink()
    old = OnnxPipeline.load(exported, threads=1).predict(texts, scores=True)
    assert strip(old) == strip(expected) and all("score" not in e for r in old for e in r)


# ------------------------------------------------------------------------------------- what to annotate next


def test_data_select_picks_the_least_sure_texts_first(tiny_model_dir, tmp_path, nerkit):
    """The order is that of the best path's mean log-probability per character, each text read
    alone and its probability taken from the CRF (path_probabilities, tested against brute force)."""
    import json
    import math

    from helpers import TINY_DEV

    from nerkit.data.corpus import read_corpus

    pool_texts = [s.text for s in read_corpus(TINY_DEV).sentences][:30]
    pool = tmp_path / "pool.txt"
    pool.write_text("\n".join(pool_texts) + "\n\n", encoding="utf-8")
    pipe = Pipeline.load(tiny_model_dir)
    expected = []
    for text in pool_texts:
        batch = collate_padded([pipe.featurizer.example(list(text))], 1, len(text))
        emissions = pipe.model.emissions(batch)
        paths = pipe.model.head.crf.decode(emissions, batch.mask)
        expected.append(math.log(pipe.model.head.crf.path_probabilities(emissions, batch.mask, paths)[0]) / len(text))
    order = sorted(range(len(pool_texts)), key=lambda i: (expected[i], i))
    found = read_lines(nerkit("data", "select", "--model", str(tiny_model_dir), "--pool", str(pool), "-n", "5",
                              "--window", "0").stdout)
    assert [r["text"] for r in found] == [pool_texts[i] for i in order[:5]]
    assert [r["confidence"] for r in found] == pytest.approx([math.exp(expected[i]) for i in order[:5]], abs=1e-5)
    assert all("score" in e for r in found for e in r["entities"])
    # random: seeded, and a text already annotated is never chosen
    done = tmp_path / "done.jsonl"
    done.write_text("".join(json.dumps({"text": t, "entities": []}, ensure_ascii=False) + "\n"
                            for t in pool_texts[:10]), encoding="utf-8")
    draws = [[r["text"] for r in read_lines(nerkit("data", "select", "--model", str(tiny_model_dir), "--pool",
                                                   str(pool), "-n", "4", "--strategy", "random", "--seed", seed,
                                                   "--exclude", str(done)).stdout)] for seed in ("1", "1", "2")]
    assert draws[0] == draws[1] != draws[2]
    assert not set(draws[0]) & set(pool_texts[:10]) and len(draws[0]) == 4
    tasks = tmp_path / "tasks.json"
    nerkit("data", "select", "--model", str(tiny_model_dir), "--pool", str(pool), "-n", "3", "-f", "label-studio",
           "-o", str(tasks))
    loaded = json.loads(tasks.read_text(encoding="utf-8"))
    assert [t["data"]["text"] for t in loaded] == [r["text"] for r in found[:3]]
    assert all("confidence" in t["data"] and "predictions" in t for t in loaded)
    refused = nerkit("data", "select", "--model", str(tiny_model_dir), "--pool", str(pool), "-n", "3",
                     "-o", str(pool), check=False)
    assert refused.returncode == 2 and "is the input file" in refused.stderr


def test_data_select_refuses_a_pool_with_nothing_to_choose_before_writing(tiny_model_dir, tmp_path, nerkit):
    """Issue 55: an empty pool exited 0 and wrote an empty task file over --out. A pool without a
    text, or whose every text is in --exclude, is refused in one line naming it; --out is untouched."""
    import json

    out = tmp_path / "next.json"
    out.write_text("the tasks of last round\n", encoding="utf-8")
    done = tmp_path / "done.jsonl"
    done.write_text(json.dumps({"text": "张三在北京", "entities": []}, ensure_ascii=False) + "\n", encoding="utf-8")
    pools = {"empty.txt": "", "blank.txt": "\n  \n", "empty.jsonl": "", "done.txt": "张三在北京\n\n"}
    for name, content in pools.items():
        pool = tmp_path / name
        pool.write_text(content, encoding="utf-8")
        refused = nerkit("data", "select", "--model", str(tiny_model_dir), "--pool", str(pool), "-n", "3",
                         "-f", "label-studio", "-o", str(out), "--exclude", str(done), check=False)
        assert refused.returncode == 2, (name, refused.stderr)
        assert len(refused.stderr.strip().splitlines()) == 1 and f"{pool}:" in refused.stderr
        assert ("already annotated" if name == "done.txt" else "no text to choose") in refused.stderr
        assert out.read_text(encoding="utf-8") == "the tasks of last round\n"

def test_bench_loop_simulates_the_annotation_loop_and_resumes(tmp_path, nerkit):
    import json

    from helpers import write_loop_config

    config = write_loop_config(tmp_path)
    out = tmp_path / "loop"
    args = ["bench", "loop", "--config", str(config), "--out", str(out), "--start", "10", "--add", "10", "--seeds", "1"]
    nerkit(*args, "--rounds", "1")  # stopped after round 1 ...
    nerkit(*args, "--rounds", "2", "--resume")  # ... and carried on
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted((r["strategy"], r["round"], r["sentences"]) for r in records) == [
        ("random", 0, 10), ("random", 1, 20), ("random", 2, 30),
        ("uncertainty", 0, 10), ("uncertainty", 1, 20), ("uncertainty", 2, 30)]
    first = {r["strategy"]: r for r in records if r["round"] == 0}
    assert first["random"]["dev_f1"] == first["uncertainty"]["dev_f1"]  # the same start, the same training
    chosen = {s: json.loads((out / "state" / f"{s}-s1.json").read_text())["labelled"] for s in ("random", "uncertainty")}
    assert chosen["random"][:10] == chosen["uncertainty"][:10] and chosen["random"] != chosen["uncertainty"]
    assert all(len(set(c)) == len(c) == 30 for c in chosen.values())
    refused = nerkit(*args, "--rounds", "2", check=False)  # a finished loop is not overwritten without --resume
    assert refused.returncode == 2 and "not empty" in refused.stderr


def test_plot_loop_draws_the_recorded_loop(tmp_path, nerkit):
    from helpers import REPO

    records = REPO / "docs" / "bench" / "gpu-loop-2026-11-27" / "results.jsonl"
    out = tmp_path / "loop.png"
    nerkit("plot", "loop", str(records), "--out", str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    wrong = tmp_path / "other.jsonl"
    wrong.write_text('{"text": "x"}\n', encoding="utf-8")
    refused = nerkit("plot", "loop", str(wrong), "--out", str(out), check=False)
    assert refused.returncode == 2 and "nerkit bench loop" in refused.stderr


def test_plot_reliability_draws_eval_output_and_records(tiny_model_dir, tmp_path, nerkit):
    from helpers import REPO, TINY_DEV

    found = tmp_path / "eval.json"
    found.write_text(nerkit("eval", "--model", str(tiny_model_dir), "--data", str(TINY_DEV), "--calibration",
                            "--json").stdout, encoding="utf-8")
    records = REPO / "docs" / "bench" / "gpu-calibration-2026-11-27" / "results.jsonl"
    out = tmp_path / "r.svg"
    nerkit("plot", "reliability", str(found), str(records), "--out", str(out))
    svg = out.read_text(encoding="utf-8")
    assert "eval: ECE" in svg and "peopledaily lm_crf, T 1.50" in svg  # one curve from each kind of file
    refused = nerkit("plot", "reliability", str(TINY_DEV), "--out", str(out), check=False)
    assert refused.returncode == 2 and "calibration" in refused.stderr


def test_an_entity_found_in_two_windows_takes_the_score_of_the_one_holding_it_more_centrally():
    """Text 6:8 lies 6 and 2 characters from the ends of window 0:10, 1 and 7 from those of 5:15:
    the first holds it more centrally, whatever else either window found."""
    from nerkit.data.tags import Span
    from nerkit.inference.predictor import scored_spans

    windows = [(0, 10, [Span(6, 8, "X", 0.9)]), (5, 15, [Span(1, 3, "X", 0.5), Span(8, 10, "Y", 0.7)])]
    found = scored_spans([Span(6, 8, "X"), Span(13, 15, "Y")], windows)
    assert [s.score for s in found] == [0.9, 0.7]
