"""Language-model features (nerkit.pretrained.bert) on a tiny randomly initialised BERT that each test writes to a
temporary directory: ids per character, windows, padding, frozen vs fine-tuned, scalar mix,
save/load, the feature cache and every user error."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys

import pytest
import torch
from helpers import LM_CHARS as CHARS
from helpers import LM_VOCAB as VOCAB
from helpers import bert_config, tiny_raw_config, write_lm
from safetensors.torch import save_file

from nerkit.errors import UserError
from nerkit.pretrained.base import lm_windows
from nerkit.pretrained.bert import LMVocab
from nerkit.pretrained.cache import cached_features, corpus_checksum
from nerkit.pretrained.loading import load_lm, load_saved_lm, save_lm

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="transformers is not installed (make install adds it)")

TEXT = "我爱北京天安门，上海市长江大桥在中国。"


@pytest.fixture
def lm_dir(tmp_path):
    pytest.importorskip("transformers")
    return write_lm(tmp_path / "tiny-lm")


def batch_of(embedder, sentences, junk=0):
    """(B, T) ids and mask; padding holds `junk` ids, which the mask must make harmless."""
    width = max(1, max(len(s) for s in sentences))
    ids = torch.full((len(sentences), width), junk, dtype=torch.long)
    mask = torch.zeros(len(sentences), width, dtype=torch.bool)
    for b, s in enumerate(sentences):
        ids[b, :len(s)] = torch.tensor(embedder.vocab.ids(list(s)), dtype=torch.long)
        mask[b, :len(s)] = True
    return ids, mask


# ------------------------------------------------------------------------------------ ids

def test_one_id_per_character_with_unk_case_fullwidth_and_space():
    vocab = LMVocab(VOCAB, lowercase=True)
    ids = vocab.ids(list("北京A Ｂａ９😀\u3000\t"))
    assert ids == [vocab.index["北"], vocab.index["京"], vocab.index["a"], vocab.index["[unused1]"],
                   vocab.index["b"],  # 'Ｂ' -> 'ｂ' (missing) -> NFKC 'B' -> 'b'
                   vocab.index["ａ"],  # the vocab has the full-width form itself: the tokenizer's form wins
                   vocab.index["9"], vocab.unk_id, vocab.index["[unused1]"], vocab.index["[unused1]"]]
    assert vocab.ids([]) == []


def test_cased_vocab_keeps_case_and_uncased_fallback():
    cased = LMVocab(VOCAB + ["A"], lowercase=False)
    assert cased.ids(["A", "a", "Ｃ"]) == [cased.index["A"], cased.index["a"], cased.index["c"]]
    no_space = LMVocab([t for t in VOCAB if t != "[unused1]"], lowercase=True)
    assert no_space.ids([" "]) == [no_space.unk_id]


def test_accents_are_stripped_when_the_tokenizer_lower_cases():
    vocab = LMVocab(VOCAB + ["e"], lowercase=True)
    assert vocab.ids(["é", "É"]) == [vocab.index["e"]] * 2
    kept = LMVocab(VOCAB + ["e"], lowercase=True, strip_accents=False)
    assert kept.ids(["é"]) == [kept.unk_id]


@needs_transformers
@pytest.mark.parametrize("lower", [True, False])
def test_ids_agree_with_bert_tokenizer_where_it_gives_one_token(tmp_path, lower):
    from transformers import BertTokenizer

    path = tmp_path / "vocab.txt"
    path.write_text("".join(t + "\n" for t in VOCAB + ["A", "e"]), encoding="utf-8")
    ours = LMVocab(VOCAB + ["A", "e"], lowercase=lower)
    theirs = BertTokenizer(str(path), do_lower_case=lower)
    checked = 0
    for char in TEXT + "AaＡｂé9９,，x":
        pieces = theirs.tokenize(char)
        if len(pieces) == 1 and pieces[0] != "[UNK]":
            assert ours.id(char) == theirs.convert_tokens_to_ids(pieces[0]), char
            checked += 1
    assert checked >= len(set(TEXT))


@needs_transformers
def test_vocab_settings_are_read_from_the_directory(lm_dir):
    assert LMVocab.read(lm_dir).lowercase is True
    (lm_dir / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}), encoding="utf-8")
    assert LMVocab.read(lm_dir).lowercase is False
    (lm_dir / "tokenizer_config.json").unlink()
    assert LMVocab.read(lm_dir).lowercase is True  # BertTokenizer's default


# ------------------------------------------------------------------------------------ windows

@pytest.mark.parametrize("length,size", [(0, 5), (5, 5), (6, 5), (13, 4), (40, 14), (1475, 510), (9, 1)])
def test_windows_give_each_character_its_most_central_window(length, size):
    spans = lm_windows(length, size)
    taken = [i for _, _, a, b in spans for i in range(a, b)]
    assert taken == list(range(length))
    for start, end, a, b in spans:
        assert 0 <= start <= a <= b <= end <= length and end - start <= size
        # at least a quarter window of context on each side, except at the sentence's own ends
        assert a == 0 or a - start >= size // 4 - 1
        assert b == length or end - b >= size // 4 - 1
        for i in range(a, b):
            distance = abs(i - (start + end - 1) / 2)
            assert all(distance <= abs(i - (s + e - 1) / 2) for s, e, _, _ in spans if s <= i < e)


@needs_transformers
def test_long_sentence_equals_the_lm_run_on_each_window(lm_dir):
    embedder = load_lm(lm_dir)
    assert embedder.window == 14
    sentence = (TEXT * 3)[:40]
    ids, mask = batch_of(embedder, [sentence])
    states = embedder.states(ids, mask)  # (1, 40, 1, 16)
    spans = lm_windows(40, 14)
    assert len(spans) > 2
    for start, end, a, b in spans:
        window = torch.tensor([[embedder.vocab.cls_id] + ids[0, start:end].tolist() + [embedder.vocab.sep_id]])
        with torch.no_grad():
            direct = embedder.lm(input_ids=window).last_hidden_state[0]  # (end - start + 2, 16)
        torch.testing.assert_close(states[0, a:b, 0], direct[1 + a - start:1 + b - start], atol=1e-5, rtol=1e-5)


@needs_transformers
@pytest.mark.parametrize("layers", ["last", "mix"])
def test_batched_equals_one_at_a_time_and_padding_is_inert(lm_dir, layers):
    embedder = load_lm(lm_dir, layers=layers)
    sentences = [TEXT[:3], (TEXT * 3)[:40], "", TEXT[:14], TEXT[:15]]
    ids, mask = batch_of(embedder, sentences, junk=embedder.vocab.index["北"])
    together = embedder(ids, mask)  # (5, 40, 16)
    assert together.shape == (5, 40, embedder.output_dim)
    assert not together[~mask].any()
    for b, s in enumerate(sentences):
        alone = embedder(*batch_of(embedder, [s]))
        torch.testing.assert_close(together[b, :len(s)], alone[0, :len(s)], atol=1e-5, rtol=1e-5)


@needs_transformers
def test_the_lm_runs_as_wide_as_the_batch_not_as_its_longest_row(lm_dir):
    """Issue 33: the LM's own batch took the width of its longest row, so every new length was a new
    shape for its kernels (oneDNN caches one per shape, under bf16), however few shapes the
    prediction batches came in. It now takes the batch's width (at most a window of the LM's
    positions), and the masked extra positions change nothing."""
    embedder = load_lm(lm_dir)  # 16 positions: windows of 14 characters
    widths, run = [], embedder._run

    def counted_run(input_ids, attention):
        widths.append(input_ids.shape[1])
        return run(input_ids, attention)

    embedder._run = counted_run
    sentences = [TEXT[:3], TEXT[:5]]
    ids, mask = batch_of(embedder, sentences)  # (2, 5)
    wide_ids = torch.cat([ids, torch.zeros(2, 7, dtype=torch.long)], dim=1)  # (2, 12), as collate_padded pads
    wide_mask = torch.cat([mask, torch.zeros(2, 7, dtype=torch.bool)], dim=1)
    narrow, wide = embedder(ids, mask), embedder(wide_ids, wide_mask)
    long_ids, long_mask = batch_of(embedder, [TEXT[:4], (TEXT * 2)[:30]])  # (2, 30): windows of 14
    embedder(long_ids, long_mask)
    assert widths == [5 + 2, 12 + 2, 14 + 2]
    torch.testing.assert_close(wide[:, :5], narrow, atol=1e-5, rtol=1e-5)
    assert not wide[:, 5:].any()


# ------------------------------------------------------------------------------------ training modes

@needs_transformers
def test_frozen_lm_gets_no_gradient_and_never_drops_out(lm_dir):
    embedder = load_lm(lm_dir, layers="mix", finetune=False)
    embedder.train()
    assert not embedder.lm.training
    ids, mask = batch_of(embedder, [TEXT, TEXT[:5]])
    out = embedder(ids, mask)
    torch.testing.assert_close(out, embedder(ids, mask))  # no dropout
    out.pow(2).sum().backward()
    assert all(p.grad is None and not p.requires_grad for p in embedder.lm.parameters())
    assert embedder.scalar_mix.weights.grad is not None and embedder.scalar_mix.gamma.grad is not None


@needs_transformers
def test_fine_tuned_lm_trains_every_parameter(lm_dir):
    embedder = load_lm(lm_dir, finetune=True)
    embedder.train()
    assert embedder.lm.training
    ids, mask = batch_of(embedder, [TEXT, (TEXT * 3)[:40]])
    embedder(ids, mask).pow(2).sum().backward()
    missing = [n for n, p in embedder.named_parameters() if p.grad is None]
    assert not missing


@needs_transformers
def test_scalar_mix_is_a_softmax_weighted_sum_of_all_layers(lm_dir):
    embedder = load_lm(lm_dir, layers="mix")
    assert embedder.num_states == 3  # embeddings + 2 layers
    with torch.no_grad():
        embedder.scalar_mix.weights.copy_(torch.tensor([0.5, -1.0, 2.0]))
        embedder.scalar_mix.gamma.fill_(1.7)
    ids, mask = batch_of(embedder, [TEXT[:10]])
    out = embedder(ids, mask)[0]  # (10, 16)
    window = torch.tensor([[embedder.vocab.cls_id] + ids[0].tolist() + [embedder.vocab.sep_id]])
    with torch.no_grad():
        hidden = embedder.lm(input_ids=window, output_hidden_states=True).hidden_states
    weights = torch.softmax(torch.tensor([0.5, -1.0, 2.0]), 0)
    expected = 1.7 * sum(w * h[0, 1:-1] for w, h in zip(weights, hidden))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    last = load_lm(lm_dir, layers="last")
    torch.testing.assert_close(last(ids, mask)[0], hidden[-1][0, 1:-1], atol=1e-5, rtol=1e-5)


@needs_transformers
def test_bf16_autocast_stays_close_to_fp32(lm_dir):
    fp32, bf16 = load_lm(lm_dir), load_lm(lm_dir, bf16=True)
    ids, mask = batch_of(fp32, [TEXT])
    expected, got = fp32(ids, mask), bf16(ids, mask)
    assert got.dtype == torch.float32
    assert not torch.equal(expected, got)
    torch.testing.assert_close(got, expected, atol=0.1, rtol=0.05)


# ------------------------------------------------------------------------------------ loading and saving

@needs_transformers
def test_pytorch_model_bin_with_pretraining_prefix_loads_the_same(tmp_path):
    a = load_lm(write_lm(tmp_path / "st", seed=3))
    b = load_lm(write_lm(tmp_path / "bin", seed=3, weights="bin", prefix="bert."))
    ids, mask = batch_of(a, [TEXT])
    torch.testing.assert_close(a(ids, mask), b(ids, mask))


@needs_transformers
@pytest.mark.parametrize("layers,finetune", [("mix", True), ("last", False)])
def test_save_then_load_elsewhere_gives_identical_outputs(tmp_path, monkeypatch, layers, finetune):
    source = write_lm(tmp_path / "original")
    embedder = load_lm(source, layers=layers, finetune=finetune)
    if finetune:  # weights that differ from the original directory's
        embedder.train()
        ids, mask = batch_of(embedder, [TEXT])
        embedder(ids, mask).pow(2).sum().backward()
        torch.optim.SGD(embedder.parameters(), lr=0.1).step()
        embedder.eval()
    model_dir = tmp_path / "model"
    save_lm(embedder, model_dir)
    moved = tmp_path / "elsewhere"
    shutil.move(str(model_dir), str(moved))
    shutil.rmtree(source)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    again = load_saved_lm(moved)
    assert (again.layers, again.finetune) == (layers, finetune)
    assert sorted(p.name for p in (moved / "lm").iterdir()) == sorted(
        ["config.json", "vocab.txt", "tokenizer_config.json", "model.safetensors", "nerkit_lm.json",
         "nerkit_licence.json"] + (["mix.safetensors"] if layers == "mix" else []))
    assert again.terms.licence == "unknown: see the source"  # the tiny LM's directory says nothing of it
    ids, mask = batch_of(embedder, [TEXT, (TEXT * 3)[:40]])
    torch.testing.assert_close(again(ids, mask), embedder(ids, mask), atol=0, rtol=0)


M3E_TERMS = "m3e-small by MokaAI; its model card says M3E models are for research use only."


@pytest.mark.parametrize("files, licence, terms", [
    ({}, "unknown: see the source", None),
    ({"LICENSE": "MIT License\n"}, "see LICENSE", None),
    ({"README.md": "---\nlicense: other\nlicense_name: tiny-terms\n---\n# card\n", "LICENSE": "x"},
     "other (tiny-terms)", None),
    ({"README.md": "# a card without front matter\n"}, "unknown: see the source", None),
    # as scripts/fetch_lm.py writes m3e-small, the terms alone (before it wrote a `licence` too) or both
    ({"README.md": "---\nlanguage: [zh]\n---\n", "SOURCE.json": json.dumps({"terms": M3E_TERMS})}, M3E_TERMS, M3E_TERMS),
    ({"SOURCE.json": json.dumps({"licence": "research use only", "terms": M3E_TERMS})}, "research use only", M3E_TERMS),
])
def test_a_language_models_terms_are_read_from_its_directory_and_carried_into_lm(tmp_path, files, licence, terms):
    """Issue 41: the terms a directory states (a model card's front matter, a LICENSE file, fetch_lm's
    SOURCE.json) go with the LM into a model directory's lm/, and come back from there unchanged."""
    from nerkit.pretrained.licences import model_terms, read_terms

    source = write_lm(tmp_path / "tiny-lm")
    for name, text in files.items():
        (source / name).write_text(text, encoding="utf-8")
    found = read_terms(source)
    assert (found.model, found.licence, found.terms) == ("tiny-lm", licence, terms)
    save_lm(load_lm(source), tmp_path / "model", weights=False)
    for name, text in files.items():
        assert (tmp_path / "model" / "lm" / name).read_text(encoding="utf-8") == text
    assert model_terms(tmp_path / "model") == [found.to_dict()]
    assert load_saved_lm(tmp_path / "model").terms.to_dict() == found.to_dict()


