"""nerkit.pretrained.lac, Baidu's LAC-small in torch: the bi-GRU and the CRF against naive references written
from Paddle's documented equations, the character lookup, LAC as language-model features (save and
load, the frozen-state cache, a tiny training run), the real model's tagging (skipped without
jieba's lac_small files) and every user error."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import LAC_CHARS as CHARS
from helpers import LAC_TAGS as TAGS
from helpers import REPO, TINY_DEV, small_lac_config, small_tagger, small_vocab

import nerkit.pretrained.paddle
from nerkit.data.corpus import read_corpus
from nerkit.data.tags import Span
from nerkit.errors import UserError
from nerkit.inference.evaluate import score
from nerkit.pretrained.cache import cached_features
from nerkit.pretrained.lac import LACEmbedder, lac_spans, tag_sentences
from nerkit.pretrained.lac_files import export_lac, load_tagger, write_directory
from nerkit.pretrained.loading import load_lm, load_saved_lm, save_lm
from nerkit.pretrained.paddle import read_jieba_lac

SMALL = small_lac_config()
TEXT = "张三在北京大学读书，李明去了上海。"


@pytest.fixture
def lac_dir(tmp_path):
    """A LAC directory with small random weights, as `nerkit vectors export-lac` writes one."""
    return write_directory(tmp_path / "lac", small_tagger()[0], small_vocab(), TAGS, source="test")["path"]


@pytest.fixture(scope="module")
def jieba_lac():
    try:
        return read_jieba_lac()
    except UserError as error:
        pytest.skip(f"jieba's LAC-small files are not installed: {error}")


def batch(vocab, sentences, junk=0):
    """(B, T) ids and mask; padding holds `junk` ids, which the mask must make harmless."""
    width = max(1, max(len(s) for s in sentences))
    ids = torch.full((len(sentences), width), junk, dtype=torch.long)
    mask = torch.zeros(len(sentences), width, dtype=torch.bool)
    for b, s in enumerate(sentences):
        ids[b, :len(s)] = torch.tensor(vocab.ids(list(s)), dtype=torch.long)
        mask[b, :len(s)] = True
    return ids, mask


# ------------------------------------------------------------------------------------ naive references

def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def naive_gru(x, fc_w, fc_b, gru_w, gru_b, reverse):
    """Paddle's fc + dynamic_gru (origin_mode False) for one sentence x (T, D), one step at a time,
    from the documentation: u = sig(W_ux x + W_uh h + b_u), r = sig(W_rx x + W_rh h + b_r),
    c = tanh(W_cx x + W_ch (r * h) + b_c), h = (1 - u) h + u c; reverse reads from the last step.
    Paddle's kernel takes the weight's first 2H * H values as [W_uh | W_rh] (H, 2H), the rest as W_ch."""
    H = gru_w.shape[0]
    flat = gru_w.reshape(-1)
    w_uh, w_rh = flat[:2 * H * H].reshape(H, 2 * H)[:, :H], flat[:2 * H * H].reshape(H, 2 * H)[:, H:]
    w_ch = flat[2 * H * H:].reshape(H, H)
    h, out = np.zeros(H), np.zeros((len(x), H))
    for t in (reversed(range(len(x))) if reverse else range(len(x))):
        projected = x[t] @ fc_w + fc_b + gru_b[0]  # (3H,) [u | r | c]
        u = sigmoid(projected[:H] + h @ w_uh)
        r = sigmoid(projected[H:2 * H] + h @ w_rh)
        c = np.tanh(projected[2 * H:] + (r * h) @ w_ch)
        h = (1 - u) * h + u * c
        out[t] = h
    return out


def naive_lac(tensors, ids, config):
    """Every state of lex_net for one sentence, then its emissions: fc_{2k}/gru_{2k} forwards and
    fc_{2k+1}/gru_{2k+1} in reverse feed layer k, [forward | reverse] feeds the next."""
    states = [tensors["word_emb"][ids].astype(np.float64)]
    for k in range(config.num_layers):
        x = states[-1]
        forward = naive_gru(x, tensors[f"fc_{2 * k}.w_0"], tensors[f"fc_{2 * k}.b_0"], tensors[f"gru_{2 * k}.w_0"],
                            tensors[f"gru_{2 * k}.b_0"], reverse=False)
        backward = naive_gru(x, tensors[f"fc_{2 * k + 1}.w_0"], tensors[f"fc_{2 * k + 1}.b_0"],
                             tensors[f"gru_{2 * k + 1}.w_0"], tensors[f"gru_{2 * k + 1}.b_0"], reverse=True)
        states.append(np.concatenate([forward, backward], axis=1))
    last = 2 * config.num_layers
    return states, states[-1] @ tensors[f"fc_{last}.w_0"] + tensors[f"fc_{last}.b_0"]


def test_the_encoder_equals_a_naive_loop_of_paddles_equations():
    tagger, tensors = small_tagger(seed=1)
    vocab = small_vocab()
    sentences = ["张三在北京大学读书", "李", "上海的银行", ""]
    ids, mask = batch(vocab, sentences, junk=7)
    states = tagger.encoder(ids, mask)
    assert [s.shape for s in states] == [(4, 9, 4), (4, 9, 8), (4, 9, 8)]
    for b, sentence in enumerate(sentences):
        expected, _ = naive_lac(tensors, vocab.ids(list(sentence)), SMALL)
        for ours, theirs in zip(states, expected):
            np.testing.assert_allclose(ours[b, :len(sentence)].detach().numpy(), theirs, atol=1e-5, rtol=1e-5)


def test_the_viterbi_path_is_the_best_of_all_paths():
    """LAC's CRF (crfw: start row, end row, transitions[from, to]) decoded against scoring every
    path of K^T tags."""
    tagger, tensors = small_tagger(seed=2)
    vocab = small_vocab()
    sentences = ["张三在北", "京", "大学读", "书李"]
    ids, mask = batch(vocab, sentences, junk=3)
    decoded = tagger.decode(ids, mask)
    crfw = tensors["crfw"].astype(np.float64)
    for sentence, path in zip(sentences, decoded):
        _, emissions = naive_lac(tensors, vocab.ids(list(sentence)), SMALL)

        def total(tags):
            return (crfw[0, tags[0]] + crfw[1, tags[-1]] + sum(emissions[t, k] for t, k in enumerate(tags))
                    + sum(crfw[2 + a, b] for a, b in zip(tags, tags[1:])))

        best = max(itertools.product(range(SMALL.num_tags), repeat=len(sentence)), key=total)
        assert path == list(best)


def test_batched_equals_one_at_a_time_whatever_the_padding():
    tagger, _ = small_tagger(seed=3)
    vocab = small_vocab()
    sentences = ["张三在北京大学读书", "李明", "中国人民银行的"]
    together = tagger.encoder(*batch(vocab, sentences, junk=5))[-1]
    for b, sentence in enumerate(sentences):
        alone = tagger.encoder(*batch(vocab, [sentence]))[-1]
        torch.testing.assert_close(together[b, :len(sentence)], alone[0], atol=1e-6, rtol=1e-6)


# ------------------------------------------------------------------------------------ characters

def test_characters_fold_as_lac_was_trained_and_whitespace_is_oov():
    folded, literal = small_vocab(fold=True), small_vocab(fold=False)
    index = {c: i for i, c in enumerate(CHARS)}
    text = list("Ａａ。Ａ北 \u3000😀")
    assert folded.ids(text) == [index["a"], index["a"], index["."], index["a"], index["北"], index["OOV"],
                                index["OOV"], index["OOV"]]
    # jieba's own reader: a full-width form is its own (untrained) row, a missing one is OOV
    assert literal.ids(text) == [index["Ａ"], index["OOV"], index["。"], index["Ａ"], index["北"], index["OOV"],
                                 index["OOV"], index["OOV"]]
    assert folded.fingerprint() != literal.fingerprint()


def test_lac_tags_become_renamed_spans():
    tags = ["PER-B", "PER-I", "p-B", "ORG-B", "ORG-I", "v-B", "LOC-B", "LOC-B", "TIME-B", "nt-B", "O"]
    assert lac_spans(tags) == [Span(0, 2, "NR"), Span(3, 5, "NT"), Span(6, 7, "NS"), Span(7, 8, "NS")]
    assert lac_spans(tags, {"TIME": "TIME"}) == [Span(8, 9, "TIME")]


# ------------------------------------------------------------------------------------ the real LAC

def test_the_real_lac_finds_people_places_and_organisations(jieba_lac):
    tagger, vocab, tags = jieba_lac
    texts = ["张三在北京大学读书", "李明昨天去了上海", "马云创办了阿里巴巴集团"]
    found = [[(text[s.start:s.end], s.type) for s in lac_spans(t)]
             for text, t in zip(texts, tag_sentences(tagger, vocab, tags, [list(t) for t in texts]))]
    assert found == [[("张三", "NR"), ("北京大学", "NT")], [("李明", "NR"), ("上海", "NS")],
                     [("马云", "NR"), ("阿里巴巴集团", "NT")]]


@pytest.mark.slow
def test_the_real_lac_scores_on_msra_as_a_working_port_does(jieba_lac, data_root):
    """A wrong gate order, weight layout or direction gives F1 near 0 (scripts/lac_msra.py at commit 52f93a2: 73.97 on
    all of MSRA test); the first 300 sentences give 72.3."""
    tagger, vocab, tags = jieba_lac
    sentences = read_corpus(data_root / "msra" / "test.char.bmes").sentences[:300]
    predicted = tag_sentences(tagger, vocab, tags, [s.tokens for s in sentences])
    assert score([s.spans() for s in sentences], [lac_spans(p) for p in predicted])["f1"] > 0.68


def test_export_writes_a_directory_that_tags_and_features_alike(jieba_lac, tmp_path):
    tagger, vocab, tags = jieba_lac
    report = export_lac(tmp_path / "lac-small")
    assert report["embedding"] == [20941, 128] and report["tags"] == 57
    assert sorted(p.name for p in (tmp_path / "lac-small").iterdir()) == ["config.json", "model.safetensors",
                                                                          "tag.dic", "word.dic"]
    again, again_vocab, again_tags = load_tagger(tmp_path / "lac-small")
    ids, mask = batch(vocab, [TEXT, "北京"])
    assert again.decode(ids, mask) == tagger.decode(ids, mask) and again_tags == tags
    assert again_vocab.ids(list(TEXT)) == vocab.ids(list(TEXT))
    embedder = load_lm(tmp_path / "lac-small")
    assert isinstance(embedder, LACEmbedder) and embedder.output_dim == 256
    torch.testing.assert_close(embedder(ids, mask)[0], tagger.encoder(ids, mask)[-1][0], atol=0, rtol=0)


# ------------------------------------------------------------------------------------ as LM features

def test_a_lac_directory_loads_as_a_language_model_without_transformers(lac_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail
    embedder = load_lm(lac_dir, layers="mix")
    ids, mask = batch(embedder.vocab, [TEXT, "北京"], junk=9)
    states = embedder.states(ids, mask)  # (B, T, 3, 8): [e | e], layer 1, layer 2
    assert states.shape == (2, len(TEXT), 3, 8) and embedder.num_states == 3
    embeddings = embedder.lm.embedding(ids)
    torch.testing.assert_close(states[0, :, 0], torch.cat([embeddings[0], embeddings[0]], dim=-1))
    assert not states[1, 2:].any()  # padding is zero
    last = load_lm(lac_dir)
    torch.testing.assert_close(last(ids, mask), states[:, :, -1])


def test_frozen_lac_gets_no_gradient_and_fine_tuned_lac_trains_every_parameter(lac_dir):
    frozen = load_lm(lac_dir, layers="mix")
    frozen.train()
    ids, mask = batch(frozen.vocab, [TEXT, "北京"])
    frozen(ids, mask).sum().backward()
    assert all(p.grad is None for p in frozen.lm.parameters())
    assert frozen.scalar_mix.weights.grad is not None
    tuned = load_lm(lac_dir, finetune=True)
    tuned.train()
    tuned(ids, mask).pow(2).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in tuned.lm.named_parameters()
               if n != "embedding.weight")
    assert tuned.lm.embedding.weight.grad[ids[0]].abs().sum() > 0


@pytest.mark.parametrize("layers,finetune", [("mix", True), ("last", False)])
def test_save_then_load_elsewhere_gives_identical_features(tmp_path, lac_dir, monkeypatch, layers, finetune):
    embedder = load_lm(lac_dir, layers=layers, finetune=finetune)
    ids, mask = batch(embedder.vocab, [TEXT, "上海"])
    if finetune:  # weights that differ from the exported directory's
        embedder.train()
        embedder(ids, mask).pow(2).sum().backward()
        torch.optim.SGD(embedder.parameters(), lr=0.5).step()
        embedder.eval()
    save_lm(embedder, tmp_path / "model")
    shutil.move(str(tmp_path / "model"), str(tmp_path / "elsewhere"))
    shutil.rmtree(lac_dir)
    monkeypatch.setattr(nerkit.pretrained.paddle, "jieba_lac_folder", lambda: pytest.fail("jieba was needed"))
    again = load_saved_lm(tmp_path / "elsewhere")
    assert isinstance(again, LACEmbedder) and (again.layers, again.finetune) == (layers, finetune)
    torch.testing.assert_close(again(ids, mask), embedder(ids, mask), atol=0, rtol=0)
    assert again.fingerprint() == embedder.fingerprint()


def test_the_frozen_cache_equals_running_lac_and_any_change_misses(tmp_path, lac_dir):
    embedder = load_lm(lac_dir, layers="mix")
    corpus = [list(TEXT), [], list("北京大学")]
    first = cached_features(embedder, corpus, tmp_path / "cache")
    ids, mask = batch(embedder.vocab, ["".join(s) for s in corpus])
    live = embedder.states(ids, mask)
    for b, sentence in enumerate(corpus):
        torch.testing.assert_close(first[b].float(), live[b, :len(sentence)], atol=2e-3, rtol=2e-3)
    with torch.no_grad():
        embedder.lm.layers[1].reverse_gru.candidate[0, 0] += 1.0
    cached_features(embedder, corpus, tmp_path / "cache")
    assert len(list((tmp_path / "cache").iterdir())) == 2


@pytest.mark.slow
def test_a_tiny_training_run_on_the_real_lac_reloads_without_jieba(jieba_lac, tmp_path, tiny_config, monkeypatch):
    """Exported LAC features, fine-tuned and mixed, under a BiLSTM: train -> Pipeline.load, with
    neither the LAC directory nor jieba, predicts the same."""
    from nerkit.inference.pipeline import Pipeline
    from nerkit.training.loop import train

    export_lac(tmp_path / "lac-small")
    config = tiny_config(f"embeddings.lm.path={tmp_path / 'lac-small'}", "embeddings.lm.finetune=true",
                         "embeddings.lm.lr=0.001", "embeddings.lm.layers=mix", "embeddings.char_dim=4",
                         "embeddings.bichar_dim=0", "train.epochs=1")
    metrics = train(config, out=tmp_path / "model", progress_bar=False)
    shutil.rmtree(tmp_path / "lac-small")
    monkeypatch.setitem(sys.modules, "jieba", None)
    monkeypatch.setattr(nerkit.pretrained.paddle, "jieba_lac_folder", lambda: pytest.fail("jieba was needed"))
    assert sorted(p.name for p in (tmp_path / "model" / "lm").iterdir()) == ["config.json", "nerkit_licence.json",
                                                                             "nerkit_lm.json", "word.dic"]
    licence = json.loads((tmp_path / "model" / "lm" / "nerkit_licence.json").read_text(encoding="utf-8"))["licence"]
    assert licence.startswith("Apache-2.0") and "Apache-2.0" in (tmp_path / "model" / "README.md").read_text("utf-8")
    loaded = Pipeline.load(tmp_path / "model")
    assert loaded.evaluate(TINY_DEV)["counts"] == metrics["dev"]["counts"]
    texts = [s.text for s in read_corpus(TINY_DEV).sentences] + ["张三在北京大学读书" * 30]
    predicted = loaded.predict(texts)
    loaded.save(tmp_path / "again")
    assert Pipeline.load(tmp_path / "again").predict(texts) == predicted


def test_a_frozen_lac_trains_from_its_cache(tmp_path, tiny_config, lac_dir):
    from nerkit.inference.pipeline import Pipeline
    from nerkit.training.loop import train

    config = tiny_config(f"embeddings.lm.path={lac_dir}", f"embeddings.lm.cache={tmp_path / 'cache'}",
                         "encoder.name=none", "embeddings.char_dim=0", "embeddings.bichar_dim=0", "train.epochs=1")
    metrics = train(config, out=tmp_path / "model", progress_bar=False)
    assert len(list((tmp_path / "cache").iterdir())) == 1
    assert Pipeline.load(tmp_path / "model").evaluate(TINY_DEV)["counts"] == metrics["dev"]["counts"]


# ------------------------------------------------------------------------------------ user errors

@pytest.fixture
def fake_jieba_folder(tmp_path, monkeypatch):
    """A copy of jieba's lac_small/ that nerkit reads instead of the installed one."""
    try:
        source = nerkit.pretrained.paddle.jieba_lac_folder()
    except UserError as error:
        pytest.skip(f"jieba is not installed: {error}")
    if not (source / "model_baseline" / "crfw").is_file():
        pytest.skip("jieba's LAC-small files are not installed")
    folder = tmp_path / "lac_small"
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    monkeypatch.setattr(nerkit.pretrained.paddle, "jieba_lac_folder", lambda: folder)
    return folder


