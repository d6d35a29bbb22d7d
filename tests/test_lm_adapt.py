"""`nerkit lm adapt` (nerkit.tools.resources.lm_adapt): continued masked-LM training of a tiny BERT without an
MLM head on the fixtures' text: a fresh head, the held-out perplexity falls, the result is a
Hugging Face directory that `embeddings.lm.path` reads, a stopped run resumes to the weights of an
uninterrupted one, and whole-word masking masks jieba's words together."""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from helpers import FIXTURES, TINY_DEV, write_lm, write_subword_lm  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from nerkit.data.corpus import read_corpus  # noqa: E402
from nerkit.pretrained.loading import load_lm  # noqa: E402
from nerkit.tools.resources.lm_adapt import AdaptOptions, adapt, load_mlm, masked_batch  # noqa: E402

CHARS = sorted({c for s in read_corpus(FIXTURES / "tiny_train.bio").sentences for c in s.tokens})
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + CHARS


@pytest.fixture
def lm_dir(tmp_path):
    return write_lm(tmp_path / "tiny-lm", vocab=VOCAB)


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "text.txt"
    lines = [s.text for s in read_corpus(FIXTURES / "tiny_train.bio").sentences]
    path.write_text("\n".join(lines * 3) + "\n", encoding="utf-8")
    return path


OPTIONS = dict(steps=30, batch_size=8, lr=3e-3, held_out=0.2, checkpoint_every=10, seed=1)


def test_adapting_lowers_the_held_out_perplexity_and_writes_a_usable_directory(lm_dir, text, tmp_path):
    out = tmp_path / "adapted"
    result = adapt(lm_dir, [text], out, AdaptOptions(**OPTIONS), progress_bar=False)
    assert result["steps"] == 30 and result["stopped"] == "steps"
    assert result["perplexity_after"] < result["perplexity_before"], result
    assert json.loads((out / "adapt.json").read_text()) == result
    assert result["fresh_head"] is True and load_mlm(out)[2] is False  # the adapted directory keeps its head
    embedder = load_lm(out)  # the encoder part, as a tagger's features
    ids = torch.tensor([embedder.vocab.ids(list("张三在北京"))])
    assert embedder(ids, torch.ones_like(ids, dtype=torch.bool)).shape == (1, 5, 16)
    original = load_file(str(lm_dir / "model.safetensors"))
    adapted = load_lm(out).lm.state_dict()
    assert not torch.equal(adapted["embeddings.word_embeddings.weight"], original["embeddings.word_embeddings.weight"])


def test_a_stopped_run_resumes_to_the_uninterrupted_weights(lm_dir, text, tmp_path, caplog):
    """Each step's batch is drawn from its step number, so a "resume" that started again from step 0
    would reach the same weights: the log must also show the run going on from the checkpoint's step."""
    adapt(lm_dir, [text], tmp_path / "whole", AdaptOptions(**OPTIONS), progress_bar=False)
    adapt(lm_dir, [text], tmp_path / "cut", AdaptOptions(**{**OPTIONS, "steps": 30, "time_budget": 1e-9}),
          progress_bar=False)  # stops after its first step, with a checkpoint
    first = json.loads((tmp_path / "cut" / "adapt.json").read_text())
    assert first["stopped"] == "time_budget" and first["steps"] == 1
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="nerkit.tools.resources.lm_adapt"):
        adapt(lm_dir, [text], tmp_path / "cut", AdaptOptions(**OPTIONS), resume=True, progress_bar=False)
    assert f"steps 1 to {OPTIONS['steps']}" in caplog.text, caplog.text
    whole = load_file(str(tmp_path / "whole" / "model.safetensors"))
    resumed = load_file(str(tmp_path / "cut" / "model.safetensors"))
    assert whole.keys() == resumed.keys()
    for name in whole:
        torch.testing.assert_close(resumed[name], whole[name], atol=1e-6, rtol=1e-5)


def test_bf16_trains_under_autocast_and_measures_the_perplexity_in_float32(lm_dir, text, tmp_path, monkeypatch):
    """What the encoder's first layer outputs, by mode: bf16 in the training steps, float32 in the
    perplexity runs (model.eval()) before and after."""
    import nerkit.tools.resources.lm_adapt as lm_adapt

    seen: set[tuple[bool, torch.dtype]] = set()
    load = lm_adapt.load_mlm

    def watched(directory):
        tokenizer, model, fresh = load(directory)
        first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        first.register_forward_hook(lambda module, args, output: seen.add((module.training, output.dtype)))
        return tokenizer, model, fresh

    monkeypatch.setattr(lm_adapt, "load_mlm", watched)
    result = adapt(lm_dir, [text], tmp_path / "bf16", AdaptOptions(**OPTIONS, bf16=True), progress_bar=False)
    assert seen == {(True, torch.bfloat16), (False, torch.float32)}, seen
    assert result["bf16"] is True and result["perplexity_after"] < result["perplexity_before"], result


