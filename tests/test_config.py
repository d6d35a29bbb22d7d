"""Tests for nerkit.config: YAML loading, type coercion, unknown-key suggestions, `${VAR}`
interpolation, dotted `--set` overrides, encoder sections, and the YAML round trip."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from nerkit.config import (
    ENCODER_OPTIONS,
    Config,
    DataConfig,
    LMConfig,
    TrainConfig,
    build_config,
    config_to_dict,
    config_to_yaml,
    load_config,
)
from nerkit.errors import ConfigError, UserError
from nerkit.model.encoders import ENCODERS
from nerkit.training.resume import run_differences, same_run
from nerkit.typed_yaml import choices

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def write_config(write_file):
    def write(text: str) -> Path:
        return write_file(text, "config.yaml")

    return write


def config_error(raw: dict, overrides=()) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        build_config(raw, "cfg.yaml", overrides)
    return info.value


# ---------------------------------------------------------------- loading and coercion


def test_load_from_yaml(write_config):
    path = write_config("""
data:
  train: corpus/train.bio
  max_len: 120
  normalize: true
encoder:
  name: tener
  n_heads: 4
  attention: xl
train:
  lr: 1e-3        # PyYAML reads this as a string
  batch_size: "32"
  epochs: 3.0
output_dir: runs/x
""")
    cfg = load_config(path)
    assert cfg.data.train == "corpus/train.bio"
    assert cfg.data.max_len == 120 and cfg.data.normalize is True
    assert cfg.data.dev is None  # defaults fill the rest
    assert cfg.encoder.name == "tener"
    assert isinstance(cfg.encoder.options, ENCODER_OPTIONS["tener"])
    assert cfg.encoder.options.n_heads == 4 and cfg.encoder.options.attention == "xl"
    assert cfg.train.lr == 0.001 and type(cfg.train.lr) is float
    assert cfg.train.batch_size == 32 and type(cfg.train.batch_size) is int
    assert cfg.train.epochs == 3 and type(cfg.train.epochs) is int
    assert cfg.output_dir == "runs/x"


def test_empty_file_gives_the_defaults(write_config):
    assert load_config(write_config("# nothing\n")) == build_config({})


def test_the_demo_config_loads():
    cfg = load_config(REPO / "configs" / "demo.yaml")
    assert cfg.encoder.name == "bilstm"
    assert cfg.encoder.options.hidden_size == 128


def test_new_configs_normalise_and_the_benchmark_configs_read_the_corpus_as_it_is():
    """data.normalize is true unless a config says otherwise; the benchmark configs say false, as
    their recorded runs (and the runs a `nerkit bench --resume` continues) were trained."""
    assert build_config({}).data.normalize is True
    assert load_config(REPO / "configs" / "demo.yaml").data.normalize is True
    benchmark = sorted((REPO / "configs").glob("*_*.yaml"))
    # {msra, peopledaily} x {bilstm, transformer, tener, flat, lm_crf, lm_bilstm, lm_flat, lac_bilstm, stacked_crf},
    # msra_lac_flat, cmeee x {bilstm, lm} x {crf, span}, cmeee_flat x {jieba, mined}, and dsner_news x {bilstm, lm_crf}
    assert len(benchmark) == 27
    for path in benchmark:
        assert load_config(path).data.normalize is False, path


@pytest.mark.parametrize("text, value", [
    ("true", True), ("'yes'", True), ("'on'", True), ("'1'", True), ("1", True),
    ("false", False), ("'No'", False), ("'off'", False), ("0", False),
])
def test_bool_strings(write_config, text, value):
    assert load_config(write_config(f"data:\n  normalize: {text}\n")).data.normalize is value


@pytest.mark.parametrize("section, key, value, words", [
    ("train", "epochs", "abc", "'abc' is not a valid int"),
    ("train", "epochs", 2.5, "not a valid int"),
    ("train", "epochs", True, "not a valid int"),
    ("train", "lr", "fast", "not a valid float"),
    ("data", "normalize", "maybe", "not a valid bool"),
    ("data", "normalize", 2, "not a valid bool"),
    ("data", "train", ["a", "b"], "not a valid str"),
])
def test_wrong_type_names_the_key(section, key, value, words):
    err = config_error({section: {key: value}})
    assert f"cfg.yaml: {section}.{key}" in str(err)
    assert words in str(err)


@pytest.mark.parametrize("section, key, value", [
    ("train", "patience", -1), ("train", "lr", "-1e-3"), ("data", "max_len", "-5"),
])
def test_negative_value_is_an_error(section, key, value):
    err = config_error({section: {key: value}})
    assert f"{section}.{key}" in err.message and "negative" in err.message


@pytest.mark.parametrize("raw, words", [
    ({"train": {"optimizer": "adamm"}}, "not one of sgd, adam, adamw"),
    ({"data": {"dev_split": 1.0}}, "data.dev_split"),
    ({"data": {"insert_spaces": 1.5}}, "data.insert_spaces = 1.5 must be in [0, 1]"),
    ({"train": {"batch_size": 0}}, "train.batch_size"),
    ({"train": "fast"}, "must be a mapping"),
])
def test_invalid_values(raw, words):
    assert words in str(config_error(raw))


@pytest.mark.parametrize("raw, words", [
    ({"train": {"epochs": -1}}, "train.epochs = -1 must be at least 1"),
    ({"encoder": {"name": "bilstm", "dropout": 1}}, "encoder.dropout = 1.0 must be in [0, 1)"),
    ({"encoder": {"name": "transformer", "ff_ratio": 0}}, "encoder.ff_ratio = 0.0 must be positive"),
    ({"train": {"dist_timeout": "0s"}}, "train.dist_timeout = 0.0 must be positive"),
    ({"embeddings": {"lm": {"path": "a", "layer_decay": 0}}}, "embeddings.lm.layer_decay = 0.0 must be in (0, 1]"),
    ({"train": {"lr": "inf"}}, "train.lr = inf must be a finite number"),
])
def test_a_number_outside_its_fields_range_names_the_range(raw, words):
    """Each range is the field's metadata, read by the one validator (nerkit.typed_yaml)."""
    assert words in str(config_error(raw))


