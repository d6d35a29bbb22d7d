"""Tests for nerkit.model.tagger and nerkit.inference.pipeline: gradients reach every parameter, decoding is always
valid, batched predictions equal one-at-a-time ones, save -> load is exact and refuses unsafe or
inconsistent model directories, and predicted offsets index the original text (long lines too)."""

from __future__ import annotations

import ast
import dataclasses
import json
import pickle
import random
import shutil
from pathlib import Path

import pytest
import torch
from helpers import FIXTURES, build_pipeline
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from scheme_reference import is_valid_path

import nerkit.training.loop as train_module
from nerkit.config import ENCODER_OPTIONS
from nerkit.data.corpus import read_corpus
from nerkit.data.tags import Span
from nerkit.errors import ModelDirError, UserError
from nerkit.features.batch import collate, collate_padded
from nerkit.inference.model_dir import MODEL_FILES
from nerkit.inference.pipeline import Pipeline
from nerkit.model.encoders import ENCODERS
from nerkit.shapes import padded_size

PACKAGE = Path(__file__).resolve().parent.parent / "nerkit"
LATTICE_FREE = sorted(name for name, cls in ENCODERS.items() if not getattr(cls, "uses_lattice", False))
# Small sizes for whichever of these fields an encoder's Config has.
TINY_ENCODER = {"hidden_size": 8, "n_heads": 2, "head_dim": 4, "num_layers": 1, "dropout": 0.0, "attn_dropout": 0.0}


def encoder_overrides(name: str) -> list[str]:
    known = {f.name for f in dataclasses.fields(ENCODER_OPTIONS[name])}
    return [f"encoder.name={name}"] + [f"encoder.{k}={v}" for k, v in TINY_ENCODER.items() if k in known]


def scramble(pipe: Pipeline, seed: int = 0, entity_bias: float = 0.0) -> Pipeline:
    """Make an untrained model's decisions vary strongly with the input (and, with `entity_bias`,
    favour entity tags), so that the checks below see many different tag paths."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        pipe.model.head.emission.weight.mul_(20.0)
        pipe.model.head.emission.bias.copy_(torch.randn(len(pipe.tags), generator=generator))
        for i, tag in enumerate(pipe.tags):
            if tag != "O":
                pipe.model.head.emission.bias[i] += entity_bias
        for p in pipe.model.head.crf.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 3.0)
    pipe.model.eval()
    return pipe


def train_steps(pipe: Pipeline, steps: int = 6) -> Pipeline:
    examples = [pipe.featurizer.training_example(s) for s in read_corpus(FIXTURES / "tiny_train.bio").sentences]
    optimizer = torch.optim.Adam(pipe.model.parameters(), lr=0.05)
    pipe.model.train()
    for i in range(steps):
        train_module.train_step(pipe.model, collate(examples[8 * i: 8 * i + 8]), optimizer)
    pipe.model.eval()
    return pipe


def random_texts(n: int, seed: int, max_len: int = 30) -> list[str]:
    rnd = random.Random(seed)
    pool = list("张伟李娜在北京上海工作清华大学新华社的记者报道了。，abc12😀") + ["丙", "ü"]
    return ["".join(rnd.choice(pool) for _ in range(rnd.randint(1, max_len))) for _ in range(n)]


# --------------------------------------------------------------------------------------- the model


@pytest.mark.slow
@pytest.mark.parametrize("encoder", ["bilstm", "flat"])
def test_embedding_init_scales_random_vectors(tiny_config, encoder):
    """`embeddings.init`: `normal` is N(0, 1), `scaled` is U(+-sqrt(3/dim)) (std 1/sqrt(dim)); both
    keep the padding row zero, for characters, bigrams and (FLAT) lexicon words."""
    overrides = encoder_overrides(encoder) + ["embeddings.char_dim=48", "embeddings.bichar_dim=48",
                                              "embeddings.word_dim=48"]
    for init, std in (("normal", 1.0), ("scaled", 48 ** -0.5)):
        model = build_pipeline(tiny_config(*overrides, f"embeddings.init={init}")).model
        tables = [model.embedder.chars, model.embedder.bichars] + ([model.words] if encoder == "flat" else [])
        for table in tables:
            weight = table.weight.detach()
            assert torch.equal(weight[0], torch.zeros(48))
            assert abs(weight[1:].std().item() - std) < 0.15 * std, (init, weight[1:].std().item())
            if init == "scaled":
                assert weight.abs().max().item() <= (3 / 48) ** 0.5


@pytest.mark.parametrize("encoder", LATTICE_FREE)
@pytest.mark.parametrize("constrain", [False, True])
def test_every_parameter_gets_a_gradient(tiny_config, encoder, constrain):
    pipe = build_pipeline(tiny_config(*encoder_overrides(encoder), f"crf.constrain_training={constrain}"))
    examples = [pipe.featurizer.training_example(s) for s in read_corpus(FIXTURES / "tiny_train.bio").sentences[:12]]
    pipe.model.train()
    pipe.model.loss(collate(examples)).backward()
    missing = [name for name, p in pipe.model.named_parameters()
               if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)]
    assert not missing, f"no gradient for {missing}"


@pytest.mark.parametrize("scheme", ["bio", "bioes", "bmes"])
def test_decode_never_yields_an_invalid_tag_sequence(tiny_config, scheme):
    pipe = build_pipeline(tiny_config(), scheme)
    assert any(t.startswith({"bio": "I-", "bioes": "S-", "bmes": "M-"}[scheme]) for t in pipe.tags)
    paths = []
    for seed in range(4):
        scramble(pipe, seed, entity_bias=2.0)
        texts = random_texts(16, seed)
        batch = collate([pipe.featurizer.example(list(t)) for t in texts])
        for text, ids in zip(texts, pipe.model.paths(batch)):
            path = [pipe.tags[i] for i in ids]
            assert len(path) == len(text)
            assert is_valid_path(pipe.tags, path), path
            paths.append(path)
    assert sum(t != "O" for p in paths for t in p) > 100  # the checks saw many entity tags


# -------------------------------------------------------------------- batched == one at a time


def rows_as_alone(pipe, batch, examples) -> list:
    """Assert each row of `batch` gets the emissions its example gets alone; the batch's decoded paths."""
    with torch.no_grad():
        emissions = pipe.model.emissions(batch)  # (B, T, K)
        for row, example in enumerate(examples):
            alone = pipe.model.emissions(collate([example]))[0]  # (T_row, K)
            torch.testing.assert_close(emissions[row, :len(example)], alone, atol=1e-5, rtol=1e-5)
    return pipe.model.decode(batch)


