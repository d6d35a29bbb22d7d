"""Stacked feature sources (nerkit.pretrained.stacked, `embeddings.lm` as a list): each character's
features are every source's own, concatenated in list order; each frozen source is cached on its
own; the model directory holds every source and reloads without them; the config refuses a list it
cannot read. The sources are the tiny offline models of helpers.py (a character-level BERT, a word-piece BERT
and LAC-small)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from helpers import LAC_TAGS as TAGS  # noqa: E402
from helpers import build_model, build_tokenizer, small_tagger, small_vocab, tiny_raw_config, write_lm  # noqa: E402

from nerkit.config import build_config, config_to_yaml  # noqa: E402
from nerkit.errors import ConfigError, ModelDirError  # noqa: E402
from nerkit.features.batch import collate  # noqa: E402
from nerkit.pretrained.lac_files import write_directory  # noqa: E402
from nerkit.pretrained.loading import load_lm, load_saved_lm, save_lm  # noqa: E402
from nerkit.pretrained.stacked import Stacked  # noqa: E402

TEXTS = ["张三在北京大学读书。", "上海市长江大桥 Hello 2024年", "我"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """Three source directories: a character BERT, a word-piece BERT, LAC-small (small random weights)."""
    root = tmp_path_factory.mktemp("sources")
    tokenizer = build_tokenizer("wordpiece")
    build_model("wordpiece", len(tokenizer), tokenizer.pad_token_id).save_pretrained(str(root / "pieces"))
    tokenizer.save_pretrained(str(root / "pieces"))
    lac = write_directory(root / "lac", small_tagger()[0], small_vocab(), TAGS, source="test")["path"]
    return {"chars": write_lm(root / "chars"), "pieces": root / "pieces", "lac": Path(lac)}


def stacked_config(tmp_path, *sources: dict, extra: tuple[str, ...] = ()):
    """The tiny config with `embeddings.lm` the list `sources` (each a mapping with its options)."""
    raw = tiny_raw_config()
    raw["embeddings"]["lm"] = [dict(s) for s in sources]
    raw["train"].update(epochs=1, max_steps=3)
    return build_config(raw, "<stacked config>", list(extra))


def batch_of(lm, texts: list[str]):
    """A batch of `texts` as the featuriser and collate make it: LM ids (B, T) or (B, N, T), mask."""
    from nerkit.features.featurizer import Example

    examples = [Example([1] * len(t), [1] * len(t), lm_ids=lm.vocab.ids(list(t))) for t in texts]
    return collate(examples)


# ------------------------------------------------------------------------------------ features

def test_features_are_each_sources_own_concatenated_in_order(sources):
    """Compared with each source alone: the stack's features are theirs side by side, in list
    order, padding included, and the width is the sum."""
    alone = [load_lm(sources["chars"], layers="mix"), load_lm(sources["pieces"]), load_lm(sources["lac"])]
    stack = Stacked(alone)
    assert stack.output_dim == sum(s.output_dim for s in alone)
    batch = batch_of(stack, TEXTS)
    assert batch.lm_ids.shape == (len(TEXTS), 3, max(map(len, TEXTS)))  # (B, N, T)
    with torch.no_grad():
        got = stack(batch.lm_ids, batch.mask)  # (B, T, sum D)
        expected = torch.cat([s(batch_of(s, TEXTS).lm_ids, batch.mask) for s in alone], dim=-1)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


def test_each_source_keeps_its_own_fine_tuning(sources):
    """A fine-tuned source's weights get gradients, a frozen one's none (and it never drops out)."""
    tuned, frozen = load_lm(sources["chars"], finetune=True), load_lm(sources["pieces"])
    stack = Stacked([tuned, frozen]).train()
    batch = batch_of(stack, TEXTS)
    stack(batch.lm_ids, batch.mask).square().sum().backward()
    assert all(p.grad is not None for p in tuned.lm.parameters() if p.requires_grad)
    assert all(not p.requires_grad and p.grad is None for p in frozen.lm.parameters())
    assert tuned.lm.training and not frozen.lm.training


# ------------------------------------------------------------------------------------ caches

def test_each_frozen_source_is_cached_on_its_own_and_reads_as_running_it(sources, tmp_path):
    """Two frozen sources and a fine-tuned one: each frozen source writes one entry into its own
    cache directory; a training batch carries their states and the fine-tuned source's ids, and the
    model's features from it equal running every source."""
    from nerkit.data.splits import read_splits
    from nerkit.training.build import build_pipeline
    from nerkit.training.loop import attach_lm_cache

    config = stacked_config(tmp_path, {"path": str(sources["chars"]), "cache": str(tmp_path / "cache-chars")},
                            {"path": str(sources["pieces"]), "finetune": True},
                            {"path": str(sources["lac"]), "layers": "mix", "cache": str(tmp_path / "cache-lac")})
    splits = read_splits(config)
    pipe = build_pipeline(config, splits)
    examples = [pipe.featurizer.training_example(s) for s in splits.train]
    attach_lm_cache(config, pipe, splits, examples)
    assert [len(list((tmp_path / name).iterdir())) for name in ("cache-chars", "cache-lac")] == [1, 1]
    first = examples[0].lm_states
    assert isinstance(first, tuple) and first[1] is None
    assert first[0].shape == (len(examples[0]), 1, 16) and first[2].shape[:2] == (len(examples[0]), 3)
    cached = collate(examples[:4])
    assert cached.lm_ids.shape[1] == 3 and cached.lm_states[1] is None  # the fine-tuned source runs on its ids
    live = collate([pipe.featurizer.training_example(s) for s in splits.train[:4]])
    assert live.lm_states is None
    embedder = pipe.model.embedder.eval()
    with torch.no_grad():
        torch.testing.assert_close(embedder(cached), embedder(live), atol=5e-3, rtol=5e-3)  # the cache is float16