@pytest.mark.parametrize("value, seconds", [
    ("90s", 90), ("20m", 1200), ("1.5h", 5400), (".5h", 1800), ("3600", 3600), (600, 600), (7.5, 7.5),
    ("2e3", 2000), (" 2 m ", 120), ("0", 0),
])
def test_a_time_budget_takes_a_unit(value, seconds, write_config):
    """train.time_budget in seconds, or with s, m or h, in the file and in --set; stored as seconds."""
    assert build_config({"train": {"time_budget": value}}).train.time_budget == seconds
    assert build_config({}, overrides=[f"train.time_budget={value}"]).train.time_budget == seconds
    assert load_config(write_config(f"train:\n  time_budget: {value}\n")).train.time_budget == seconds


@pytest.mark.parametrize("value, words", [("20 minutes", "is not a duration"), ("1.5d", "is not a duration"),
                                          ("h", "is not a duration"), ("-5m", "must not be negative")])
def test_a_time_budget_that_is_not_a_duration_is_named(value, words):
    err = config_error({"train": {"time_budget": value}})
    assert "train.time_budget" in str(err) and words in str(err)
    if "duration" in words:
        assert '"20m"' in err.fix


def _choice_fields():
    """(section, key, choices) of every field whose type is a Literal, read from the classes."""
    sections = {f.name: f.default_factory for f in dataclasses.fields(Config) if dataclasses.is_dataclass(f.default_factory)}
    sections["embeddings.lm"] = LMConfig
    sections.update({f"encoder:{name}": cls for name, cls in ENCODER_OPTIONS.items()})
    found = {}
    for section, cls in sections.items():
        for f in dataclasses.fields(cls):
            if choices(cls, f.name):
                found.setdefault((section.split(":")[0], f.name), choices(cls, f.name))
    return found