def test_a_missing_or_malformed_jieba_file_is_a_user_error(fake_jieba_folder, tmp_path):
    (fake_jieba_folder / "model_baseline" / "gru_2.w_0").unlink()
    with pytest.raises(UserError, match="lacks a file") as info:
        export_lac(tmp_path / "out")
    assert info.value.where.endswith("gru_2.w_0") and "jieba" in info.value.fix
    path = fake_jieba_folder / "model_baseline" / "fc_1.w_0"
    path.write_bytes(path.read_bytes()[:-8])
    shutil.copy(path, fake_jieba_folder / "model_baseline" / "gru_2.w_0")
    with pytest.raises(UserError, match="bytes of data") as info:
        export_lac(tmp_path / "out")
    assert info.value.where.endswith("fc_1.w_0") and info.value.fix
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_export_lac_without_jieba_exits_2_with_one_line(tmp_path):
    fake = tmp_path / "site" / "jieba"  # a jieba without lac_small/, found first
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("", encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "nerkit", "vectors", "export-lac", "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, cwd=REPO,
                            env={"PYTHONPATH": f"{tmp_path / 'site'}:{REPO}", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("nerkit: error: ") and "lac_small" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def break_weights(d):
    (d / "model.safetensors").unlink()


def break_sizes(d):
    config = json.loads((d / "config.json").read_text(encoding="utf-8"))
    (d / "config.json").write_text(json.dumps({**config, "hidden_size": 6}), encoding="utf-8")


def break_size_type(d):
    config = json.loads((d / "config.json").read_text(encoding="utf-8"))
    (d / "config.json").write_text(json.dumps({**config, "num_layers": "two"}), encoding="utf-8")


def break_missing_size(d):
    config = json.loads((d / "config.json").read_text(encoding="utf-8"))
    del config["num_tags"]
    (d / "config.json").write_text(json.dumps(config), encoding="utf-8")


def break_chars(d):
    (d / "word.dic").write_text("0\t张\nthree\n", encoding="utf-8")


def break_oov(d):
    (d / "word.dic").write_text("0\t张\n", encoding="utf-8")


def break_vocab_size(d):
    (d / "word.dic").write_text("0\t张\n99\tOOV\n", encoding="utf-8")


@pytest.mark.parametrize("damage,match", [
    (break_weights, "model.safetensors not found"), (break_sizes, "do not fit"),
    (break_size_type, "positive integers"), (break_missing_size, "lacks num_tags"),
    (break_chars, "expected `id<TAB>character`"),
    (break_oov, "no OOV entry"), (break_vocab_size, "vocab_size"),
])
def test_each_broken_lac_directory_is_a_user_error(lac_dir, damage, match):
    damage(Path(lac_dir))
    with pytest.raises(UserError, match=match) as info:
        load_lm(lac_dir)
    assert info.value.where and info.value.fix


def test_a_config_of_neither_kind_names_both(lac_dir):
    pytest.importorskip("transformers")
    (Path(lac_dir) / "config.json").write_text(json.dumps({"model_type": "lac-lstm"}), encoding="utf-8")
    with pytest.raises(UserError, match="config") as info:
        load_lm(lac_dir)
    assert info.value.where.endswith("config.json") and "export-lac" in info.value.fix
