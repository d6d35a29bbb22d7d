"""Tests for nerkit.training.loop: the model directory and history a run writes, bit-identical seeded runs,
early stopping and step limits, the seeded dev split, the output-directory guard, and a learning
test on the first 2,000 MSRA sentences."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers import TINY_TRAIN

import nerkit.training.loop
from nerkit.config import build_config, load_config
from nerkit.data.corpus import read_corpus
from nerkit.data.splits import read_splits
from nerkit.errors import UserError
from nerkit.inference.model_dir import MODEL_FILES
from nerkit.inference.pipeline import Pipeline
from nerkit.training.build import build_pipeline
from nerkit.training.loop import train

HISTORY_KEYS = {"loss", "dev_precision", "dev_recall", "dev_f1", "chars_per_s", "elapsed_s"}


def read_history(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_run_writes_a_complete_model_directory_and_history(tiny_model_dir):
    out = tiny_model_dir  # trained once per session: 6 epochs, patience 0
    for directory in (out, out / "last"):
        for name in MODEL_FILES + ("metrics.json",):
            assert (directory / name).is_file(), directory / name
        Pipeline.load(directory)
    history = read_history(out)
    assert [r["epoch"] for r in history] == [1, 2, 3, 4, 5, 6]
    for record in history:
        assert HISTORY_KEYS <= record.keys()
        assert record["loss"] > 0 and record["chars_per_s"] > 0
        assert all(0 <= record[k] <= 1 for k in ("dev_precision", "dev_recall", "dev_f1"))
    assert [r["elapsed_s"] for r in history] == sorted(r["elapsed_s"] for r in history)
    assert history[-1]["loss"] < history[0]["loss"]
    metrics = json.loads((out / "metrics.json").read_text())
    best = max(history, key=lambda r: r["dev_f1"])
    assert metrics["stopped"] == "epochs" and metrics["epochs"] == 6
    assert metrics["best_epoch"] == min(r["epoch"] for r in history if r["dev_f1"] == best["dev_f1"])
    assert metrics["dev"]["f1"] == pytest.approx(best["dev_f1"])
    assert json.loads((out / "last" / "metrics.json").read_text())["epoch"] == 6
    # The resolved config is saved with the model and loads again.
    assert load_config(out / "config.yaml").encoder.options.hidden_size == 16


def test_two_seeded_runs_are_bit_identical_and_another_seed_differs(tmp_path, tiny_config):
    runs = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        train(tiny_config("train.epochs=2", f"train.seed={seed}"), out=tmp_path / name)
        out = tmp_path / name
        runs[name] = (out / "model.safetensors").read_bytes(), (out / "last" / "model.safetensors").read_bytes()
    assert runs["a"] == runs["b"]
    assert runs["a"][0] != runs["c"][0]
    losses = [[r["loss"] for r in read_history(tmp_path / name)] for name in ("a", "b")]
    assert losses[0] == losses[1]


def test_the_best_epochs_dev_figures_are_reported_without_scoring_dev_again(tmp_path, tiny_config, monkeypatch):
    """finish() reports the dev metrics the best epoch was chosen by: the saved model scores them
    again to the last digit, and dev is scored once an epoch, not once more at the end."""
    calls = []
    evaluate = nerkit.training.loop.evaluate
    monkeypatch.setattr(nerkit.training.loop, "evaluate", lambda run, sentences: calls.append(1) or evaluate(run, sentences))
    out = tmp_path / "m"
    config = tiny_config("train.epochs=3")
    metrics = train(config, out=out)
    assert len(calls) == 3  # the epochs' dev; the tiny config has no test set
    assert json.loads((out / "metrics.json").read_text())["dev"] == metrics["dev"]
    assert Pipeline.load(out).evaluate(read_splits(config).dev, config.train.eval_batch_size) == metrics["dev"]


def test_early_stopping_stops_after_patience_epochs_without_improvement(tmp_path, tiny_config):
    # lr 0: the dev score never changes, so only epoch 1 counts as an improvement.
    metrics = train(tiny_config("train.lr=0", "train.patience=2", "train.epochs=10"), out=tmp_path / "m")
    assert metrics["stopped"] == "early_stopping"
    assert metrics["epochs"] == 3 and metrics["best_epoch"] == 1
    assert len(read_history(tmp_path / "m")) == 3


@pytest.mark.parametrize("limit, stopped, steps", [("train.max_steps=3", "max_steps", 3),
                                                   ("train.time_budget=1e-9", "time_budget", 1)])
def test_step_and_time_limits_stop_inside_an_epoch(tmp_path, tiny_config, limit, stopped, steps):
    metrics = train(tiny_config(limit, "train.epochs=5"), out=tmp_path / "m")
    assert metrics["stopped"] == stopped and metrics["steps"] == steps
    assert [r["step"] for r in read_history(tmp_path / "m")] == [steps]  # the dev score of the cut epoch
    assert (tmp_path / "m" / "model.safetensors").is_file()


def test_dev_is_carved_from_train_when_absent_seeded_disjoint_and_reproducible(tiny_config):
    def split(*overrides):
        data = read_splits(tiny_config("data.dev=null", "data.dev_split=0.25", *overrides))
        return [s.line for s in data.train], [s.line for s in data.dev]

    all_lines = [s.line for s in read_corpus(tiny_config().data.train).sentences]
    train_lines, dev_lines = split()
    assert len(dev_lines) == 15 and not set(train_lines) & set(dev_lines)
    assert sorted(train_lines + dev_lines) == all_lines
    assert split() == (train_lines, dev_lines)
    assert split("data.split_seed=99")[1] != dev_lines
    limited_train, limited_dev = split("data.limit=40")
    assert sorted(limited_train + limited_dev) == all_lines[:40] and len(limited_dev) == 10


def test_a_limit_reads_the_training_file_only_that_far(tmp_path, tiny_config):
    """data.limit: a training file whose lines after the limit are malformed trains as the whole one
    does with the same limit (the same sentences, types and scheme)."""
    broken = tmp_path / "broken.bio"
    broken.write_text(TINY_TRAIN.read_text(encoding="utf-8") + "\n北 B-LOC x y\n京 M-LOC\n", encoding="utf-8")
    with pytest.raises(UserError):
        read_splits(tiny_config(f"data.train={broken}"))
    whole, cut = (read_splits(tiny_config(f"data.train={path}", "data.limit=40")) for path in (TINY_TRAIN, broken))
    assert [(s.tokens, s.tags) for s in cut.train] == [(s.tokens, s.tags) for s in whole.train]
    assert (cut.types, cut.scheme) == (whole.types, whole.scheme)
    assert train(tiny_config(f"data.train={broken}", "data.limit=40", "train.epochs=1"), out=tmp_path / "m")["best_epoch"] == 1


def test_the_log_of_pieces_says_which_were_kept_longer_for_an_entity(tmp_path, tiny_config, caplog):
    """Issue 55: "pieces of at most 250 characters" while a piece holding a longer entity stayed
    whole (1,424 characters): the log counts those pieces and names the longest."""
    path = tmp_path / "long.jsonl"
    records = [{"text": "张三在北京。" * 3 + "上海" * 6 + "，李四。",
                "entities": [{"start": 0, "end": 2, "type": "PER"}, {"start": 18, "end": 30, "type": "LOC"}]},
               {"text": "王五在南京工作。", "entities": [{"start": 0, "end": 2, "type": "PER"}]}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    with caplog.at_level("INFO", logger="nerkit"):
        splits = read_splits(tiny_config(f"data.train={path}", f"data.dev={path}", "data.max_len=8"))
    assert max(len(s) for s in splits.train) == 12  # the LOC of 12 characters keeps its piece whole
    assert ("train: 2 sentences split into 6 pieces of at most 8 characters (1 kept longer to keep an entity whole, "
            "the longest 12)") in caplog.messages
    caplog.clear()
    with caplog.at_level("INFO", logger="nerkit"):
        read_splits(tiny_config(f"data.train={path}", f"data.dev={path}", "data.max_len=12"))
    assert [m for m in caplog.messages if m.startswith("train: ")] == ["train: 2 sentences split into 5 pieces of at "
                                                                        "most 12 characters"]


def test_insert_spaces_puts_spaces_outside_entities_in_train_only(tiny_config):
    """data.insert_spaces: space tokens tagged O in gaps that no entity crosses, seeded, in the
    training sentences only; the entities keep their text, and the vocabulary learns the space."""
    from nerkit.data.tags import scheme_tags
    from nerkit.features.featurizer import SPACE, Featurizer

    plain = read_splits(tiny_config())
    spaced = read_splits(tiny_config("data.insert_spaces=0.3"))
    assert spaced.dev == plain.dev
    assert len(spaced.train) == len(plain.train)
    inserted = 0
    for before, after in zip(plain.train, spaced.train):
        kept = [(t, g) for t, g in zip(after.tokens, after.tags) if t != SPACE or g != "O"]
        assert kept == list(zip(before.tokens, before.tags))  # only spaces were added, tagged O
        assert [after.text[s.start:s.end] for s in after.spans()] == [before.text[s.start:s.end] for s in before.spans()]
        inserted += len(after) - len(before)
    total = sum(len(s) + 1 for s in plain.train)
    assert 0.15 * total < inserted < 0.3 * total  # every gap outside an entity, with probability 0.3
    assert [s.tokens for s in read_splits(tiny_config("data.insert_spaces=0.3")).train] == [s.tokens for s in spaced.train]
    tags = scheme_tags(plain.types, plain.scheme)
    assert SPACE in Featurizer.build(tiny_config(), spaced.train, tags).chars
    assert SPACE not in Featurizer.build(tiny_config(), plain.train, tags).chars


def test_training_without_a_dev_file_uses_the_carved_split(tmp_path, tiny_config):
    metrics = train(tiny_config("data.dev=null", "data.dev_split=0.25", "train.epochs=1"), out=tmp_path / "m")
    assert metrics["dev"]["counts"]["gold"] == sum(len(s.spans()) for s in read_splits(
        tiny_config("data.dev=null", "data.dev_split=0.25")).dev)


def test_a_non_empty_output_directory_is_refused_without_force(tmp_path, tiny_config):
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(UserError, match="not empty") as info:
        train(tiny_config("train.epochs=1"), out=out)
    assert info.value.where == str(out)
    assert (out / "keep.txt").read_text() == "precious" and sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    with pytest.raises(UserError, match="not an earlier run's directory"):  # --force replaces only a run's
        train(tiny_config("train.epochs=1"), out=out, force=True)
    assert (out / "keep.txt").read_text() == "precious"
    empty = tmp_path / "empty"
    empty.mkdir()
    train(tiny_config("train.epochs=1"), out=empty)  # an existing empty directory is fine
    (empty / "stale.txt").write_text("from the run before")
    train(tiny_config("train.epochs=1"), out=empty, force=True)  # an earlier run's directory is replaced
    assert not (empty / "stale.txt").exists() and (empty / "model.safetensors").is_file()
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError):
        train(tiny_config("train.epochs=1"), out=tmp_path / "file")


def test_the_output_directory_and_the_data_files_are_checked_before_any_data_is_read(tmp_path, tiny_config,
                                                                                    monkeypatch):
    """A non-empty --out, or a corpus path that is not a file, used to be found only after the
    training data had loaded (13-19 s on MSRA): now before anything is read. --force and --resume
    keep their meaning."""
    import nerkit.data.splits

    def read(*args, **kwargs):
        raise AssertionError("data was read before the checks")

    monkeypatch.setattr(nerkit.data.splits, "read_gold", read)
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("precious")
    with pytest.raises(UserError, match="not empty"):
        train(tiny_config("train.epochs=1"), out=used)
    (tmp_path / "a_dir").mkdir()
    for key, path, words in [("test", tmp_path / "missing.bio", "data.test: no such file"),
                             ("dev", tmp_path / "a_dir", "data.dev: not a file")]:
        with pytest.raises(UserError, match=words) as info:
            train(tiny_config(f"data.{key}={path}"), out=tmp_path / "new")
        assert info.value.where == str(path)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(UserError, match="not a directory"):
        train(tiny_config(), out=tmp_path / "a_file" / "model")
    assert not (tmp_path / "new").exists()
    # With --force an earlier run's directory passes the checks and the data is read (here: refused by
    # the stub) before anything is removed.
    (used / "config.yaml").write_text("an earlier run's")
    with pytest.raises(AssertionError, match="data was read"):
        train(tiny_config("train.epochs=1"), out=used, force=True)
    assert (used / "keep.txt").read_text() == "precious"


# ----------------------------------------------------------------------------------- learning test

# Measured (seed 1, one thread: the run is deterministic, bounded by epochs, never by seconds, so a
# loaded machine only makes it slower): dev F1 per epoch 0.361, 0.585, 0.610, 0.652 with plain Adam,
# 0.361, 0.585, 0.610, 0.662 with fused Adam (the same arithmetic in another order); an untrained model of the
# same config scores 0.0006 (1 of 3,042 guesses right). The floor sits far below the first figure and
# far above the second.
LEARNING_FLOOR = 0.40


@pytest.mark.slow
@pytest.mark.slow
def test_bilstm_learns_msra_from_2000_sentences(data_root, tmp_path, monkeypatch):
    path = data_root / "msra" / "train_dev.char.bmes"
    if not path.is_file():
        pytest.skip(f"MSRA training data not found at {path} (set NERKIT_DATA)")
    config = build_config({
        "data": {"train": str(path), "limit": 2000, "dev_split": 0.1, "max_len": 100},
        "embeddings": {"char_dim": 64, "bichar_dim": 32, "dropout": 0.2},
        "encoder": {"name": "bilstm", "hidden_size": 64},
        "train": {"epochs": 4, "batch_size": 16, "lr": 0.01, "patience": 0, "seed": 1, "device": "cpu",
                  "threads": 1},
    })
    seen = {}

    def capture(cfg):
        seen["data"] = data = read_splits(cfg)
        return data

    monkeypatch.setattr(nerkit.training.loop, "read_splits", capture)
    trained = train(config, out=tmp_path / "msra")["dev"]["f1"]
    data = seen["data"]
    assert len(data.dev) == 200
    torch.manual_seed(config.train.seed)
    untrained = build_pipeline(config, data).evaluate(data.dev)["f1"]
    assert untrained < 0.05, f"untrained dev F1 {untrained:.4f}"
    assert trained >= LEARNING_FLOOR, f"dev F1 {trained:.4f} after training (untrained {untrained:.4f})"


def test_a_finished_run_resumed_with_more_epochs_equals_a_longer_run(tmp_path, tiny_config):
    # Constant learning rate, so the first two epochs are the same in both runs.
    train(tiny_config("train.epochs=3", "train.patience=0"), out=tmp_path / "long")
    train(tiny_config("train.epochs=2", "train.patience=0"), out=tmp_path / "short")
    config = nerkit.training.run_dir.resume_config(tmp_path / "short", ["train.epochs=3"])
    train(config, out=tmp_path / "short", resume=True)
    assert load_config(tmp_path / "short" / "config.yaml").train.epochs == 3  # saved for the record
    assert [r["epoch"] for r in read_history(tmp_path / "short")] == [1, 2, 3]
    for name in ("model.safetensors", "last/model.safetensors"):
        assert (tmp_path / "short" / name).read_bytes() == (tmp_path / "long" / name).read_bytes()


def test_resuming_after_the_training_data_changed_is_a_user_error(tmp_path, tiny_config):
    """Changed training data builds another vocabulary, i.e. weights of other shapes: the checksum
    check comes before the weights are loaded, so the user reads what changed, not a shape error."""
    corpus = tmp_path / "train.bio"
    shutil.copy(TINY_TRAIN, corpus)
    train(tiny_config(f"data.train={corpus}", "train.epochs=1"), out=tmp_path / "run")
    with corpus.open("a", encoding="utf-8") as f:
        f.write("\n鑫 B-PER\n")  # a character the vocabulary has not seen
    config = nerkit.training.run_dir.resume_config(tmp_path / "run", ["train.epochs=2"])
    with pytest.raises(UserError, match="the train data changed since the run started"):
        train(config, out=tmp_path / "run", resume=True)


def test_resuming_refuses_changes_that_would_alter_the_model(tmp_path, tiny_config):
    train(tiny_config("train.epochs=1"), out=tmp_path / "run")
    with pytest.raises(UserError, match="encoder.hidden_size cannot change when resuming"):
        nerkit.training.run_dir.resume_config(tmp_path / "run", ["encoder.hidden_size=32"])


# ------------------------------------------------------------------------------ warm-up and limits


@pytest.fixture
def nerkit_log():
    """The messages of the `nerkit` loggers at INFO and above, whatever the CLI's logging set-up."""
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    logger = logging.getLogger("nerkit")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