def test_every_fixed_set_of_values_is_a_literal_field():
    found = _choice_fields()
    assert {("data", "scheme"), ("lexicon", "drop"), ("train", "device"), ("encoder", "attention"),
            ("encoder", "fusion"), ("embeddings.lm", "layers"), ("crf", "algorithm")} <= set(found)


def test_choices_accept_their_values():
    encoder_of = {"attention": "tener", "fusion": "flat"}  # the encoder whose options have the key
    for (section, key), values in _choice_fields().items():
        for choice in values:
            if section == "encoder":
                options = build_config({"encoder": {"name": encoder_of[key], key: choice}}).encoder.options
                assert getattr(options, key) == choice
            elif "." in section:  # a section inside a section, e.g. embeddings.lm
                outer, inner = section.split(".")
                config = build_config({outer: {inner: {key: choice}}})
                assert getattr(getattr(getattr(config, outer), inner), key) == choice
            else:
                needs = {"encoder": {"name": "tener", "memory": 8, "segment": 8}} if key == "context" else {}
                assert getattr(getattr(build_config({section: {key: choice}, **needs}), section), key) == choice


def test_unknown_key_suggests_the_closest():
    err = config_error({"train": {"lrr": 0.1}})
    assert isinstance(err, UserError)
    assert "unknown key train.lrr" in err.message
    assert err.where == "cfg.yaml"
    assert "'lr'" in err.fix


def test_unknown_key_without_a_close_match_lists_the_valid_ones():
    err = config_error({"crf": {"zzzzzz": 1}})
    assert "constrain_training" in err.fix and "dropout" in err.fix


def test_unknown_section_suggests_the_closest():
    err = config_error({"trian": {"lr": 0.1}})
    assert "unknown section 'trian'" in err.message
    assert "'train'" in err.fix