@pytest.mark.parametrize("encoder", LATTICE_FREE)
def test_batched_predictions_equal_one_at_a_time(tiny_config, encoder):
    pipe = scramble(build_pipeline(tiny_config(*encoder_overrides(encoder))), seed=1, entity_bias=1.0)
    texts = random_texts(12, seed=2, max_len=40) + ["张", "北京"]
    examples = [pipe.featurizer.example(list(t)) for t in texts]
    batch = collate(examples)
    decoded = rows_as_alone(pipe, batch, examples)
    assert decoded == [pipe.model.decode(collate([e]))[0] for e in examples]
    together = pipe.predict(texts, batch_size=5)
    assert together == [pipe.predict([t])[0] for t in texts]
    assert sum(len(e) for e in together) > 0


PADDED_SIZES = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024}


def test_padded_sizes_are_few_and_less_than_half_again_as_large():
    assert {padded_size(n) for n in range(1, 1025)} == PADDED_SIZES
    for n in range(1, 5000):
        assert n <= padded_size(n) <= 1.5 * n and padded_size(padded_size(n)) == padded_size(n)


def test_budgeted_batches_hold_each_example_once_within_both_limits():
    """Batches in length order, at most `max_rows` rows and `max_chars` once padded to their longest,
    except an example longer than `max_chars` alone; every index exactly once."""
    from nerkit.features.padding import budgeted_batches

    rng = random.Random(3)
    lengths = [rng.randint(1, 299) for _ in range(500)] + [1500, 1]
    for max_rows, max_chars in ((64, 1024), (4, 1024), (64, 100), (1, 10)):
        batches = budgeted_batches(lengths, max_rows, max_chars)
        assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
        in_order = [lengths[i] for batch in batches for i in batch]
        assert in_order == sorted(lengths)
        for batch in batches:
            longest = max(lengths[i] for i in batch)
            assert len(batch) <= max_rows and (len(batch) * longest <= max_chars or len(batch) == 1)
        assert len(batches) < len(lengths) or max_rows == 1  # short examples do go together


@pytest.mark.parametrize("encoder", LATTICE_FREE + ["flat"])
def test_padded_batches_predict_as_one_at_a_time(tiny_config, encoder, tmp_path):
    """A prediction batch padded to a bounded shape (rows repeating the last example, positions
    and lattice words past the longest): every real row's scores and path are its own alone."""
    overrides = encoder_overrides(encoder)
    if encoder == "flat":
        words = tmp_path / "words.txt"
        words.write_text("北京\n张伟\n李娜\n清华大学\n大学\n记者\n", encoding="utf-8")
        overrides += [f"lexicon.source={words}", "embeddings.word_dim=4"]
    pipe = scramble(build_pipeline(tiny_config(*overrides)), seed=1, entity_bias=1.0)
    texts = random_texts(12, seed=4, max_len=37) + ["张", "北京", "张伟在清华大学读书"]
    examples = [pipe.featurizer.example(list(t)) for t in texts]
    batch = collate_padded(examples, 64, 250)
    longest = max(len(e) for e in examples)
    assert batch.mask.shape == (16, padded_size(longest)) and longest < padded_size(longest)
    assert batch.mask.sum(1).tolist() == [len(e) for e in examples] + [len(examples[-1])]
    if encoder == "flat":
        assert batch.word_mask.shape[1] == padded_size(max(len(e.word_ids) for e in examples))
    decoded = rows_as_alone(pipe, batch, examples)
    assert decoded[:len(examples)] == [pipe.model.decode(collate([e]))[0] for e in examples]
    assert decoded[len(examples)] == decoded[len(examples) - 1]


