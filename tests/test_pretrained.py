"""Pretrained inputs inside a whole model: static vectors (every file row kept, widths read from the
file, unit length, coverage, <unk> trained by token dropout) and a language model's features (fine-tuned
or frozen and cached, through any encoder and with none), trained, saved and loaded on a machine
that has neither the vector files nor the LM directory."""

from __future__ import annotations

import importlib.util
import shutil

import numpy as np
import pytest
import torch
from helpers import TINY_DEV, training_chars

from nerkit.data.corpus import read_corpus
from nerkit.data.splits import read_splits
from nerkit.errors import UserError
from nerkit.inference.pipeline import Pipeline
from nerkit.training.build import build_pipeline
from nerkit.training.loop import train

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="transformers is not installed (make install adds it)")


def write_vectors(path, words: list[str], dim: int, seed: int = 0) -> np.ndarray:
    matrix = np.random.default_rng(seed).normal(size=(len(words), dim)).astype(np.float32)
    lines = [f"{len(words)} {dim}"] + [w + " " + " ".join(f"{v:.6f}" for v in row) for w, row in zip(words, matrix)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return np.array([[float(f"{v:.6f}") for v in row] for row in matrix], dtype=np.float32)


# ----------------------------------------------------------------------- static vectors


def test_every_row_of_a_vector_file_joins_the_model_at_unit_length(tmp_path, tiny_config):
    seen = training_chars()[:10]
    unseen = ["龘", "靐", "齉"]  # in the file, never in training
    matrix = write_vectors(tmp_path / "char.vec", seen + unseen, 6)
    config = tiny_config(f"embeddings.char_vectors={tmp_path / 'char.vec'}", "embeddings.char_dim=null")
    assert config.embeddings.char_dim is None  # the width comes from the file
    pipe = build_pipeline(config, read_splits(config))
    assert pipe.config.embeddings.char_dim == 6 and config.embeddings.char_dim is None  # resolved in a copy
    chars, table = pipe.featurizer.chars, pipe.model.embedder.chars.weight.detach()
    for word, row in zip(seen + unseen, matrix):
        assert word in chars
        expected = torch.from_numpy(row / np.linalg.norm(row))
        torch.testing.assert_close(table[chars.index[word]], expected)
    # a text with a character only the vector file knows reaches the model with its vector, not <unk>
    assert pipe.featurizer.example(["龘"]).char_ids == [chars.index["龘"]]


def test_keep_train_leaves_the_unseen_rows_out_and_normalisation_can_be_off(tmp_path, tiny_config):
    seen = training_chars()[:5]
    matrix = write_vectors(tmp_path / "char.vec", seen + ["龘"], 4)
    config = tiny_config(f"embeddings.char_vectors={tmp_path / 'char.vec'}", "embeddings.char_dim=null", "embeddings.vectors_keep=train",
                         "embeddings.vectors_normalize=false")
    pipe = build_pipeline(config, read_splits(config))
    assert "龘" not in pipe.featurizer.chars
    row = pipe.model.embedder.chars.weight.detach()[pipe.featurizer.chars.index[seen[0]]]
    torch.testing.assert_close(row, torch.from_numpy(matrix[0]))


def test_a_width_that_disagrees_with_the_file_names_both(tmp_path, tiny_config):
    write_vectors(tmp_path / "char.vec", training_chars()[:3], 6)
    config = tiny_config(f"embeddings.char_vectors={tmp_path / 'char.vec'}", "embeddings.char_dim=16")
    with pytest.raises(UserError, match="the vector file has dimension 6, but the config's embeddings.char_dim is 16"):
        build_pipeline(config, read_splits(config))


def test_coverage_is_logged(tmp_path, tiny_config, caplog):
    write_vectors(tmp_path / "char.vec", training_chars()[:3], 4)
    config = tiny_config(f"embeddings.char_vectors={tmp_path / 'char.vec'}", "embeddings.char_dim=null")
    with caplog.at_level("INFO", logger="nerkit"):
        build_pipeline(config, read_splits(config))
    assert any("training chars with a vector: types 3/" in r.message for r in caplog.records)


def test_token_dropout_trains_the_unk_row(tiny_config):
    """Without token dropout no training token is <unk> (min_freq 1), so its row never moves; with it
    the row learns."""
    from nerkit.features.batch import collate
    from nerkit.training.loop import train_step
    from nerkit.training.schedule import make_optimizer

    for p, moves in ((0.0, False), (0.2, True)):
        config = tiny_config(f"embeddings.token_dropout={p}")
        splits = read_splits(config)
        torch.manual_seed(0)
        pipe = build_pipeline(config, splits)
        before = pipe.model.embedder.chars.weight.detach()[1].clone()
        examples = [pipe.featurizer.training_example(s) for s in splits.train]
        optimizer = make_optimizer(config, pipe.model)
        pipe.model.train()
        for i in range(5):
            train_step(pipe.model, collate(examples[8 * i:8 * i + 8]), optimizer)
        assert (not torch.equal(pipe.model.embedder.chars.weight.detach()[1], before)) is moves, p


def test_a_model_with_vectors_loads_without_the_vector_file(tmp_path, tiny_config):
    write_vectors(tmp_path / "char.vec", training_chars()[:8] + ["龘"], 6)
    config = tiny_config(f"embeddings.char_vectors={tmp_path / 'char.vec'}", "embeddings.char_dim=null", "train.epochs=1")
    train(config, out=tmp_path / "model", progress_bar=False)
    (tmp_path / "char.vec").unlink()
    loaded = Pipeline.load(tmp_path / "model")
    assert loaded.config.embeddings.char_dim == 6 and "龘" in loaded.featurizer.chars
    assert loaded.predict(["龘张三"])  # runs


# ----------------------------------------------------------------------- language-model features


@needs_transformers
@pytest.mark.parametrize("encoder", ["none", "bilstm", "flat"])
def test_a_fine_tuned_lm_model_saves_and_loads_without_the_lm_directory(tmp_path, tiny_config, lm_dir, encoder):
    overrides = [f"encoder.name={encoder}", f"embeddings.lm.path={lm_dir}", "embeddings.lm.finetune=true",
                 "embeddings.lm.lr=0.001", "train.epochs=2", "embeddings.char_dim=4", "embeddings.bichar_dim=0"]
    if encoder == "flat":
        words = tmp_path / "words.txt"
        words.write_text("张三\n北京\n北京大学\n新华社\n", encoding="utf-8")
        overrides += [f"lexicon.source={words}", "encoder.n_heads=2", "encoder.head_dim=4", "embeddings.word_dim=4"]
    config = tiny_config(*overrides)
    out = tmp_path / "model"
    metrics = train(config, out=out, progress_bar=False)
    shutil.rmtree(lm_dir)  # the model directory must carry everything
    assert (out / "lm" / "config.json").is_file() and (out / "lm" / "vocab.txt").is_file()
    assert not (out / "lm" / "model.safetensors").exists()  # the weights are in the model's own file, once
    loaded = Pipeline.load(out)
    assert loaded.evaluate(TINY_DEV)["counts"] == metrics["dev"]["counts"]
    texts = [s.text for s in read_corpus(TINY_DEV).sentences] + ["张三" * 40]  # longer than the LM's 16 positions
    predicted = loaded.predict(texts)
    loaded.save(tmp_path / "again")
    assert Pipeline.load(tmp_path / "again").predict(texts) == predicted


@needs_transformers
def test_the_lm_gets_its_own_learning_rate(tiny_config, lm_dir):
    from nerkit.training.schedule import make_optimizer

    config = tiny_config(f"embeddings.lm.path={lm_dir}", "embeddings.lm.finetune=true", "embeddings.lm.lr=0.0001")
    pipe = build_pipeline(config, read_splits(config))
    groups = make_optimizer(config, pipe.model).param_groups
    assert [g["lr"] for g in groups] == [config.train.lr, 0.0001]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in pipe.model.lm_parameters()[0]}