def warnings_of(records) -> list[str]:
    return [r.getMessage() for r in records if r.levelname == "WARNING"]


def test_a_warm_up_longer_than_the_run_is_reported_at_set_up(tmp_path, tiny_config, nerkit_log):
    """8 batches per epoch, 2 epochs: a warm-up of 20 steps keeps the run below train.lr all along,
    and says so (with the value a tenth of the run would be)."""
    train(tiny_config("train.epochs=2", "train.warmup_steps=20"), out=tmp_path / "a")
    found = [m for m in warnings_of(nerkit_log) if "train.warmup_steps = 20" in m]
    assert len(found) == 1 and "that 2 epochs of" in found[0] and "--set train.warmup=0.1" in found[0], found
    nerkit_log.clear()
    train(tiny_config("train.epochs=2", "train.warmup_steps=3"), out=tmp_path / "b")
    assert not [m for m in warnings_of(nerkit_log) if "warmup" in m]
    train(tiny_config("train.epochs=50", "train.max_steps=10", "train.warmup_steps=8"), out=tmp_path / "c")
    assert any("that train.max_steps allows" in m for m in warnings_of(nerkit_log))


def test_a_warm_up_longer_than_a_time_budget_allows_is_reported(tmp_path, tiny_config, nerkit_log, monkeypatch):
    """The defect: 2,760 warm-up steps on an 85-step epoch with a time budget trained silently at a
    fraction of its rate. The steps a budget allows are known after an epoch, at the pace so far."""
    clock = iter(range(0, 10**6, 1))  # one second per reading of the clock: a slow machine
    monkeypatch.setattr(nerkit.training.loop.time, "perf_counter", lambda: float(next(clock)))
    train(tiny_config("train.epochs=100", "train.warmup_steps=200", "train.time_budget=40"), out=tmp_path / "m")
    found = [m for m in warnings_of(nerkit_log) if "train.warmup_steps = 200" in m]
    assert len(found) == 1 and "that train.time_budget = 40 s allows at this pace" in found[0], warnings_of(nerkit_log)


@pytest.mark.parametrize("limit, key, value", [("train.max_steps=3", "max_steps", "6"),
                                               ("train.time_budget=1e-9", "time_budget", "2e-09")])
def test_a_run_a_limit_stops_prints_the_resume_command(tmp_path, tiny_config, nerkit_log, limit, key, value):
    """As Ctrl-C does: a run that train.max_steps or train.time_budget stopped says how to go on."""
    out = tmp_path / "m"
    train(tiny_config(limit, "train.epochs=5"), out=out)
    assert any(f"continue with: nerkit train --resume {out} --set train.{key}={value}" in m
               for m in warnings_of(nerkit_log)), warnings_of(nerkit_log)
    nerkit_log.clear()
    train(tiny_config("train.epochs=1"), out=tmp_path / "done")
    assert not [m for m in warnings_of(nerkit_log) if "--resume" in m]
