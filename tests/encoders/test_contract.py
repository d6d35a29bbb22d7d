"""The contract every registered encoder keeps, checked over `ENCODERS` (and each attention of the
Transformer): gradients reach every parameter; a padded batch gives each sentence what it gives
alone; padding comes out as zeros, finite, and nothing written into it reaches a real position; a
model trained with it, saved and loaded predicts exactly as before; the span head trains under it;
a student of it distils from a teacher on unlabelled text; and a model of it grows by new types. A new encoder is one file and
one line in the registry, and this suite covers it without a change."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from nerkit.config import ENCODER_ALIASES, ENCODER_OPTIONS, RELATIVE_ATTENTIONS, build_config
from nerkit.model.encoders import ENCODERS, LatticeWords

INPUT_DIM, WORD_DIM = 12, 6
# Small sizes for whichever of these fields an encoder's options have.
TINY = {"hidden_size": 5, "n_heads": 2, "head_dim": 4, "num_layers": 2, "dropout": 0.3, "attn_dropout": 0.3,
        "attention_chunk": 3, "max_relative_distance": 3}
# Every position scheme of the Transformer, and the relative ones with Transformer-XL's memory
# ("+memory": segments of 4 characters, 3 remembered, so the test sentences span several segments).
CASES = ([(name, None) for name in ENCODERS if name != "tener"] + [("transformer", "learned")]
         + [("tener", a) for a in RELATIVE_ATTENTIONS]
         + [("tener", f"{a}+memory") for a in RELATIVE_ATTENTIONS])
IDS = [name if attention is None else f"{name}-{attention}" for name, attention in CASES]
MEMORY = {"memory": 3, "segment": 4}


def attention_options(attention: str | None) -> dict:
    """The encoder options a case's `attention` names: the scheme, and the memory with "+memory"."""
    if attention is None:
        return {}
    scheme, _, memory = attention.partition("+")
    return {"attention": scheme, **(MEMORY if memory else {})}


def make_encoder(name: str, attention: str | None, seed: int = 0):
    options = ENCODER_OPTIONS[name]()
    known = {f.name for f in dataclasses.fields(options)}
    options = dataclasses.replace(options, **{k: v for k, v in TINY.items() if k in known},
                                  **attention_options(attention))
    torch.manual_seed(seed)
    return ENCODERS[name](INPUT_DIM, options, WORD_DIM).double()


def make_inputs(lengths: list[int], words: list[int], seed: int = 0):
    """x (B, T, D), mask (B, T) and a lattice of `words[b]` random words inside sentence b."""
    generator = torch.Generator().manual_seed(seed)
    batch, width, n_words = len(lengths), max(lengths), max(max(words), 1)
    x = torch.randn(batch, width, INPUT_DIM, generator=generator, dtype=torch.float64)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    heads = torch.zeros(batch, n_words, dtype=torch.long)
    tails = torch.zeros(batch, n_words, dtype=torch.long)
    for b, (length, count) in enumerate(zip(lengths, words)):
        starts = torch.randint(0, max(1, length - 1), (count,), generator=generator)
        heads[b, :count] = starts
        tails[b, :count] = torch.minimum(starts + 1 + torch.randint(0, 3, (count,), generator=generator),
                                         torch.tensor(length - 1))
    word_mask = torch.arange(n_words)[None, :] < torch.tensor(words)[:, None]
    vectors = torch.randn(batch, n_words, WORD_DIM, generator=generator, dtype=torch.float64) * word_mask[..., None]
    return x, mask, LatticeWords(vectors, heads, tails, word_mask)


def test_every_encoder_name_builds_a_config_and_an_alias_its_target():
    for name, cls in ENCODERS.items():
        assert cls is ENCODERS[ENCODER_ALIASES.get(name, name)], name
        assert isinstance(cls.uses_lattice, bool), name
        build_config({"encoder": {"name": name}})  # every registered name is a valid config


@pytest.mark.parametrize("name, attention", CASES, ids=IDS)
def test_output_width_is_the_declared_output_dim(name, attention):
    encoder = make_encoder(name, attention).eval()
    x, mask, lattice = make_inputs([5, 3], [2, 1])
    assert encoder(x, mask, lattice).shape == (2, 5, encoder.output_dim)