@needs_transformers
def test_a_frozen_lm_runs_once_per_corpus_and_its_cache_equals_running_it(tmp_path, tiny_config, lm_dir, monkeypatch):
    """Training examples carry the cached states; the emissions they give equal those of the LM
    run live on the same batch, and a second run reads the cache without calling the LM."""
    from nerkit.features.batch import collate
    from nerkit.training.loop import attach_lm_cache

    config = tiny_config(f"embeddings.lm.path={lm_dir}", f"embeddings.lm.cache={tmp_path / 'cache'}",
                         "embeddings.lm.layers=mix")
    splits = read_splits(config)
    pipe = build_pipeline(config, splits)
    examples = [pipe.featurizer.training_example(s) for s in splits.train]
    attach_lm_cache(config, pipe, splits, examples)
    assert all(e.lm_states is not None and e.lm_states.shape[0] == len(e) for e in examples)
    pipe.model.eval()
    cached = collate(examples[:6])
    live = collate([pipe.featurizer.training_example(s) for s in splits.train[:6]])
    assert cached.lm_states is not None and live.lm_states is None
    with torch.no_grad():
        torch.testing.assert_close(pipe.model.emissions(cached), pipe.model.emissions(live), atol=2e-2, rtol=1e-2)
    lm = pipe.model.embedder.lm
    monkeypatch.setattr(lm, "states", lambda *a: pytest.fail("the LM ran again instead of the cache"))
    attach_lm_cache(config, pipe, splits, [pipe.featurizer.training_example(s) for s in splits.train])
    assert not any(p.requires_grad for p in lm.lm.parameters())
    assert all(p.requires_grad for p in lm.scalar_mix.parameters())  # the mix still learns