def test_a_scored_corpus_is_read_in_trimmed_batches_and_predicted_as_by_predict(tiny_config):
    """Evaluation reads a corpus once, so its batches keep no bounded shapes: each is as wide as its
    longest sentence (the BiLSTM then runs unpacked, 1.14x faster), with no repeated rows, and
    the spans are prediction's."""
    pipe = scramble(build_pipeline(tiny_config()), seed=2, entity_bias=1.0)
    sentences = read_corpus(FIXTURES / "tiny_dev.bio").sentences
    shapes, decode = [], pipe.model.decode

    def counted_decode(batch, **decoding):
        shapes.append((tuple(batch.mask.shape), int(batch.mask.sum(1).max())))
        return decode(batch, **decoding)

    pipe.model.decode = counted_decode
    evaluation = pipe.predict_and_score(sentences, batch_size=8)
    assert shapes and all(width == longest for (_, width), longest in shapes)
    assert sum(rows for (rows, _), _ in shapes) == len(sentences)
    shapes.clear()
    assert pipe.predict_and_score(sentences, batch_size=8, trim=False).predicted == evaluation.predicted
    assert any(width > longest for (_, width), longest in shapes)  # the benchmark times prediction's shapes
    pipe.model.decode = decode
    assert evaluation.predicted == pipe.predict_tokens([s.tokens for s in sentences], batch_size=8)


@pytest.mark.slow
def test_prediction_batches_come_in_a_few_shapes(tiny_config):
    """Issue 33: memory grew with the input, as a native cache (oneDNN's, under bf16) kept an entry
    for every new batch shape. Texts of every length up to 300 characters, in calls of 1 to 70 texts:
    the model sees rows and lengths from a few sizes only (never longer than the window), and
    predicts as one text at a time."""
    pipe = scramble(build_pipeline(tiny_config()), seed=2, entity_bias=1.0)
    shapes, decode = set(), pipe.model.decode

    def counted_decode(batch, **decoding):
        shapes.add(tuple(batch.mask.shape))
        return decode(batch, **decoding)

    pipe.model.decode = counted_decode
    rnd = random.Random(3)
    texts = ["".join(rnd.choice("张伟李娜在北京上海工作清华大学新华社的记者，。") for _ in range(n)) for n in range(1, 301)]
    rnd.shuffle(texts)
    found, start = [], 0
    while start < len(texts):
        size = rnd.randint(1, 70)
        found += pipe.predict(texts[start:start + size], batch_size=64, window=250)
        start += size
    assert {rows for rows, _ in shapes} <= {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64}
    assert {length for _, length in shapes} <= {n for n in PADDED_SIZES if n < 250} | {250}
    assert len(shapes) < 80 and len(found) == len(texts)
    pipe.model.decode = decode
    assert found[:40] == [pipe.predict(t, window=250)[0] for t in texts[:40]]


# ------------------------------------------------------------------------------ save and load