@pytest.mark.parametrize("name, attention", CASES, ids=IDS)
def test_every_parameter_gets_a_gradient(name, attention):
    encoder = make_encoder(name, attention).train()
    x, mask, lattice = make_inputs([7, 4, 6], [3, 1, 2])
    x.requires_grad_()  # so that an encoder without parameters (none) still passes gradients on
    torch.manual_seed(1)
    (encoder(x, mask, lattice) ** 2).sum().backward()
    assert x.grad is not None and x.grad[mask].abs().sum() > 0
    missing = [n for n, p in encoder.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, f"no gradient for {missing}"


@pytest.mark.parametrize("name, attention", CASES, ids=IDS)
def test_a_batch_gives_each_sentence_what_it_gives_alone(name, attention):
    encoder = make_encoder(name, attention).eval()
    lengths, words = [9, 2, 6, 1], [4, 1, 0, 2]
    x, mask, lattice = make_inputs(lengths, words)
    with torch.no_grad():
        batched = encoder(x, mask, lattice)
        for b, (length, count) in enumerate(zip(lengths, words)):
            keep = max(count, 1)  # a sentence without words still has one (masked) slot, as collate pads
            alone = LatticeWords(lattice.words[b:b + 1, :keep], lattice.heads[b:b + 1, :keep],
                                 lattice.tails[b:b + 1, :keep], lattice.mask[b:b + 1, :keep])
            single = encoder(x[b:b + 1, :length], mask[b:b + 1, :length], alone)
            torch.testing.assert_close(batched[b, :length], single[0], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name, attention", CASES, ids=IDS)
def test_padding_is_zero_finite_and_inert(name, attention):
    encoder = make_encoder(name, attention).eval()
    lengths, words = [8, 3, 5], [3, 1, 2]
    x, mask, lattice = make_inputs(lengths, words)
    with torch.no_grad():
        out = encoder(x, mask, lattice)
        assert torch.isfinite(out).all()
        assert torch.equal(out[~mask], torch.zeros_like(out[~mask]))
        # Huge values where nothing is real: in the padded characters and the padded word slots.
        noisy_x = x.masked_fill(~mask[..., None], 1e6)
        noisy_words = lattice.words.masked_fill(~lattice.mask[..., None], -1e6)
        noisy = encoder(noisy_x, mask, LatticeWords(noisy_words, lattice.heads, lattice.tails, lattice.mask))
        torch.testing.assert_close(noisy[mask], out[mask], atol=1e-10, rtol=1e-10)


def case_overrides(name: str, attention: str | None, tmp_path) -> list[str]:
    """The tiny config's overrides that make a case's model: the encoder at its small sizes, its
    attention, and for a lattice encoder a small lexicon (the entities' own words and some noise)."""
    known = {f.name for f in dataclasses.fields(ENCODER_OPTIONS[name])}
    overrides = [f"encoder.name={name}"] + [f"encoder.{k}={v}" for k, v in TINY.items() if k in known]
    overrides += [f"encoder.{k}={v}" for k, v in attention_options(attention).items()]
    if ENCODERS[name].uses_lattice:
        words = tmp_path / "words.txt"
        words.write_text("张三\n北京\n北京大学\n上海\n新华社\n记者\n", encoding="utf-8")
        overrides += [f"lexicon.source={words}", "embeddings.word_dim=8"]
    return overrides


@pytest.mark.parametrize("name, attention", CASES, ids=IDS)
def test_train_save_load_predicts_the_same(name, attention, tmp_path, tiny_config):
    from helpers import TINY_DEV

    from nerkit.data.corpus import read_corpus
    from nerkit.inference.pipeline import Pipeline
    from nerkit.training.loop import train

    out = tmp_path / "model"
    metrics = train(tiny_config(*case_overrides(name, attention, tmp_path), "train.epochs=2"), out=out,
                    progress_bar=False)
    loaded = Pipeline.load(out)
    # The model in memory at the end of training scored dev; the loaded one scores it the same.
    assert loaded.evaluate(TINY_DEV)["counts"] == metrics["dev"]["counts"]
    texts = [s.text for s in read_corpus(TINY_DEV).sentences] + ["张三在北京大学读书。" * 3, "上"]
    predicted = loaded.predict(texts)
    loaded.save(tmp_path / "again")
    again = Pipeline.load(tmp_path / "again")
    assert again.predict(texts) == predicted
    for key, tensor in loaded.model.state_dict().items():
        assert torch.equal(again.model.state_dict()[key], tensor), key


# The span head (model.head: span) under every encoder that reads a sentence whole (Transformer-XL's
# memory streams segments, which the span head does not): a few steps of training, then a padded batch
# decodes each sentence as it decodes alone, and the model saved and loaded predicts the same.
SPAN_CASES = [(name, attention) for name, attention in CASES if "memory" not in (attention or "")]


@pytest.mark.slow
@pytest.mark.parametrize("name, attention", SPAN_CASES, ids=[i for i, c in zip(IDS, CASES) if c in SPAN_CASES])
def test_the_span_head_trains_decodes_saves_and_loads_under_every_encoder(name, attention, tmp_path, tiny_config):
    from helpers import TINY_DEV

    from nerkit.data.corpus import read_corpus
    from nerkit.inference.pipeline import Pipeline
    from nerkit.training.loop import train

    out = tmp_path / "model"
    metrics = train(tiny_config(*case_overrides(name, attention, tmp_path), "model.head=span", "span.size=8", "span.threshold=0.2",
                                "train.epochs=2"), out=out, progress_bar=False)
    loaded = Pipeline.load(out)
    assert not loaded.head.has_tags and loaded.evaluate(TINY_DEV)["counts"] == metrics["dev"]["counts"]
    texts = [s.text for s in read_corpus(TINY_DEV).sentences] + ["张三在北京大学读书。" * 3, "上"]
    together = loaded.predict(texts, scores=True)
    assert any(together), "a threshold of 0.2 finds some span after two epochs"
    alone = [loaded.predict(t, scores=True, batch_size=1)[0] for t in texts]
    assert [[{**e, "score": pytest.approx(e["score"], abs=1e-5)} for e in f] for f in together] == alone


# A student of every encoder learns from a teacher on unlabelled text (issue 44: "any nerkit
# student"), with soft targets, the harder path for an encoder (the CRF's marginals through it):
# a few steps, then the student is an ordinary model directory that names its teacher and text.
@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    from helpers import tiny_raw_config

    from nerkit.training.loop import train

    out = tmp_path_factory.mktemp("teacher") / "model"
    train(build_config(tiny_raw_config(), "<teacher>", ["train.epochs=1"]), out=out, progress_bar=False)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name, attention", CASES, ids=IDS)
def test_a_student_of_every_encoder_distils_saves_and_loads(name, attention, tmp_path, tiny_config, teacher):
    from helpers import TINY_TRAIN

    from nerkit.data.corpus import read_corpus
    from nerkit.inference.pipeline import Pipeline
    from nerkit.tools.distill import distill

    text = tmp_path / "text.txt"
    text.write_text("".join(s.text + "\n" for s in read_corpus(TINY_TRAIN).sentences[:40]), encoding="utf-8")
    config = tiny_config(*case_overrides(name, attention, tmp_path), "train.epochs=1", "data.limit=8",
                         "distill.targets=soft", "distill.ratio=2", f"distill.cache={tmp_path / 'cache'}")
    metrics = distill(config, [teacher], [text], tmp_path / "student")
    student = Pipeline.load(tmp_path / "student")
    assert student.config.encoder.name == config.encoder.name
    learnt = json.loads((tmp_path / "student" / "nerkit.json").read_text(encoding="utf-8"))["distilled_from"]
    assert [Path(t["path"]).resolve() for t in learnt["teachers"]] == [teacher.resolve()]
    assert [Path(t["path"]).name for t in learnt["texts"]] == ["text.txt"]
    assert metrics["epochs"] == 1 and student.predict(["张三在北京大学读书。"])
    epoch = json.loads((tmp_path / "student" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[-1])
    assert 0 < epoch["distill_loss"] < float("inf")  # the soft targets' loss went through the encoder


# Adding types to a trained model (nerkit.training.grow) under every encoder: a model of PER alone
# grows by LOC; before training it predicts exactly as its source (the encoder's weights are the
# source's, the new tags start below the old), and after a step of training on a corpus labelled for
# LOC alone (hard targets: the source's PER) it is an ordinary model directory of both types.
@pytest.mark.slow
@pytest.mark.parametrize("name, attention", CASES, ids=IDS)
def test_every_encoder_grows_a_model_by_new_types(name, attention, tmp_path, tiny_config):
    from dataclasses import replace

    from helpers import TINY_DEV, TINY_TRAIN

    from nerkit.data.corpus import read_corpus, write_corpus
    from nerkit.data.matching import keep_types
    from nerkit.data.splits import read_splits
    from nerkit.inference.pipeline import Pipeline
    from nerkit.training.grow import Growth
    from nerkit.training.loop import train

    sentences = read_corpus(TINY_TRAIN).sentences[:24]
    write_corpus(tmp_path / "per.bio", keep_types(sentences, {"PER"}), "bio")
    write_corpus(tmp_path / "loc.bio", keep_types(sentences, {"LOC"}), "bio")
    overrides = [*case_overrides(name, attention, tmp_path), "train.epochs=1", f"data.dev={TINY_DEV}"]
    train(tiny_config(*overrides, f"data.train={tmp_path / 'per.bio'}"), out=tmp_path / "per", progress_bar=False)
    source = Pipeline.load(tmp_path / "per")
    config = tiny_config(*overrides, f"data.train={tmp_path / 'loc.bio'}", f"grow.source={tmp_path / 'per'}")
    growth = Growth.start(config)
    grown = growth.pipeline(read_splits(growth.config), "cpu")
    texts = [s.text for s in read_corpus(TINY_DEV).sentences] + ["张三在北京大学读书。" * 3, "上"]
    assert grown.types == ["LOC", "PER"] and grown.predict(texts) == source.predict(texts)
    train(replace(config, train=replace(config.train, max_steps=2)), out=tmp_path / "grown", progress_bar=False)
    loaded = Pipeline.load(tmp_path / "grown")
    assert loaded.types == ["LOC", "PER"] and loaded.config.encoder.name == name
    assert Pipeline.load(tmp_path / "grown").predict(texts) == loaded.predict(texts)