def test_all_frozen_sources_cached_need_no_ids(sources, tmp_path):
    """Every source cached: the batch carries no LM ids at all, as with one frozen LM."""
    from nerkit.data.splits import read_splits
    from nerkit.training.build import build_pipeline
    from nerkit.training.loop import attach_lm_cache

    cache = str(tmp_path / "cache")
    config = stacked_config(tmp_path, {"path": str(sources["chars"]), "cache": cache},
                            {"path": str(sources["lac"]), "cache": cache})
    splits = read_splits(config)
    pipe = build_pipeline(config, splits)
    examples = [pipe.featurizer.training_example(s) for s in splits.train]
    attach_lm_cache(config, pipe, splits, examples)
    assert len(list((tmp_path / "cache").iterdir())) == 2  # one entry per source, keyed by its checksum
    batch = collate(examples[:3])
    assert batch.lm_ids is None and all(s is not None for s in batch.lm_states)


# ------------------------------------------------------------------------------------ training, model directory

def test_a_stacked_model_trains_saves_and_reloads_without_its_sources(sources, tmp_path):
    """A few training steps with a fine-tuned character BERT (its own learning rate) and a frozen
    word-piece BERT; the model directory holds both (lm/0/, lm/1/, no pickle) and predicts the same
    with the source directories gone."""
    from nerkit.inference.pipeline import Pipeline
    from nerkit.training.loop import train
    from nerkit.training.schedule import make_optimizer

    copies = {name: shutil.copytree(sources[name], tmp_path / name) for name in ("chars", "pieces")}
    config = stacked_config(tmp_path, {"path": str(copies["chars"]), "finetune": True, "lr": 1e-4},
                            {"path": str(copies["pieces"]), "cache": str(tmp_path / "cache")})
    train(config, out=tmp_path / "model", progress_bar=False)
    model = tmp_path / "model"
    assert sorted(p.name for p in (model / "lm").iterdir()) == ["0", "1"]
    assert (model / "lm" / "0" / "vocab.txt").is_file() and (model / "lm" / "1" / "tokenizer.json").is_file()
    assert not any(p.suffix in (".bin", ".pt", ".pkl") for p in model.rglob("*"))
    before = Pipeline.load(model)
    predicted = before.predict(TEXTS)
    groups = make_optimizer(config, before.model).param_groups
    assert [g["lr"] for g in groups] == [config.train.lr, 1e-4]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in before.model.lm_parameters()[0]}
    for copy in copies.values():
        shutil.rmtree(copy)
    again = Pipeline.load(model)
    assert isinstance(again.model.lm, Stacked) and again.predict(TEXTS) == predicted
    emissions = [p.model.emissions(collate([p.featurizer.example(list(t)) for t in TEXTS])) for p in (before, again)]
    torch.testing.assert_close(emissions[0], emissions[1], atol=0, rtol=0)


def test_the_save_of_a_stack_is_each_sources_own(sources, tmp_path):
    """lm/k/ is what saving source k alone writes, so each reloads as it would alone."""
    stack = Stacked([load_lm(sources["chars"], layers="mix"), load_lm(sources["lac"], finetune=True)])
    save_lm(stack, tmp_path / "stacked")
    for k, source in enumerate(stack.sources):
        save_lm(source, tmp_path / f"alone{k}")
        written = {p.name: p.read_bytes() for p in (tmp_path / f"alone{k}" / "lm").iterdir()}
        assert {p.name: p.read_bytes() for p in (tmp_path / "stacked" / "lm" / str(k)).iterdir()} == written
    again = load_saved_lm(tmp_path / "stacked")
    assert [type(s) for s in again.sources] == [type(s) for s in stack.sources]
    assert [(s.layers, s.finetune) for s in again.sources] == [("mix", False), ("last", True)]
    batch = batch_of(stack, TEXTS)
    with torch.no_grad():
        torch.testing.assert_close(again(batch.lm_ids, batch.mask), stack(batch.lm_ids, batch.mask), atol=0, rtol=0)