def state_dicts_equal(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def test_train_save_load_gives_identical_tensors_and_predictions(tmp_path, tiny_config):
    pipe = train_steps(build_pipeline(tiny_config("data.normalize=true")))
    pipe.save(tmp_path / "model", {"note": "test"})
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == sorted(MODEL_FILES + ("metrics.json",))
    loaded = Pipeline.load(tmp_path / "model")
    state_dicts_equal(pipe.model, loaded.model)
    assert not loaded.model.training
    assert loaded.featurizer.to_json() == pipe.featurizer.to_json()
    assert loaded.tags == pipe.tags and loaded.scheme == pipe.scheme
    assert dataclasses.asdict(loaded.config.data) == dataclasses.asdict(pipe.config.data)
    texts = random_texts(20, seed=3) + ["ＡＢＣ张伟在北京", "未登录的字符全在这里"]
    assert loaded.predict(texts) == pipe.predict(texts)
    # Saving the loaded model again reproduces the weights file byte for byte.
    loaded.save(tmp_path / "again")
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == (tmp_path / "model" / "model.safetensors").read_bytes()


def test_flat_with_a_lexicon_that_keeps_no_word_trains_saves_and_loads(tmp_path, tiny_config):
    """FLAT without word nodes (its lexicon filtered to nothing, as `lexicon.min_len=99` does to
    jieba's): a character-only relative-position model, the lexicon's own ablation. An empty
    lexicon once counted as no lexicon at all and left a word table of zero rows."""
    words = tmp_path / "words.txt"
    words.write_text("北京\n张伟\n", encoding="utf-8")
    config = tiny_config(*encoder_overrides("flat"), f"lexicon.source={words}", "lexicon.min_len=9",
                         "embeddings.word_dim=4")
    pipe = train_steps(build_pipeline(config))
    assert len(pipe.featurizer.lexicon) == 0 and len(pipe.featurizer.words) == 2  # <pad>, <unk>
    assert pipe.featurizer.units(list("张伟在北京")).lattice.words == []
    pipe.save(tmp_path / "model")
    loaded = Pipeline.load(tmp_path / "model")
    state_dicts_equal(pipe.model, loaded.model)
    texts = random_texts(10, seed=5) + ["张伟在北京"]
    assert loaded.predict(texts) == pipe.predict(texts)


def test_full_width_input_reads_as_half_width_and_saved_models_keep_their_setting(tmp_path, tiny_config,
                                                                                 tiny_model_dir):
    """data.normalize is the default: "ＡＢ" and "２０２" reach the model as "AB" and "202", while
    offsets and entity texts stay the input's. A model trained without it, as every model before
    this default was, keeps reading raw forms: its config.yaml says normalize: false (and one
    that lacks the key, edited by hand, reads as such models were trained)."""
    new = Pipeline.load(tiny_model_dir)
    assert new.config.data.normalize is True
    assert new.featurizer.units(list("张伟于２０２ＡＢ")).chars == list("张伟于202AB")
    full, half = new.predict(["李娜在ＡＢ公司，张伟于２０２"])[0], new.predict(["李娜在AB公司，张伟于202"])[0]
    assert [(e["start"], e["end"], e["type"]) for e in full] == [(e["start"], e["end"], e["type"]) for e in half]
    assert all(e["text"] == "李娜在ＡＢ公司，张伟于２０２"[e["start"]:e["end"]] for e in full)

    old = build_pipeline(tiny_config("data.normalize=false"))
    old.save(tmp_path / "old")
    assert "normalize: false" in (tmp_path / "old" / "config.yaml").read_text(encoding="utf-8")
    loaded = Pipeline.load(tmp_path / "old")
    assert loaded.config.data.normalize is False
    assert loaded.featurizer.units(list("ＡＢ")).chars == ["Ａ", "Ｂ"]
    config_file = tmp_path / "old" / "config.yaml"
    config_file.write_text(config_file.read_text(encoding="utf-8").replace("  normalize: false\n", ""), encoding="utf-8")
    assert Pipeline.load(tmp_path / "old").config.data.normalize is False


def test_trained_model_directory_reproduces_its_recorded_dev_score(tiny_model_dir):
    # The figure training wrote (best epoch, in memory) equals what the saved model scores after loading.
    recorded = json.loads((tiny_model_dir / "metrics.json").read_text())["dev"]
    metrics = Pipeline.load(tiny_model_dir).evaluate(FIXTURES / "tiny_dev.bio")
    assert metrics["f1"] == pytest.approx(recorded["f1"], abs=1e-12)
    assert metrics["counts"] == recorded["counts"]


def test_loading_uses_no_pickle(tiny_model_dir, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pickle used while loading a model")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    assert Pipeline.load(tiny_model_dir).predict(["张伟在北京"])


@pytest.mark.slow
def test_package_source_never_unpickles():
    """No pickle module is used, and torch.load appears only as the issue allows it for a third-party
    pytorch_model.bin: with weights_only=True (tensors and plain containers, no code)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                # the exception class alone (to name torch.load's refusal) runs nothing
                names = [] if [a.name for a in node.names] == ["UnpicklingError"] else [node.module or ""]
            elif isinstance(node, ast.Attribute) and node.attr == "load" and getattr(node.value, "id", "") == "torch":
                names = ["torch.load"]
            else:
                continue
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in ("pickle", "dill", "joblib", "cloudpickle")
                          or n == "torch.load"]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load" \
                    and getattr(node.func.value, "id", "") == "torch":
                safe = any(k.arg == "weights_only" and getattr(k.value, "value", None) is True for k in node.keywords)
                offenders += [] if safe else [f"{path.name}:{node.lineno}: torch.load without weights_only=True"]
                offenders.remove(f"{path.name}: torch.load")  # judged by the call itself
    assert not offenders


@pytest.fixture
def model_copy(tiny_model_dir, tmp_path) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(tiny_model_dir, copy)
    return copy


def test_load_refuses_a_missing_directory_or_a_file(tmp_path, model_copy):
    with pytest.raises(ModelDirError, match="not found"):
        Pipeline.load(tmp_path / "absent")
    with pytest.raises(ModelDirError, match="not a directory"):
        Pipeline.load(model_copy / "config.yaml")


@pytest.mark.parametrize("name", MODEL_FILES)
def test_load_refuses_a_directory_missing_a_file(model_copy, name):
    (model_copy / name).unlink()
    with pytest.raises(ModelDirError, match=f"{name} is missing"):
        Pipeline.load(model_copy)


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_load_refuses_another_format_version(model_copy, version):
    meta = json.loads((model_copy / "nerkit.json").read_text())
    meta["format_version"] = version
    (model_copy / "nerkit.json").write_text(json.dumps(meta))
    with pytest.raises(ModelDirError, match="format version") as info:
        Pipeline.load(model_copy)
    assert info.value.where == str(model_copy / "nerkit.json")


@pytest.mark.parametrize("name", ["nerkit.json", "vocab.json"])
def test_load_refuses_broken_json(model_copy, name):
    (model_copy / name).write_text("{not json")
    with pytest.raises(ModelDirError, match="not valid JSON"):
        Pipeline.load(model_copy)


def test_load_refuses_a_vocabulary_of_the_same_sizes_from_another_model(model_copy):
    """Two tags swapped in vocab.json: the weights' shapes still fit, so only nerkit.json's
    vocab_sha256 tells that the tag ids now name other tags."""
    path = model_copy / "vocab.json"
    vocab = json.loads(path.read_text(encoding="utf-8"))
    vocab["tags"][1], vocab["tags"][2] = vocab["tags"][2], vocab["tags"][1]
    path.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(ModelDirError, match="vocab.json is not the vocabulary this model was written with") as info:
        Pipeline.load(model_copy)
    assert info.value.where == str(path) and "one training run" in info.value.fix


def test_load_refuses_a_broken_config_yaml_naming_its_line_and_the_fix(model_copy):
    path = model_copy / "config.yaml"
    path.write_text(path.read_text(encoding="utf-8") + "train: [1, 2\n", encoding="utf-8")
    with pytest.raises(ModelDirError, match="config.yaml is not valid YAML") as info:
        Pipeline.load(model_copy)
    assert info.value.where.startswith(f"{path}:") and info.value.where.rsplit(":", 1)[1].isdigit()
    assert "copy the whole model directory again" in info.value.fix


class MarkerPayload:
    """Unpickling this creates `path` (builtins.open in "w" mode): proof that the pickle ran."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


@pytest.mark.parametrize("name", ["evil.pkl", "evil.pt", "pytorch_model.bin", "EVIL.PICKLE"])
def test_load_refuses_a_planted_pickle_without_running_it(model_copy, tmp_path, name):
    # The payload works: unpickling a copy creates its marker ...
    probe = tmp_path / "probe-marker"
    pickle.loads(pickle.dumps(MarkerPayload(probe))).close()
    assert probe.exists()
    # ... but planted in a model directory it is refused and never executed.
    marker = tmp_path / "marker"
    (model_copy / name).write_bytes(pickle.dumps(MarkerPayload(marker)))
    with pytest.raises(ModelDirError, match="pickle"):
        Pipeline.load(model_copy)
    assert not marker.exists()


def test_load_refuses_weights_whose_shapes_do_not_match_the_config(tmp_path, tiny_config):
    small = build_pipeline(tiny_config("encoder.hidden_size=16"))
    large = build_pipeline(tiny_config("encoder.hidden_size=32"))
    assert small.featurizer.chars.tokens == large.featurizer.chars.tokens  # same vocabulary: only the widths differ
    small.save(tmp_path / "small")
    large.save(tmp_path / "large")
    shutil.copy(tmp_path / "large" / "model.safetensors", tmp_path / "small" / "model.safetensors")
    with pytest.raises(ModelDirError, match=r"encoder\.lstm\.weight.*\(128, 24\) != \(64, 24\)") as info:
        Pipeline.load(tmp_path / "small")
    assert info.value.where == str(tmp_path / "small" / "model.safetensors")


@pytest.mark.parametrize("change", ["drop", "add"])
def test_load_refuses_weights_with_missing_or_extra_tensors(model_copy, change):
    path = model_copy / "model.safetensors"
    state = load_file(str(path))
    if change == "drop":
        del state["emission.bias"]
    else:
        state["extra.weight"] = torch.zeros(3)
    save_file(state, str(path))
    with pytest.raises(ModelDirError, match="emission.bias" if change == "drop" else "extra.weight"):
        Pipeline.load(model_copy)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "huge_header", "json_header_only"])