def test_whole_word_masking_masks_a_words_characters_together(lm_dir):
    tokenizer, _, _ = load_mlm(lm_dir)
    options = AdaptOptions(mask_prob=0.5, whole_word=True)
    line = "北京大学的张三在上海读书"
    import jieba

    words = list(jieba.cut(line))
    for seed in range(5):
        _, _, labels = masked_batch(tokenizer, [line], options, random.Random(seed))
        masked = (labels[0, 1:1 + len(line)] != -100).tolist()  # after [CLS]
        start = 0
        for word in words:  # each word all masked or all kept
            assert len(set(masked[start:start + len(word)])) == 1, (word, masked)
            start += len(word)


@pytest.mark.slow
def test_the_command_line(lm_dir, text, tmp_path):
    out = tmp_path / "cli"
    done = subprocess.run([sys.executable, "-m", "nerkit", "lm", "adapt", "--lm", str(lm_dir), "--text", str(text),
                           "--out", str(out), "--steps", "3", "--batch-size", "4"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "held-out perplexity" in done.stdout and (out / "config.json").is_file()
    excluded = subprocess.run([sys.executable, "-m", "nerkit", "lm", "adapt", "--lm", str(lm_dir), "--text", str(text),
                               "--exclude", str(FIXTURES / "tiny_train.bio"), "--out", str(tmp_path / "x1"),
                               "--steps", "1"], capture_output=True, text=True)
    assert excluded.returncode == 2 and "fewer than two lines" in excluded.stderr  # the text is that corpus, thrice
    assert "Traceback" not in excluded.stderr and not (tmp_path / "x1" / "config.json").exists()
    again = subprocess.run([sys.executable, "-m", "nerkit", "lm", "adapt", "--lm", str(lm_dir), "--text", str(text),
                            "--out", str(out), "--steps", "3"], capture_output=True, text=True)
    assert again.returncode == 2 and "not empty" in again.stderr and "Traceback" not in again.stderr
    forced = subprocess.run([sys.executable, "-m", "nerkit", "lm", "adapt", "--lm", str(lm_dir), "--text", str(text),
                             "--out", str(out), "--steps", "1", "--force"], capture_output=True, text=True)
    assert forced.returncode == 0 and json.loads((out / "adapt.json").read_text())["steps"] == 1, forced.stderr
    missing = subprocess.run([sys.executable, "-m", "nerkit", "lm", "adapt", "--lm", str(tmp_path / "nope"),
                              "--text", str(text), "--out", str(tmp_path / "x")], capture_output=True, text=True)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def test_exclude_takes_out_the_lines_of_a_dev_or_test_set(lm_dir, tmp_path):
    """`--exclude` a corpus and a config: the lines holding their sentences are not trained on (nor held
    out), and the result says how many were found and taken out."""
    dev = [s.text for s in read_corpus(TINY_DEV).sentences]
    train = [s.text for s in read_corpus(FIXTURES / "tiny_train.bio").sentences]
    text = tmp_path / "text.txt"
    text.write_text("\n".join(train + ["前言" + line + "后记" for line in dev]) + "\n", encoding="utf-8")
    config = tmp_path / "run.yaml"
    config.write_text(f"data:\n  train: {FIXTURES / 'tiny_train.bio'}\n  dev: {TINY_DEV}\n", encoding="utf-8")
    options = AdaptOptions(**{**OPTIONS, "steps": 2})
    for exclude, name in (([TINY_DEV], str(TINY_DEV)), ([config], f"{config} dev")):
        out = tmp_path / f"out-{len(name)}"
        result = adapt(lm_dir, [text], out, options, progress_bar=False, exclude=exclude)
        long_dev = {"".join(line.split()) for line in dev if len("".join(line.split())) >= 8}
        report = next(r for r in result["excluded"] if r["set"] == name)
        assert report["found_in_text"] == report["sentences"] == len(long_dev) > 0
        assert report["lines_removed"] >= len(long_dev)
        assert result["lines"] + result["held_out_lines"] == len(train) + len(dev) - sum(
            r["lines_removed"] for r in result["excluded"] if r["set"] == name)


def subword_dir(kind: str, directory):
    """A tiny model of helpers.build_tokenizer's `kind` (trained on the fixtures), without a head."""
    pytest.importorskip("tokenizers")
    return write_subword_lm(kind, directory)


@pytest.fixture
def xlnet_dir(tmp_path):
    return subword_dir("xlnet", tmp_path / "xlnet")


@pytest.mark.parametrize("kind", ["wordpiece", "unigram", "bytelevel"])
def test_sub_word_encoders_adapt_with_a_fresh_head(kind, text, tmp_path):
    """A word-piece BERT, an XLM-RoBERTa (Unigram) and a byte-level BPE RoBERTa, none with an MLM head."""
    out = tmp_path / "adapted"
    result = adapt(subword_dir(kind, tmp_path / kind), [text], out, AdaptOptions(**OPTIONS), progress_bar=False)
    assert result["perplexity_after"] < result["perplexity_before"], result
    assert load_lm(out).output_dim == 16


def test_xlnet_adapts_by_its_own_objective_and_reads_back_as_features(xlnet_dir, text, tmp_path):
    """XLNet has no masked-LM form: its targets are hidden from every token by perm_mask and predicted
    through target_mapping, its input keeps its tokens; the held-out perplexity falls and the adapted
    directory is read as features."""
    from nerkit.pretrained.subword import SubwordEmbedder
    from nerkit.tools.resources.lm_adapt import model_inputs

    tokenizer, model, _ = load_mlm(xlnet_dir)
    lines = [s.text for s in read_corpus(FIXTURES / "tiny_train.bio").sentences][:6]
    inputs = model_inputs(model, tokenizer, lines, AdaptOptions(), random.Random(0))
    plain = tokenizer(lines, truncation=True, max_length=128, padding=True, return_tensors="pt")
    assert torch.equal(inputs["input_ids"], plain["input_ids"])  # no [MASK] in XLNet's input
    for b in range(len(lines)):
        hidden = inputs["perm_mask"][b, 0].bool()  # (T,): the same for every row of the mask
        assert (inputs["perm_mask"][b] == hidden.float()).all() and hidden.any()
        mapped = inputs["target_mapping"][b]  # (P, T)
        count = int(hidden.sum())
        assert torch.equal(mapped[:count].argmax(1), hidden.nonzero().flatten()) and mapped[count:].sum() == 0
        assert torch.equal(inputs["labels"][b, :count], plain["input_ids"][b, hidden])
        assert (inputs["labels"][b, count:] == -100).all()

    out = tmp_path / "adapted"
    result = adapt(xlnet_dir, [text], out, AdaptOptions(**OPTIONS), progress_bar=False)
    assert result["perplexity_after"] < result["perplexity_before"], result
    embedder = load_lm(out)
    assert isinstance(embedder, SubwordEmbedder)
    ids = torch.tensor([embedder.vocab.ids(list("张三在北京"))])
    assert embedder(ids, torch.ones_like(ids, dtype=torch.bool)).shape == (1, 5, 16)


@pytest.mark.parametrize("kind", ["bert", "wordpiece", "unigram", "bytelevel", "xlnet"])
def test_the_loss_on_the_predicted_tokens_alone_is_the_models_own(kind, lm_dir, tmp_path):
    """`mlm_loss` runs a BERT's or RoBERTa's head on the predicted positions only; its loss and its
    gradients are those of the model's own forward over every position (XLNet computes its own)."""
    from nerkit.tools.resources.lm_adapt import mlm_loss, model_inputs

    directory = lm_dir if kind == "bert" else subword_dir(kind, tmp_path / kind)
    tokenizer, model, _ = load_mlm(directory)
    model.eval()  # no dropout: the two forwards see the same network
    lines = [s.text for s in read_corpus(FIXTURES / "tiny_train.bio").sentences][:6]
    inputs = model_inputs(model, tokenizer, lines, AdaptOptions(**OPTIONS), random.Random(3))
    ours = mlm_loss(model, inputs)
    our_grads = torch.autograd.grad(ours, [p for p in model.parameters() if p.requires_grad], allow_unused=True)
    theirs = model(**inputs).loss
    their_grads = torch.autograd.grad(theirs, [p for p in model.parameters() if p.requires_grad], allow_unused=True)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    for a, b in zip(our_grads, their_grads):
        if a is None or b is None:
            assert a is None and b is None or float((a if a is not None else b).abs().max()) == 0.0
        else:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