@pytest.mark.parametrize("text, words", [
    ("train: [1, 2\n", "not valid YAML"),
    ("- a\n- b\n", "must be a mapping"),
])
def test_malformed_yaml(write_config, text, words):
    path = write_config(text)
    with pytest.raises(ConfigError, match=words) as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_bad_yaml_names_its_line_and_the_fix(write_config):
    """A syntax error names the file and line and says what to correct (it named no fix before)."""
    path = write_config("data:\n  train: a.bio\n\tdev: b.bio\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load_config(path)
    assert info.value.where == f"{path}:3" and "correct the YAML at that line" in info.value.fix


def test_a_config_that_is_not_utf8_says_to_save_it_as_utf8(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("data: {train: caf\u00e9.bio}\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8") as info:
        load_config(path)
    assert info.value.fix == "save it as UTF-8"


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found") as info:
        load_config(tmp_path / "missing.yaml")
    assert "missing.yaml" in str(info.value)


# ---------------------------------------------------------------- ${VAR} interpolation


def test_interpolation_from_the_environment(monkeypatch, write_config):
    monkeypatch.setenv("CORPUS_DIR", "/corpora")
    monkeypatch.setenv("EPOCHS", "7")
    cfg = load_config(write_config("data:\n  train: ${CORPUS_DIR}/msra/train.bmes\ntrain:\n  epochs: ${EPOCHS}\n"))
    assert cfg.data.train == "/corpora/msra/train.bmes"
    assert cfg.train.epochs == 7


def test_nerkit_data_defaults_to_data(monkeypatch):
    monkeypatch.delenv("NERKIT_DATA", raising=False)
    assert build_config({"data": {"train": "${NERKIT_DATA}/x.bio"}}).data.train == "data/x.bio"
    monkeypatch.setenv("NERKIT_DATA", "/shared/data")
    assert build_config({"data": {"train": "${NERKIT_DATA}/x.bio"}}).data.train == "/shared/data/x.bio"


def test_interpolation_default(monkeypatch):
    monkeypatch.delenv("NERKIT_TEST_UNSET", raising=False)
    raw = {"data": {"test": "${NERKIT_TEST_UNSET:-gold/test.bio}"}, "train": {"lr": "${NERKIT_TEST_UNSET:-0.5}"}}
    cfg = build_config(raw)
    assert cfg.data.test == "gold/test.bio"
    assert cfg.train.lr == 0.5
    monkeypatch.setenv("NERKIT_TEST_UNSET", "")  # as in the shell, `:-` also replaces an empty value
    assert build_config(raw).data.test == "gold/test.bio"
    monkeypatch.setenv("NERKIT_TEST_UNSET", "0.25")
    assert build_config(raw).train.lr == 0.25


def test_interpolation_in_the_encoder_name(monkeypatch):
    monkeypatch.setenv("NERKIT_TEST_ENCODER", "transformer")
    assert build_config({"encoder": {"name": "${NERKIT_TEST_ENCODER}"}}).encoder.name == "transformer"


def test_unset_variable_without_default_is_an_error(monkeypatch):
    monkeypatch.delenv("NERKIT_TEST_UNSET", raising=False)
    err = config_error({"data": {"train": "${NERKIT_TEST_UNSET}/train.bio"}})
    assert "NERKIT_TEST_UNSET is not set" in err.message
    assert "data.train" in str(err)


# ---------------------------------------------------------------- --set overrides


def test_overrides(write_config):
    path = write_config("train:\n  lr: 0.005\n  epochs: 3\n")
    cfg = load_config(path, ["train.lr=0.01", "train.batch_size=8", "data.train=a.bio", "output_dir=runs/y",
                             "train.warmup_steps=1e2"])
    assert cfg.train.lr == 0.01
    assert cfg.train.epochs == 3  # untouched file value
    assert cfg.train.batch_size == 8
    assert cfg.data.train == "a.bio"
    assert cfg.output_dir == "runs/y"
    assert cfg.train.warmup_steps == 100


def test_last_override_wins():
    assert build_config({}, overrides=["train.lr=0.1", "train.lr=0.2"]).train.lr == 0.2


@pytest.mark.parametrize("override, words", [
    ("train.lr", "has no '='"),
    ("train..lr=1", "malformed"),
    ("train.lr.x=1", "nested too deep"),
    ("trian.lr=1", "did you mean 'train'"),
    ("train.lrr=1", "unknown key train.lrr"),
    ("train.epochs=abc", "train.epochs"),
])
def test_bad_overrides(override, words):
    assert words in str(config_error({}, [override]))


@pytest.mark.parametrize("override, key", [
    ("train.epochs=abc", "train.epochs"), ("train.time_budget=soon", "train.time_budget"),
    ("encoder.name=lstm", "encoder.name"), ("embeddings.lm.layers=first", "embeddings.lm.layers"),
    ("train={epochs: x}", "train.epochs"), ("crf.scheme=bad", "crf.scheme"), ("train.lrr=1", "train.lrr"),
])
def test_a_bad_value_given_by_set_names_the_set_not_the_file(write_config, override, key):
    """Issue 41: `--set train.epochs=abc` was reported against the config file, which says nothing of it."""
    path = write_config("train:\n  epochs: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, [override])
    assert str(info.value).startswith(f"--set {override}"), str(info.value)
    assert key in str(info.value) and str(path) not in str(info.value)
    with pytest.raises(ConfigError) as info:  # a bad value in the file is still the file's
        load_config(write_config("train:\n  epochs: abc\n"), ["train.lr=0.1"])
    assert str(info.value).startswith(str(path)), str(info.value)


def test_switching_the_encoder_drops_the_file_keys_it_lacks(write_config):
    path = write_config("encoder:\n  name: bilstm\n  hidden_size: 64\n  num_layers: 3\n  dropout: 0.2\n")
    cfg = load_config(path, ["encoder.name=transformer", "encoder.n_heads=2"])
    assert cfg.encoder.name == "transformer"
    assert cfg.encoder.options == ENCODER_OPTIONS["transformer"](n_heads=2, num_layers=3, dropout=0.2)


def test_unknown_encoder_key_from_the_command_line_is_an_error(write_config):
    path = write_config("encoder:\n  name: bilstm\n  hidden_size: 64\n")
    with pytest.raises(ConfigError, match="unknown key encoder.hidden_size"):
        load_config(path, ["encoder.name=transformer", "encoder.hidden_size=32"])


@pytest.mark.parametrize("encoder", [
    {"name": "bilstm", "hiden_size": 64},  # a typo
    {"name": "transformer", "hidden_size": 64},  # a key of another encoder, no switch on the command line
])
def test_unknown_encoder_key_in_the_file_is_an_error(encoder):
    err = config_error({"encoder": encoder})
    assert "unknown key encoder." in err.message
    assert "hidden_size" in str(err)


def test_unknown_encoder_lists_the_valid_names():
    err = config_error({"encoder": {"name": "lstm"}})
    assert "unknown encoder 'lstm'" in err.message
    for name in ENCODERS:
        assert name in err.fix
    assert "encoder.name" in err.where


def test_unknown_encoder_from_the_command_line():
    assert "unknown encoder 'cnn'" in str(config_error({}, ["encoder.name=cnn"]))


# ---------------------------------------------------------------- YAML round trip


def test_yaml_round_trip_of_a_changed_config(monkeypatch):
    monkeypatch.setenv("NERKIT_DATA", "/data root")
    cfg = build_config(
        {"data": {"train": "${NERKIT_DATA}/t.bio", "dev": None, "dev_split": 0.1},
         "encoder": {"name": "tener", "attention": "shaw", "scale": True, "ff_ratio": "3"},
         "embeddings": {"char_vectors": "vec/char.txt", "freeze": "yes"},
         "train": {"lr": "2e-5", "optimizer": "sgd", "time_budget": 1e-1}},
    )
    text = config_to_yaml(cfg)
    back = build_config(yaml.safe_load(text))
    assert back == cfg
    assert back.data.train == "/data root/t.bio"
    assert back.encoder.options.key_projection is None and back.encoder.options.scale is True


def _field_values(cls, section: str):
    """A strategy of valid values for every field of dataclass `cls`."""
    safe_text = st.text("abcxyz09_./-", min_size=1, max_size=8).filter(lambda s: s.lower() not in ("null", "none"))
    by_type = {
        "int": st.integers(0, 10**6),
        "float": st.floats(0, 1e6, allow_nan=False) | st.floats(0, 1e-3, allow_nan=False),
        "bool": st.booleans(),
        "str": safe_text,
        "str | None": st.none() | safe_text,
    }
    values = {}
    for f in dataclasses.fields(cls):
        allowed = choices(cls, f.name)
        values[f.name] = st.sampled_from(allowed) if allowed else by_type[f.type]
    if cls is DataConfig:
        values["dev_split"] = st.floats(0, 0.99)
        values["insert_spaces"] = st.floats(0, 1)
        values["hide_entities"] = st.floats(0, 0.99)
        values["context"] = st.just("sentence")  # document needs an encoder with memory (test_document_context.py)
    if cls is TrainConfig:
        values["batch_size"] = st.integers(1, 512)
        values["eval_batch_size"] = st.integers(1, 512)
        values["epochs"] = st.integers(1, 1000)
        values["dist_timeout"] = st.floats(1e-3, 1e6)
        values["warmup"] = st.just(0.0) | st.floats(0, 0.99) | st.integers(1, 10**6).map(float)
        values["warmup_steps"] = st.just(0)  # one warm-up key at a time (warmup's own cases are above)
    return st.fixed_dictionaries(values)


@settings(max_examples=40, deadline=None)
@given(data=_field_values(DataConfig, "data"), train=_field_values(TrainConfig, "train"),
       encoder=st.sampled_from(sorted(ENCODERS)))
def test_yaml_round_trip_of_random_configs(data, train, encoder):
    cfg = build_config({"data": data, "train": train, "encoder": {"name": encoder}})
    assert cfg.data == DataConfig(**data) and cfg.train == TrainConfig(**train)
    back = build_config(yaml.safe_load(config_to_yaml(cfg)))
    assert back == cfg
    assert config_to_dict(back) == config_to_dict(cfg)


def test_every_section_is_in_the_yaml():
    assert set(yaml.safe_load(config_to_yaml(build_config({})))) == {f.name for f in dataclasses.fields(Config)}


def test_a_config_built_in_code_writes_its_encoder_defaults():
    # Config() has no encoder options object (build_config fills one); its YAML still carries them
    assert build_config(yaml.safe_load(config_to_yaml(Config()))) == build_config({})


def test_same_run_ignores_only_what_a_resume_may_change(write_config):
    path = write_config("train:\n  epochs: 3\n  lr: 0.1\n")
    base = load_config(path)
    limits = load_config(path, ["train.time_budget=60", "train.epochs=9", "train.threads=2", "output_dir=elsewhere"])
    assert same_run(base, limits)
    assert not same_run(base, load_config(path, ["train.lr=0.2"]))
    assert not same_run(base, load_config(path, ["encoder.name=tener"]))
    assert not same_run(base, load_config(path, ["data.max_len=100"]))
    assert run_differences(base, load_config(path, ["train.lr=0.2", "data.max_len=100"])) == [
        "data.max_len: 250 -> 100", "train.lr: 0.1 -> 0.2"]
    # the distill section trains only a distilled run: a plain one (a teacher) keeps its checkpoint
    # when, say, distill.targets' default changes
    soft = load_config(path, ["distill.targets=soft"])
    assert run_differences(base, soft) == ["distill.targets: 'hard' -> 'soft'"]
    assert run_differences(base, soft, distilled=False) == []


def test_same_run_takes_one_file_named_two_ways_for_one_file(write_config, tmp_path, monkeypatch):
    corpus = tmp_path / "train.bio"
    corpus.write_text("中 B-LOC\n", encoding="utf-8")
    path = write_config(f"data:\n  train: {corpus}\n")
    monkeypatch.chdir(tmp_path)
    assert same_run(load_config(path), load_config(path, ["data.train=train.bio"]))
    assert not same_run(load_config(path), load_config(path, ["data.train=missing.bio"]))


def test_same_run_takes_a_vector_files_width_for_the_null_dimension_it_replaced(write_config):
    """A run's saved config holds the width its vector file gave (50); the matrix config that made
    it says null: the same run, which `nerkit bench --resume` must continue, not start over."""
    path = write_config("embeddings:\n  char_vectors: vectors/char.vec\n  char_dim: null\n")
    assert same_run(load_config(path), load_config(path, ["embeddings.char_dim=50"]))
    assert not same_run(load_config(path), load_config(path, ["embeddings.bichar_dim=20"]))
    assert not same_run(load_config(path), load_config(path, ["embeddings.char_vectors=other.vec"]))


@pytest.mark.slow
def test_loading_a_config_imports_no_torch():
    """The config validates everything when it loads, without the heavy libraries: a typo in a config
    is reported in a fraction of a second."""
    import subprocess
    import sys

    code = ("import sys; from nerkit.config import load_config; "
            "[load_config(p) for p in sys.argv[1:]]; "
            "heavy = [m for m in ('torch', 'transformers', 'gensim', 'numpy') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    configs = sorted(str(p) for p in (REPO / "configs").glob("*.yaml"))
    result = subprocess.run([sys.executable, "-c", code, *configs], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_config_carries_to_a_corpus_a_tenth_its_size(path, monkeypatch):
    """Issue 29: the MSRA LM configs' `warmup_steps: 830` exceeded a whole run on a 3,800-sentence
    corpus. A warm-up given as a fraction of the run's steps never takes half of them, whatever the
    corpus: checked for a tenth of MSRA's training sentences (and of the demo's)."""
    from nerkit.config import load_config
    from nerkit.training.schedule import LONG_WARMUP, warmup_steps

    monkeypatch.setenv("NERKIT_DATA", "data")
    config = load_config(path)
    sentences = (46_364 if "msra" in path.stem else 20_864 if "peopledaily" in path.stem else 200) // 10
    steps = -(-round(sentences * (1 - config.data.dev_split)) // config.train.batch_size) * config.train.epochs
    if config.train.max_steps:
        steps = min(steps, config.train.max_steps)
    assert warmup_steps(config, steps) < LONG_WARMUP * steps, (path.name, warmup_steps(config, steps), steps)