def test_load_refuses_a_corrupted_safetensors_file(model_copy, damage):
    path = model_copy / "model.safetensors"
    data = path.read_bytes()
    damaged = {
        "garbage": bytes(random.Random(0).randrange(256) for _ in range(len(data))),
        "truncated": data[: len(data) // 2],
        "empty": b"",
        "huge_header": (1 << 60).to_bytes(8, "little") + data[8:],
        "json_header_only": data[: 8 + int.from_bytes(data[:8], "little")],
    }[damage]
    path.write_bytes(damaged)
    with pytest.raises(ModelDirError, match="model.safetensors"):
        Pipeline.load(model_copy)


# ------------------------------------------------------------------------------ predicted offsets

# Characters that break naive offset arithmetic: astral emoji (two UTF-16 units), joiners and skin-tone
# modifiers, combining marks, full-width forms (changed by normalisation), controls, line and paragraph
# separators, a BOM, lone surrogates (what surrogateescape makes of non-UTF-8 bytes) and anything else.
ODD_CHARS = st.one_of(
    st.sampled_from(list("张伟李娜在北京上海清华大学新华社工作。，！？；：")),
    st.sampled_from(list("abcXYZ 0189.-_")),
    st.sampled_from(["😀", "👍", "🏽", "\u200d", "🇨", "🇳", "𠀀"]),
    st.sampled_from(list("ＡＢＣｘｙｚ１２３（）　，。")),
    st.sampled_from(["\x00", "\x07", "\t", "\x1b", "\r", "\n", "\x7f", "\x85", "\u2028", "\u2029", "\ufeff"]),
    st.sampled_from(["\u0301", "\u0308", "\u20dd", "\u0f7a"]),
    st.sampled_from(["\udc80", "\udcff", "\ud800"]),
    st.characters(),
)


@pytest.fixture(scope="module", params=[False, True], ids=["raw", "normalized"])
def eager_pipeline(request, tiny_config):
    """An untrained model with max_len 8 that tags a good share of characters as entities."""
    config = tiny_config("data.max_len=8", f"data.normalize={request.param}")
    return scramble(build_pipeline(config), seed=5, entity_bias=2.5)


def check_entities(text: str, entities: list[dict], types) -> None:
    end = 0
    for e in entities:
        assert 0 <= e["start"] < e["end"] <= len(text)
        assert text[e["start"]:e["end"]] == e["text"]
        assert not e["text"][0].isspace() and not e["text"][-1].isspace(), e  # so never whitespace alone
        assert e["start"] >= end  # sorted, no overlaps
        assert e["type"] in types
        end = e["end"]


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(ODD_CHARS, max_size=40), min_size=1, max_size=5))
def test_predicted_offsets_index_the_original_text(eager_pipeline, texts):
    results = eager_pipeline.predict(texts, batch_size=3)
    assert len(results) == len(texts)
    types = {t[2:] for t in eager_pipeline.tags if t != "O"}
    for text, entities in zip(texts, results):
        check_entities(text, entities, types)
        if not text:
            assert entities == []
    assert results == [eager_pipeline.predict([t])[0] for t in texts]