# ------------------------------------------------------------------------------------ feature cache

@needs_transformers
def test_cache_hit_is_identical_and_any_change_misses(tmp_path, lm_dir, monkeypatch):
    from safetensors import safe_open

    embedder = load_lm(lm_dir, layers="mix")
    corpus = [list(TEXT), list((TEXT * 3)[:40]), [], list("上海")]
    cache = tmp_path / "cache"
    first = cached_features(embedder, corpus, cache)
    assert [f.shape for f in first] == [(len(s), 3, 16) for s in corpus]
    assert all(f.dtype == torch.float16 for f in first)
    ids, mask = batch_of(embedder, ["".join(s) for s in corpus])
    direct = embedder.states(ids, mask)
    for b, s in enumerate(corpus):
        torch.testing.assert_close(first[b].float(), direct[b, :len(s)], atol=2e-3, rtol=2e-3)
    entries = list(cache.iterdir())
    assert len(entries) == 1
    with safe_open(str(entries[0] / "features.safetensors"), framework="pt") as f:  # a valid safetensors file
        assert f.get_tensor("offsets").tolist() == [0, 19, 59, 59, 61]

    def no_lm(*args):
        raise AssertionError("the LM ran on a cache hit")

    with monkeypatch.context() as patched:
        patched.setattr(embedder, "states", no_lm)
        second = cached_features(embedder, corpus, cache)
    assert all(torch.equal(a, b) for a, b in zip(first, second))

    cached_features(embedder, corpus[:-1] + [list("上京")], cache)  # changed corpus
    assert len(list(cache.iterdir())) == 2
    cached_features(load_lm(lm_dir, layers="last"), corpus, cache)  # changed layers option
    assert len(list(cache.iterdir())) == 3
    cached_features(load_lm(lm_dir, layers="mix", bf16=True), corpus, cache)  # changed precision
    assert len(list(cache.iterdir())) == 4
    with torch.no_grad():
        embedder.lm.embeddings.word_embeddings.weight[5, 0] += 1.0  # changed weights
    cached_features(embedder, corpus, cache)
    assert len(list(cache.iterdir())) == 5