@pytest.mark.slow
@pytest.mark.parametrize("override, words", [
    ("embeddings.char_vectors={tmp}/absent.vec", "vector file not found"),
    ("embeddings.char_vectors={tmp}/bad.vec", "bad.vec:2: embeddings.char_vectors: the value 'x' is not a finite number"),
    ("embeddings.lm.path={tmp}/absent-lm", "language-model directory not found"),
    ("embeddings.lm.path={tmp}", "config.json not found"),
])
def test_a_broken_pretrained_input_is_one_line_and_exit_2(tmp_path, tiny_config, override, words):
    """Through the command line: a missing or malformed vector file, a directory that is no language
    model: exit 2, one line naming the file, no traceback, nothing trained."""
    import subprocess
    import sys

    from nerkit.config import config_to_yaml

    (tmp_path / "bad.vec").write_text("2 3\n张 0.1 0.2 x\n三 0.1 0.2 0.3\n", encoding="utf-8")
    config = tmp_path / "tiny.yaml"
    config.write_text(config_to_yaml(tiny_config()), encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "nerkit", "train", "--config", str(config), "--out",
                             str(tmp_path / "out"), "--set", override.format(tmp=tmp_path), "--set", "embeddings.char_dim=null"],
                            capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("nerkit: error: ") and words in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and str(tmp_path) in result.stderr
    assert not (tmp_path / "out" / "model.safetensors").exists()


@needs_transformers
def test_layer_decay_gives_each_depth_of_the_lm_its_rate(tiny_config, lm_dir):
    """`embeddings.lm.layer_decay`: the top layer at the LM's rate, each layer below at decay times
    the one above, the embeddings lowest; every LM parameter in exactly one group; 1 keeps one group."""
    from nerkit.training.schedule import make_optimizer

    config = tiny_config(f"embeddings.lm.path={lm_dir}", "embeddings.lm.finetune=true", "embeddings.lm.lr=0.0008",
                         "embeddings.lm.layer_decay=0.5")
    pipe = build_pipeline(config, read_splits(config))
    groups = make_optimizer(config, pipe.model).param_groups
    assert [g["lr"] for g in groups] == [config.train.lr, 0.0002, 0.0004, 0.0008]  # rest, embeddings, layer 0, layer 1
    names = {id(p): n for n, p in pipe.model.lm_sources()[0].lm.named_parameters()}
    assert all(names[id(p)].startswith("embeddings.") for p in groups[1]["params"])
    assert all(".layer.0." in names[id(p)] for p in groups[2]["params"])
    assert all(".layer.1." in names[id(p)] for p in groups[3]["params"])
    lm_ids = [id(p) for g in groups[1:] for p in g["params"]]
    assert sorted(lm_ids) == sorted(id(p) for p in pipe.model.lm_parameters()[0])  # each once, none missing
    assert not set(lm_ids) & {id(p) for p in groups[0]["params"]}
    one = tiny_config(f"embeddings.lm.path={lm_dir}", "embeddings.lm.finetune=true", "embeddings.lm.lr=0.0008")
    assert [g["lr"] for g in make_optimizer(one, build_pipeline(one, read_splits(one)).model).param_groups] == \
        [one.train.lr, 0.0008]


@pytest.mark.parametrize("value", ["0", "1.5", "-0.2"])
def test_layer_decay_outside_its_range_is_a_config_error(tiny_config, value):
    from nerkit.errors import ConfigError

    with pytest.raises(ConfigError, match="layer_decay"):
        tiny_config("embeddings.lm.path=lm/x", f"embeddings.lm.layer_decay={value}")