def test_the_offset_checks_see_entities(eager_pipeline):
    text = "张伟😀在ＡＢＣ北京\u0301工作\x00。" * 6
    entities = eager_pipeline.predict([text])[0]
    assert len(entities) >= 10
    check_entities(text, entities, {t[2:] for t in eager_pipeline.tags if t != "O"})


SPACES = [" ", "  ", "\t", "\u3000", "\xa0", "\n", "\u2028", "\u2003"]


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.one_of(st.sampled_from(list("张三李娜在北京大学读书，。ＡＢ")), st.sampled_from(SPACES)),
                         max_size=50).map("".join), min_size=1, max_size=4))
def test_whitespace_never_starts_ends_or_makes_up_an_entity(eager_pipeline, texts):
    """The decoding rule: whatever the model tags, an entity starts and ends with a character that is
    not whitespace (so none is whitespace alone), and its offsets still index the text."""
    results = eager_pipeline.predict(texts, batch_size=2)
    for text, entities in zip(texts, results):
        check_entities(text, entities, {t[2:] for t in eager_pipeline.tags if t != "O"})
    assert results == [eager_pipeline.predict([t])[0] for t in texts]


def test_the_whitespace_checks_see_entities_beside_spaces(eager_pipeline):
    """The model these tests use tags spaces as entities: without the rule, its entities would
    start, end or consist of whitespace (the reported `PER "张三 "` and `ORG " "`)."""
    text = "张三 在 北京 大学 读书\u3000李娜\t在　上海 "
    entities = eager_pipeline.predict([text])[0]
    check_entities(text, entities, {t[2:] for t in eager_pipeline.tags if t != "O"})
    beside = [e for e in entities if (e["start"] > 0 and text[e["start"] - 1].isspace())
              or (e["end"] < len(text) and text[e["end"]].isspace())]
    assert len(beside) >= 3
    # What the model itself says of the spaces (the whole text as one window), before the rule.
    ids = eager_pipeline.model.paths(collate([eager_pipeline.featurizer.example(list(text))]))[0]
    assert sum(eager_pipeline.tags[i] != "O" for c, i in zip(text, ids) if c.isspace()) >= 2


def test_without_whitespace_trims_entities_and_drops_blank_ones():
    from nerkit.inference.pipeline import without_whitespace

    tokens = list(" 张三 \u3000 北京\t")
    spans = [Span(0, 4, "PER"), Span(4, 6, "ORG"), Span(6, 9, "LOC")]
    assert without_whitespace(tokens, spans) == [Span(1, 3, "PER"), Span(6, 8, "LOC")]
    assert without_whitespace(list("北 京"), [Span(0, 3, "LOC")]) == [Span(0, 3, "LOC")]  # inside, a space stays


# ------------------------------------------------------------------------------ long texts


def stub_tagger(pipe: Pipeline, tag_window) -> Pipeline:
    """`pipe` with its featuriser and model replaced by a stub that sees each window's text and tags
    it as `tag_window(text)` says (spans into the window): a known tagger, so that the stitching of
    windows can be checked exactly."""
    from nerkit.data.tags import spans_to_tags
    from nerkit.features.featurizer import Example
    from nerkit.model.decoded import path_entities

    def example(tokens, tags=None):
        return Example([ord(c) for c in tokens], [0] * len(tokens))  # the text itself, as code points

    def decode(batch, **decoding):
        rows = []
        for ids, mask in zip(batch.char_ids.tolist(), batch.mask.tolist()):
            text = "".join(chr(i) for i, m in zip(ids, mask) if m)
            tags = spans_to_tags(len(text), tag_window(text), pipe.scheme)
            rows.append(path_entities([pipe.tags.index(t) for t in tags], pipe.tags, pipe.types))
        return rows

    pipe.featurizer.example = example
    pipe.model.decode = decode
    return pipe


RUN_CHARS = set("甲乙丙丁戊")


def runs(text: str) -> list[Span]:
    """Every maximal run of RUN_CHARS in `text` as a PER entity: what the stub tagger below sees,
    including the part of a run a window's edge cuts off, as a real model tags a cut name."""
    spans, start = [], None
    for i, c in enumerate(text + "的"):
        if c in RUN_CHARS and start is None:
            start = i
        elif c not in RUN_CHARS and start is not None:
            spans.append(Span(start, i, "PER"))
            start = None
    return spans


def entities_of(pipe: Pipeline, text: str) -> list[Span]:
    return pipe.predict_tokens([list(text)])[0]