def test_one_language_model_keeps_the_layout_of_before(sources, tmp_path, tiny_config):
    """A single `embeddings.lm` mapping writes what it always did: lm/ holds the files themselves,
    config.yaml a mapping, model.safetensors the names `embedder.lm.lm.*`; it loads as one LM."""
    import yaml
    from safetensors import safe_open

    from nerkit.data.splits import read_splits
    from nerkit.inference.pipeline import Pipeline
    from nerkit.pretrained.base import CharFeatures
    from nerkit.training.build import build_pipeline

    config = tiny_config(f"embeddings.lm.path={sources['chars']}")
    model = build_pipeline(config, read_splits(config)).save(tmp_path / "model")
    assert (model / "lm" / "nerkit_lm.json").is_file() and not (model / "lm" / "0").exists()
    assert isinstance(yaml.safe_load((model / "config.yaml").read_text(encoding="utf-8"))["embeddings"]["lm"], dict)
    with safe_open(str(model / "model.safetensors"), "pt") as f:
        assert any(k.startswith("embedder.lm.lm.") for k in f.keys())
    assert isinstance(Pipeline.load(model).model.lm, CharFeatures)


def test_a_pickle_inside_a_sources_folder_or_a_lost_source_is_refused(sources, tmp_path):
    from nerkit.data.splits import read_splits
    from nerkit.inference.pipeline import Pipeline
    from nerkit.training.build import build_pipeline

    config = stacked_config(tmp_path, {"path": str(sources["chars"])}, {"path": str(sources["lac"])})
    model = build_pipeline(config, read_splits(config)).save(tmp_path / "model")
    (model / "lm" / "1" / "extra.bin").write_bytes(b"\x80")
    with pytest.raises(ModelDirError, match="pickle-capable files: lm/1/extra.bin"):
        Pipeline.load(model)
    shutil.rmtree(model / "lm" / "1")
    with pytest.raises(ModelDirError, match="lm/ holds 1 language model.* config.yaml lists 2") as info:
        Pipeline.load(model)
    assert "copy the whole model directory again" in info.value.fix


# ------------------------------------------------------------------------------------ config

@pytest.mark.parametrize("lm, message", [
    ([], "embeddings.lm is an empty list"),
    ([{"path": "a"}, "b"], "embeddings.lm[1] is str 'b', not a mapping"),
    ([{"path": "a"}, {"path": "./a"}], "embeddings.lm[1] repeats the path of embeddings.lm[0]"),
    ([{"path": "a"}, {"finetune": True}], "embeddings.lm[1] has no path"),
    ([{"path": "a"}, {"path": "b", "layers": "first"}], "embeddings.lm[1].layers = 'first' is not one of last, mix"),
    ([{"path": "a"}, {"path": "b", "paht": "c"}], "unknown key embeddings.lm[1].paht"),
    ([{"path": "a", "lr": -1}, {"path": "b"}], "embeddings.lm[0].lr = -1.0 must not be negative"),
])
def test_a_list_it_cannot_read_is_one_config_error_naming_the_item(lm, message):
    raw = tiny_raw_config()
    raw["embeddings"]["lm"] = lm
    with pytest.raises(ConfigError) as info:
        build_config(raw, "stacked.yaml")
    assert info.value.message.startswith(message) and info.value.where == "stacked.yaml"
    assert str(info.value).count("\n") == 0


def test_a_list_round_trips_and_a_list_of_one_is_that_mapping(tiny_config):
    listed = tiny_config("embeddings.lm=[{path: a, finetune: true, lr: 1e-4}, {path: b, layers: mix}]")
    assert [(s.path, s.finetune, s.lr, s.layers) for s in listed.embeddings.lm_sources()] == \
        [("a", True, 1e-4, "last"), ("b", False, 0.0, "mix")]
    import yaml

    assert build_config(yaml.safe_load(config_to_yaml(listed)), "config.yaml") == listed
    assert tiny_config("embeddings.lm=[{path: a}]").embeddings.lm == tiny_config("embeddings.lm.path=a").embeddings.lm
    assert tiny_config().embeddings.lm_sources() == []


def test_a_dotted_override_into_a_list_says_to_set_the_whole_list():
    raw = tiny_raw_config()
    raw["embeddings"]["lm"] = [{"path": "a"}, {"path": "b"}]
    with pytest.raises(ConfigError, match=r"embeddings\.lm is a list of sources") as info:
        build_config(raw, "stacked.yaml", ["embeddings.lm.finetune=true"])
    assert "embeddings.lm=[" in info.value.fix