@needs_transformers
def test_damaged_cache_entry_is_recomputed(tmp_path, lm_dir):
    embedder = load_lm(lm_dir)
    corpus = [list(TEXT)]
    first = cached_features(embedder, corpus, tmp_path / "cache")[0].clone()  # not a view of the file
    (entry,) = (tmp_path / "cache").iterdir()
    path = entry / "features.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    again = cached_features(embedder, corpus, tmp_path / "cache")
    assert torch.equal(first, again[0])


@needs_transformers
def test_processes_that_miss_one_cache_entry_take_turns(tmp_path, lm_dir, monkeypatch):
    """The ranks of a distributed run on one machine miss the same entry at once: while one writes
    it (here: holds the cache directory's lock, then puts the entry in place), the other waits, and
    then reads it without running the LM."""
    import fcntl
    import os
    import threading

    embedder, corpus = load_lm(lm_dir), [list(TEXT)]
    (tmp_path / "elsewhere").mkdir()
    expected = cached_features(embedder, corpus, tmp_path / "elsewhere")[0].clone()
    (written,) = (tmp_path / "elsewhere").iterdir()
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setattr(embedder, "states", lambda *args: pytest.fail("the LM ran although another process wrote"))
    lock = os.open(cache, os.O_RDONLY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    found = []
    waiting = threading.Thread(target=lambda: found.extend(cached_features(embedder, corpus, cache)))
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive() and not found  # it waits for its turn
    shutil.copytree(written, cache / written.name)
    os.close(lock)
    waiting.join(10)
    assert not waiting.is_alive() and torch.equal(found[0], expected)


@needs_transformers
def test_cache_refuses_a_fine_tuned_lm(tmp_path, lm_dir):
    with pytest.raises(ValueError, match="frozen"):
        cached_features(load_lm(lm_dir, finetune=True), [list(TEXT)], tmp_path)


def test_corpus_checksum_separates_tokens_and_sentences():
    assert corpus_checksum([["ab"]]) != corpus_checksum([["a", "b"]])
    assert corpus_checksum([["a"], ["b"]]) != corpus_checksum([["a", "b"]])


# ------------------------------------------------------------------------------------ user errors

class NotATensor:
    pass


def break_missing_dir(d):
    shutil.rmtree(d)


def break_config(d):
    (d / "config.json").unlink()


def break_config_json(d):
    (d / "config.json").write_text("{not json", encoding="utf-8")


def break_vocab(d):
    (d / "vocab.txt").unlink()


def break_specials(d):
    (d / "vocab.txt").write_text("".join(c + "\n" for c in CHARS), encoding="utf-8")


def break_weights(d):
    (d / "model.safetensors").unlink()


def break_safetensors(d):
    (d / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")


def break_pickle_objects(d):
    (d / "model.safetensors").unlink()
    torch.save({"w": torch.zeros(1), "thing": NotATensor()}, d / "pytorch_model.bin")


def break_pickle_bytes(d):
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not really a zip")


def break_shapes(d):
    config = bert_config(len(VOCAB))
    config.hidden_size = 32
    config.save_pretrained(d)


def break_missing_tensors(d):
    from safetensors.torch import load_file

    state = load_file(str(d / "model.safetensors"))
    save_file({k: v for k, v in state.items() if "layer.1." not in k}, str(d / "model.safetensors"))


def break_vocab_size(d):
    write_lm(d, config=bert_config(vocab_size=10))  # weights and config agree, the vocab is larger


def break_truncated_vocab(d):
    write_lm(d, config=bert_config(vocab_size=2 * len(VOCAB)))  # weights and config agree, vocab.txt is half


def break_positions(d):
    bert_config(max_positions=2).save_pretrained(d)


@needs_transformers
@pytest.mark.parametrize("damage,match", [
    (break_missing_dir, "directory not found"), (break_config, "config.json not found"),
    (break_config_json, "config"), (break_vocab, "no vocabulary"),
    (break_specials, r"lacks \[PAD\]"),
    (break_weights, "no model.safetensors or pytorch_model.bin"), (break_safetensors, "cannot be read"),
    (break_pickle_objects, "objects other than tensors"), (break_pickle_bytes, "cannot be read"),
    (break_shapes, "do not fit"), (break_missing_tensors, "16 tensors missing"),
    (break_vocab_size, "vocab.txt has 56 tokens but config.json's vocab_size is 10: ids would overflow"),
    (break_truncated_vocab, r"vocab.txt has 56 tokens but config.json's vocab_size is 112 \(50%\): vocab.txt looks truncated"),
    (break_positions, "max_position_embeddings"),
])
def test_each_broken_lm_directory_is_a_user_error(lm_dir, damage, match):
    damage(lm_dir)
    with pytest.raises(UserError, match=match) as info:
        load_lm(lm_dir)
    assert info.value.where and info.value.fix


def fake_hub_cache(root, name: str, commit: str = "0123abcd"):
    """The layout `huggingface-cli download NAME` leaves: hub/models--ORG--NAME/{refs/main,snapshots/COMMIT/}
    with the tiny LM in the snapshot (and an older snapshot beside it, which refs/main does not name)."""
    repo = root / "hub" / f"models--{name.replace('/', '--')}"
    write_lm(repo / "snapshots" / commit)
    (repo / "snapshots" / "older").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit, encoding="utf-8")
    return repo / "snapshots" / commit


@needs_transformers
@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME"])
def test_a_hub_name_is_read_from_the_local_hugging_face_cache(tmp_path, monkeypatch, nerkit, variable):
    """Issue 41: `embeddings.lm.path: org/name` was refused although the model was in the offline
    cache, with a fix that said "character-level encoder" (a sub-word encoder is read as well)."""

    from nerkit.config import build_config, config_to_yaml

    snapshot = fake_hub_cache(tmp_path / "hf", "tiny-org/tiny-bert")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv(variable, str(tmp_path / "hf" / ("hub" if variable == "HF_HUB_CACHE" else "")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    assert load_lm("tiny-org/tiny-bert").output_dim == load_lm(snapshot).output_dim == 16
    config = tmp_path / "lm.yaml"
    for name, code in [("tiny-org/tiny-bert", 0), ("tiny-org/absent-bert", 2)]:
        raw = build_config(tiny_raw_config(), "<tiny>", [f"embeddings.lm.path={name}"])
        config.write_text(config_to_yaml(raw), encoding="utf-8")
        result = nerkit("train", "--config", str(config), "--dry-run", check=False)
        assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr and "character-level" not in result.stderr
    assert "no Hugging Face model tiny-org/absent-bert in the local cache" in result.stderr, result.stderr
    assert "models--tiny-org--absent-bert/snapshots/<commit>" in result.stderr and "never downloads" in result.stderr


@needs_transformers
def test_a_fine_tuned_lm_at_its_own_rate_records_both_rates(tmp_path, lm_dir):
    """metrics.jsonl's record of each epoch: `lr` the rate of the rest, `lm_lr` the LM's own group's
    (issue 41: the report's rate panel showed only the first)."""
    import json


    from nerkit.config import build_config
    from nerkit.training.loop import train

    config = build_config(tiny_raw_config(), "<tiny>", [f"embeddings.lm.path={lm_dir}", "embeddings.lm.finetune=true",
                                                        "embeddings.lm.lr=0.0003", "train.epochs=2"])
    train(config, out=tmp_path / "m", progress_bar=False)
    records = [json.loads(line) for line in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in records] == pytest.approx([0.02, 0.02])
    assert [r["lm_lr"] for r in records] == pytest.approx([0.0003, 0.0003])


@needs_transformers
def test_a_vocabulary_a_little_short_of_vocab_size_is_accepted(tmp_path):
    """Some models round vocab_size up past their vocab.txt: 90% of it or more is accepted."""
    lm = load_lm(write_lm(tmp_path / "lm", config=bert_config(vocab_size=len(VOCAB) + 5)))
    assert len(lm.vocab) == len(VOCAB)


def saved_model(tmp_path, lm_dir):
    """A model directory with a language model (built, not trained: loading is what is tested)."""

    from nerkit.config import build_config
    from nerkit.data.splits import read_splits
    from nerkit.training.build import build_pipeline

    config = build_config(tiny_raw_config(), "<tiny config>", [f"embeddings.lm.path={lm_dir}", "embeddings.bichar_dim=0"])
    return build_pipeline(config, read_splits(config)).save(tmp_path / "model")


@needs_transformers
def test_a_model_copied_without_its_lm_directory_says_to_copy_all_of_it(tmp_path, lm_dir, nerkit):
    """Issue 33: it once failed with a torch warning and `model.safetensors does not match ...`."""
    from nerkit.errors import ModelDirError
    from nerkit.inference.pipeline import Pipeline

    model = saved_model(tmp_path, lm_dir)
    shutil.rmtree(model / "lm")
    with pytest.raises(ModelDirError, match="lm/ is missing") as info:
        Pipeline.load(model)
    assert info.value.where == str(model) and "copy the whole model directory" in info.value.fix
    result = nerkit("eval", "--model", str(model), "--data", str(tmp_path / "absent.bio"), check=False)
    # (the capture may also hold the log lines of building the model above, when an earlier test
    # in this process turned nerkit's logging on: the command's own output is its error lines)
    errors = [line for line in result.stderr.splitlines() if line.startswith("nerkit: error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr
    assert errors[0].startswith(f"nerkit: error: {model}: lm/ is missing"), result.stderr


@needs_transformers
@pytest.mark.parametrize("damage, where", [
    (lambda lm: (lm / "vocab.txt").write_bytes("[PAD]\n北京\n".encode("gbk")), "vocab.txt"),
    (lambda lm: (lm / "config.json").unlink(), ""),
    (lambda lm: (lm / "tokenizer_config.json").write_text("{", encoding="utf-8"), "tokenizer_config.json"),
])
def test_a_damaged_lm_directory_inside_a_model_says_to_copy_the_model_again(tmp_path, lm_dir, damage, where):
    """Not `run make lm` (the fix for a language model's own directory): nerkit wrote these files."""
    from nerkit.errors import ModelDirError
    from nerkit.inference.pipeline import Pipeline

    model = saved_model(tmp_path, lm_dir)
    damage(model / "lm")
    with pytest.raises(ModelDirError) as info:
        Pipeline.load(model)
    assert info.value.where == str(model / "lm" / where).rstrip("/")
    assert info.value.fix == "the model directory's lm/ is damaged: copy the whole model directory again, or train " \
                             "the model again"


@needs_transformers
def test_unknown_layers_option_and_incomplete_saved_lm_are_user_errors(tmp_path, lm_dir):
    with pytest.raises(UserError, match="layers"):
        load_lm(lm_dir, layers="first")
    save_lm(load_lm(lm_dir), tmp_path / "model")
    (tmp_path / "model" / "lm" / "nerkit_lm.json").unlink()
    with pytest.raises(UserError, match="nerkit_lm.json"):
        load_saved_lm(tmp_path / "model")


def test_missing_transformers_is_a_user_error(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail
    with pytest.raises(UserError, match="transformers") as info:
        load_lm(tmp_path)
    assert "lm" in info.value.fix