@pytest.mark.parametrize("scheme", ["bio", "bioes", "bmes"])
def test_no_entity_is_cut_where_a_window_ends(tiny_config, scheme):
    """max_len 10: entities of 2-5 characters at every offset of texts of up to 60 characters, so that
    every window edge falls inside some entity: each comes back whole, as in the text."""
    pipe = stub_tagger(build_pipeline(tiny_config("data.max_len=10"), scheme), runs)
    rnd = random.Random(3)
    checked = 0
    for length in (11, 17, 23, 40, 60):
        for size in (2, 3, 4, 5):
            for offset in range(length - size + 1):
                text = "的" * offset + "甲乙丙丁戊"[:size] + "的" * (length - offset - size)
                assert entities_of(pipe, text) == runs(text), (text, offset)
                checked += 1
        for _ in range(20):  # many entities, two or more characters apart
            text = "".join(rnd.choice(["的", "的的", "甲乙", "甲乙丙", "甲乙丙丁"]) for _ in range(length))[:length]
            text = text.replace("乙甲", "乙的甲").replace("丙甲", "丙的甲").replace("丁甲", "丁的甲")
            assert entities_of(pipe, text) == runs(text), text
    assert checked > 500
    # Batched over many texts as one at a time.
    texts = ["的" * k + "甲乙丙" + "的" * (30 - k) for k in range(30)]
    assert pipe.predict_tokens([list(t) for t in texts], batch_size=7) == [entities_of(pipe, t) for t in texts]


@pytest.mark.parametrize("scheme", ["bio", "bioes"])
def test_a_run_of_one_character_is_not_cut_into_window_sized_entities(tiny_config, scheme):
    """The defect: "张" * 5000 came back as 25 entities of exactly max_len (200) characters. A tagger
    that tags all it sees as one entity now gives one entity over the whole text."""
    pipe = stub_tagger(build_pipeline(tiny_config("data.max_len=200"), scheme), lambda t: [Span(0, len(t), "PER")])
    assert entities_of(pipe, "张" * 5000) == [Span(0, 5000, "PER")]
    assert entities_of(pipe, "张" * 200) == [Span(0, 200, "PER")]


def test_what_a_window_sees_at_its_edges_is_decided_by_its_neighbour(tiny_config):
    """A tagger that tags the first and last 3 characters of every window (max_len 20): only the
    text's own ends keep them, since every other character is decided by the window where it is
    more central."""
    edges = lambda t: [Span(0, 3, "PER"), Span(len(t) - 3, len(t), "LOC")]  # noqa: E731
    pipe = stub_tagger(build_pipeline(tiny_config("data.max_len=20")), edges)
    for length in range(21, 120):
        assert entities_of(pipe, "的" * length) == [Span(0, 3, "PER"), Span(length - 3, length, "LOC")], length


def test_windows_overlap_by_half_a_window_and_cover_the_text():
    from nerkit.inference.windows import text_windows

    assert text_windows(0, 10) == [] and text_windows(7, 10) == [(0, 7)] and text_windows(300, 0) == [(0, 300)]
    assert text_windows(5000, 200) == [(a, a + 200) for a in range(0, 4801, 100)]
    for max_len in (1, 2, 3, 8, 10, 250):
        for length in range(max_len + 1, max_len + 120):
            found = text_windows(length, max_len)
            assert found[0][0] == 0 and found[-1][1] == length
            assert all(b - a == max_len for a, b in found)
            for (a0, b0), (a1, b1) in zip(found, found[1:]):
                assert a0 < a1 <= a0 + max_len - max_len // 2  # at least half a window of overlap


@st.composite
def windowed_tags(draw, scheme: str):
    """Tag sequences of windows over one text as `windows` places them, each valid on its own (random
    entities of two types), and the text's length."""
    from nerkit.data.tags import spans_to_tags
    from nerkit.inference.windows import text_windows

    max_len = draw(st.integers(1, 12))
    length = draw(st.integers(1, 60))
    found = []
    for a, b in text_windows(length, max_len):
        spans, i = [], 0
        while i < b - a:
            size = draw(st.integers(0, 6))
            if size and i + size <= b - a and draw(st.booleans()):
                spans.append(Span(i, i + size, draw(st.sampled_from(["PER", "LOC"]))))
                i += size
            else:
                i += 1
        found.append((a, spans_to_tags(b - a, spans, scheme)))
    return length, found


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["bio", "bioes", "bmes"])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_stitched_windows_make_one_valid_tag_sequence(scheme, data):
    """Whatever the windows decided, even entities that disagree across every point of an overlap,
    the stitched sequence is as long as the text and valid in the scheme, as a CRF's path is."""
    from nerkit.data.tags import scheme_tags
    from nerkit.inference.windows import stitch

    length, found = data.draw(windowed_tags(scheme))
    tags = stitch(found, scheme)
    assert len(tags) == length
    assert is_valid_path(scheme_tags(["LOC", "PER"], scheme), tags), (found, tags)


def test_long_lines_of_a_real_model_index_the_text_and_batch_as_one_at_a_time(eager_pipeline):
    rnd = random.Random(7)
    lines = ["".join(rnd.choice("张伟李娜北京上海清华大学，。abc12😀ＡＢ") for _ in range(rnd.randint(9, 120)))
             for _ in range(12)]
    together = eager_pipeline.predict(lines, batch_size=5)
    assert together == [eager_pipeline.predict([line])[0] for line in lines]
    assert sum(len(e) for e in together) >= 20
    for line, entities in zip(lines, together):
        check_entities(line, entities, {t[2:] for t in eager_pipeline.tags if t != "O"})


# ------------------------------------------------------------------ the prediction window (issue 33)


def joined_dev_text() -> str:
    """The tiny dev corpus as one line of 177 characters: far longer than any training sentence."""
    return "".join(s.text for s in read_corpus(FIXTURES / "tiny_dev.bio").sentences)


def windows_used(monkeypatch) -> list[int]:
    """The windows `predict_tokens` reads texts in, from now on."""
    import nerkit.inference.predictor as predictor_module  # where predict_tokens lives, for every runtime

    used, text_windows = [], predictor_module.text_windows
    monkeypatch.setattr(predictor_module, "text_windows", lambda length, window: used.append(window) or
                        text_windows(length, window))
    return used


def test_the_default_window_is_the_longest_training_sentence(tiny_model_dir, monkeypatch):
    """A model trained on sentences of at most 17 characters (data.max_len 250) reads a long text in
    windows of 17 characters unless told otherwise: the figure is saved in nerkit.json, and the
    window changes what a long text gives."""
    longest = max(len(s) for s in read_corpus(FIXTURES / "tiny_train.bio").sentences)
    assert json.loads((tiny_model_dir / "nerkit.json").read_text())["train_max_len"] == longest == 17
    pipe = Pipeline.load(tiny_model_dir)
    assert pipe.config.data.max_len == 250 and pipe.train_max_len == 17 and pipe.window == 17
    text = joined_dev_text()
    used = windows_used(monkeypatch)
    default = pipe.predict(text)
    assert used == [17]
    assert pipe.predict(text, window=17) == default
    whole = pipe.predict(text, window=250)
    assert used == [17, 17, 250] and whole != default and whole == pipe.predict(text, window=0)
    gold = FIXTURES / "tiny_dev.bio"
    assert pipe.evaluate(gold) == pipe.evaluate(gold, window=17) and used[-2:] == [17, 17]
    narrow = pipe.evaluate(gold, window=4)
    assert used[-1] == 4 and narrow != pipe.evaluate(gold)
    for bad in (-1, 2.5, "17", True):
        with pytest.raises(UserError, match="the prediction window must be a whole number of characters"):
            pipe.predict(text, window=bad)
    with pytest.raises(UserError, match="at least 0, not -3"):
        pipe.evaluate(gold, window=-3)


def test_the_window_is_never_above_max_len_where_it_is_set(tiny_config):
    """The longest training sentence (17 characters here: the pieces given to the pipeline are not
    cut at max_len) is the window, unless data.max_len is smaller; data.max_len 0 is no limit."""
    assert build_pipeline(tiny_config("data.max_len=10")).window == 10
    assert build_pipeline(tiny_config("data.max_len=100")).window == 17
    pipe = build_pipeline(tiny_config("data.max_len=0"))
    assert pipe.train_max_len == 17 and pipe.window == 17
    pipe.train_max_len = None  # not recorded: data.max_len, as before it was
    assert pipe.window == 0


def test_a_window_past_learned_positions_is_a_user_error(tiny_config):
    """A Transformer with learned positions reads at most encoder.max_positions characters: a longer
    window (or 0, a whole text) is refused with a message, not a ValueError from inside the model."""
    pipe = build_pipeline(tiny_config(*encoder_overrides("transformer"), "encoder.attention=learned",
                                      "encoder.max_positions=20", "data.max_len=20"))
    assert pipe.window == 17 and len(pipe.predict("张伟在北京工作。" * 10, window=20)) == 1
    for window in (21, 0):
        with pytest.raises(UserError, match=f"reads at most encoder.max_positions = 20 characters at once, "
                                            f"not a window of {window}"):
            pipe.predict("张伟在北京工作。" * 10, window=window)


def test_a_model_directory_without_training_lengths_keeps_max_len_as_its_window(model_copy, monkeypatch):
    """A model directory written before nerkit.json recorded `train_max_len` loads and predicts as
    it did: in windows of data.max_len. A value that is not a length is refused."""
    meta = json.loads((model_copy / "nerkit.json").read_text())
    meta.pop("train_max_len")
    (model_copy / "nerkit.json").write_text(json.dumps(meta))
    pipe = Pipeline.load(model_copy)
    assert pipe.train_max_len is None and pipe.window == 250
    used = windows_used(monkeypatch)
    text = joined_dev_text()
    assert pipe.predict(text) == pipe.predict(text, window=250) and used == [250, 250]
    for bad in (0, -5, "17", 2.5):
        (model_copy / "nerkit.json").write_text(json.dumps({**meta, "train_max_len": bad}))
        with pytest.raises(ModelDirError, match="train_max_len is") as info:
            Pipeline.load(model_copy)
        assert info.value.where == str(model_copy / "nerkit.json")


def test_predict_keeps_empty_texts_in_place(eager_pipeline):
    results = eager_pipeline.predict(["", "张伟在北京工作", ""])
    assert results[0] == [] and results[2] == [] and len(results) == 3


def test_predict_takes_one_string_as_one_text_and_refuses_what_is_not_text(tiny_model_dir):
    """`model.predict("...")` is one text (it was read as one text per character); a non-string is a
    TypeError that says which text and what it was, not a bare one from deep inside."""
    pipe = Pipeline.load(tiny_model_dir)
    text = "张伟在北京大学读书。"
    assert pipe.predict(text) == pipe.predict([text])
    assert len(pipe.predict(text)) == 1
    with pytest.raises(TypeError, match="text 1 is NoneType"):
        pipe.predict(["张伟", None])
    with pytest.raises(TypeError, match="text 0 is bytes"):
        pipe.predict([text.encode("utf-8")])
