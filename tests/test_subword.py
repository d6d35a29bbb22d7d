"""Language models with subword tokenizers (nerkit.pretrained.subword), on tiny randomly initialised
models built here, offline, with tokenizers trained on the test fixtures by the `tokenizers` library:
a BERT with word pieces, an XLM-RoBERTa with a SentencePiece (Unigram) model, a RoBERTa-style
byte-level BPE and an XLNet with a Unigram model. Each character's features are checked against the
tokenizer's own offsets (the mean of the states of the tokens that cover it, zeros for none), on text
with spaces, full-width forms, emoji, combining marks, Latin words and digits."""

from __future__ import annotations

import shutil
import unicodedata
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from helpers import SUBWORD_TEXTS as TEXTS  # noqa: E402
from helpers import build_model, build_tokenizer, subword_corpus_text, write_subword_lm  # noqa: E402

from nerkit.pretrained.loading import load_lm, load_saved_lm, save_lm  # noqa: E402
from nerkit.pretrained.subword import SubwordEmbedder  # noqa: E402

KINDS = ["wordpiece", "unigram", "bytelevel", "xlnet"]


@pytest.fixture(scope="module")
def lm_directory(tmp_path_factory):
    """Each kind's directory, built once for every fixture that asks for it."""
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            made[kind] = write_subword_lm(kind, tmp_path_factory.mktemp(kind))
        return made[kind]
    return get


@pytest.fixture(scope="module", params=KINDS)
def subword_lm(request, lm_directory) -> Path:
    return lm_directory(request.param)


@pytest.fixture(scope="module", params=[kind for kind in KINDS if kind != "xlnet"])
def windowed_lm(request, lm_directory) -> Path:
    """The encoders with absolute positions, which read a long text in windows (XLNet carries memory)."""
    return lm_directory(request.param)


def expected_features(directory: Path, text: str) -> torch.Tensor:
    """The reference, written from the tokenizer's own output: the LM run on the whole text with its
    special tokens, each character the mean of the non-special tokens whose offsets cover it."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    model = transformers.AutoModel.from_pretrained(str(directory)).eval()
    enc = tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="pt")
    with torch.no_grad():
        states = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state[0]
    rows = []
    for c in range(len(text)):
        covering = [t for t, ((s, e), special) in enumerate(zip(enc["offset_mapping"][0].tolist(),
                                                                 enc["special_tokens_mask"][0].tolist()))
                    if not special and s <= c < e]
        rows.append(states[covering].mean(0) if covering else torch.zeros(states.size(1)))
    return torch.stack(rows)


def features(embedder: SubwordEmbedder, texts: list[str]) -> list[torch.Tensor]:
    width = max(len(t) for t in texts)
    ids = torch.zeros(len(texts), width, dtype=torch.long)
    mask = torch.zeros(len(texts), width, dtype=torch.bool)
    for b, text in enumerate(texts):
        ids[b, :len(text)] = torch.tensor(embedder.vocab.ids(list(text)))
        mask[b, :len(text)] = True
    with torch.no_grad():
        out = embedder(ids, mask)  # (B, T, D)
    assert torch.equal(out[~mask], torch.zeros_like(out[~mask]))
    return [out[b, :len(t)] for b, t in enumerate(texts)]


def test_each_character_takes_the_tokens_that_cover_it(subword_lm):
    embedder = load_lm(subword_lm)
    assert isinstance(embedder, SubwordEmbedder)
    for text, got in zip(TEXTS, features(embedder, TEXTS)):  # one batch: padding must not matter
        torch.testing.assert_close(got, expected_features(subword_lm, text), atol=1e-5, rtol=1e-4)


def test_no_character_is_misaligned_or_dropped_silently(subword_lm):
    """Every character a token covers gets features, and only those get zeros that no token covers."""
    embedder = load_lm(subword_lm)
    for text in TEXTS:
        _, cover = embedder.align(text)
        encoded = embedder.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        covered = {c for s, e in encoded["offset_mapping"] for c in range(s, e)}
        assert {c for c in range(len(text)) if cover[c].sum() > 0} == covered
        # What a tokenizer drops is whitespace, or an accent its normaliser strips (BERT's lower-casing)
        dropped = [text[c] for c in range(len(text)) if c not in covered]
        assert all(ch.isspace() or unicodedata.category(ch) == "Mn" for ch in dropped), (text, dropped)


def test_a_character_no_token_covers_reads_the_learned_slot(subword_lm):
    """Issue 32: whitespace a tokenizer drops gets a learned vector (not zeros), from the cache as
    from the LM; covered characters and padding are untouched, and the slot trains with a frozen LM."""
    embedder = load_lm(subword_lm)  # frozen
    before = features(embedder, TEXTS)
    with torch.no_grad():
        embedder.uncovered.copy_(torch.randn(embedder.output_dim))
    after = features(embedder, TEXTS)  # also checks zeros at padding
    dropped = 0
    for text, old, new in zip(TEXTS, before, after):
        _, cover = embedder.align(text)
        for c in range(len(text)):
            if cover[c].sum() == 0:
                dropped += 1
                assert torch.equal(new[c], embedder.uncovered.detach()) and torch.equal(old[c], torch.zeros_like(old[c]))
            else:
                assert torch.equal(new[c], old[c])
    if subword_lm.name.startswith("wordpiece"):
        assert dropped >= 4  # BERT's tokenizer drops the texts' spaces at least
    if not dropped:
        return  # this tokenizer covers every character of the texts (its spaces are in tokens)
    text = next(t for t in TEXTS if (embedder.align(t)[1].sum(dim=1) == 0).any())
    ids = torch.tensor([embedder.vocab.ids(list(text))])
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        cached = embedder.states(ids, mask)  # what nerkit.pretrained.cache stores
        torch.testing.assert_close(embedder.read(None, mask, cached), embedder(ids, mask), atol=0, rtol=0)
    embedder.read(None, mask, cached).sum().backward()
    assert embedder.uncovered.grad is not None and embedder.uncovered.grad.abs().sum() > 0
    assert all(p.grad is None for p in embedder.lm.parameters())


def test_an_xlnet_directory_with_only_its_sentencepiece_model_reads_and_saves(tmp_path):
    """chinese-xlnet ships spiece.model, no tokenizer.json: a SentencePiece model trained here with the
    sentencepiece library, read through transformers' conversion to a fast tokenizer, aligned by its
    offsets as the reference says; the model directory keeps a tokenizer that reloads without it."""
    spm = pytest.importorskip("sentencepiece")
    (tmp_path / "corpus.txt").write_text("\n".join(subword_corpus_text()), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(tmp_path / "corpus.txt"), model_prefix=str(tmp_path / "spiece"),
                                   vocab_size=140, model_type="unigram", character_coverage=1.0, pad_id=0,
                                   unk_id=1, bos_id=-1, eos_id=-1, minloglevel=2)
    directory = tmp_path / "xlnet"
    directory.mkdir()
    shutil.copy(tmp_path / "spiece.model", directory / "spiece.model")
    transformers.XLNetConfig().save_pretrained(str(directory))  # the model type says which tokenizer it is
    converted = transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    assert converted.is_fast  # XLNet's special tokens come on top of the SentencePiece vocabulary
    build_model("xlnet", len(converted), converted.pad_token_id).save_pretrained(str(directory))
    assert sorted(p.name for p in directory.iterdir()) == ["config.json", "model.safetensors", "spiece.model"]
    embedder = load_lm(directory)
    assert isinstance(embedder, SubwordEmbedder) and embedder.memory
    for text, got in zip(TEXTS, features(embedder, TEXTS)):
        torch.testing.assert_close(got, expected_features(directory, text), atol=1e-5, rtol=1e-4)
    save_lm(embedder, tmp_path / "model")
    shutil.rmtree(directory)
    again = load_saved_lm(tmp_path / "model")
    for a, b in zip(features(embedder, TEXTS), features(again, TEXTS)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def windowed_reference(directory: Path, text: str, size: int) -> torch.Tensor:
    """Each token's state from the window of `size` tokens (each framed by the special tokens as the
    tokenizer frames one sequence) in which it sits most centrally, the earlier window on a tie,
    chosen by brute force over every window: windows start every size // 2 tokens, and one more ends
    the text. Then each character the mean of the tokens covering it."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    model = transformers.AutoModel.from_pretrained(str(directory)).eval()
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    framed = tokenizer("a", return_special_tokens_mask=True)  # "a" may be several tokens ("▁", "a")
    content = [i for i, special in enumerate(framed["special_tokens_mask"]) if not special]
    before, after = framed["input_ids"][:content[0]], framed["input_ids"][content[-1] + 1:]
    starts = sorted(set(range(0, max(1, len(ids) - size), size // 2)) | {max(0, len(ids) - size)})
    states = []
    with torch.no_grad():
        outputs = {s: model(input_ids=torch.tensor([before + ids[s:s + size] + after])).last_hidden_state[0]
                   for s in starts}
    for t in range(len(ids)):
        best = min((s for s in starts if s <= t < s + size), key=lambda s: (abs(t - (s + (size - 1) / 2)), s))
        states.append(outputs[best][len(before) + t - best])
    rows = []
    for c in range(len(text)):
        covering = [states[t] for t, (a, b) in enumerate(offsets) if a <= c < b]
        rows.append(torch.stack(covering).mean(0) if covering else torch.zeros(states[0].size(0)))
    return torch.stack(rows)


def test_long_texts_are_read_in_windows_of_tokens(windowed_lm):
    """A text longer than the encoder's window: every character as the reference reads it from the
    window where its token is most central; batched as alone."""
    embedder = load_lm(windowed_lm)
    assert not embedder.memory
    embedder.window = 7
    long = "".join(TEXTS[:3]) * 3
    (got,) = features(embedder, [long])
    assert got.shape == (len(long), embedder.output_dim)
    torch.testing.assert_close(got, windowed_reference(windowed_lm, long, 7), atol=1e-5, rtol=1e-4)
    assert features(embedder, [long, "张三"])[0].equal(got)  # batched as alone


def test_saved_with_its_tokenizer_and_loaded_without_the_original(subword_lm, tmp_path):
    copy = tmp_path / "lm-copy"
    shutil.copytree(subword_lm, copy)
    embedder = load_lm(copy, layers="mix")
    save_lm(embedder, tmp_path / "model")
    shutil.rmtree(copy)
    again = load_saved_lm(tmp_path / "model")
    assert isinstance(again, SubwordEmbedder) and again.vocab.fingerprint() == embedder.vocab.fingerprint()
    for a, b in zip(features(embedder, TEXTS), features(again, TEXTS)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_a_model_trained_on_a_subword_lm_reloads_and_predicts_the_same(subword_lm, tmp_path, tiny_config):
    from nerkit.inference.pipeline import Pipeline
    from nerkit.training.loop import train

    copy = tmp_path / "lm"
    shutil.copytree(subword_lm, copy)
    config = tiny_config(f"embeddings.lm.path={copy}", "embeddings.lm.finetune=true", "train.epochs=1",
                         "embeddings.lm.cache=" + str(tmp_path / "cache"))
    train(config, out=tmp_path / "model", progress_bar=False)
    before = Pipeline.load(tmp_path / "model").predict(TEXTS)
    shutil.rmtree(copy)
    assert Pipeline.load(tmp_path / "model").predict(TEXTS) == before


def test_the_lm_batch_comes_in_a_few_widths(subword_lm):
    """Issue 33's bounded memory reaches subword models: the LM's batch is padded to a size of
    nerkit.shapes (or a whole window), not to its longest row, and the features do not change."""
    from nerkit.shapes import padded_size

    embedder = load_lm(subword_lm)
    widths, run = [], embedder._run

    def recording(input_ids, attention, *memory, **options):
        widths.append(input_ids.size(1))
        return run(input_ids, attention, *memory, **options)

    texts = [("张三在北京大学读书。" * 3)[:n] for n in range(1, 31)]
    alone = [features(embedder, [t])[0] for t in texts]
    embedder._run = recording
    for text, expected in zip(texts, alone):
        torch.testing.assert_close(features(embedder, [text])[0], expected, atol=1e-5, rtol=1e-4)
    frame = embedder.window + len(embedder.prefix) + len(embedder.suffix)
    assert all(w == padded_size(w) or w == frame for w in widths), widths
    assert len(set(widths)) < len(set(texts)) // 2, widths


def xlnet_lm(directory: Path, mem_len: int | None, attn_type: str = "bi") -> Path:
    """The tiny XLNet of `build_model`, with a memory of `mem_len` states and `attn_type` attention."""
    tokenizer = build_tokenizer("xlnet")
    torch.manual_seed(0)
    config = transformers.XLNetConfig(vocab_size=len(tokenizer), d_model=16, n_layer=2, n_head=2, d_inner=32,
                                      pad_token_id=tokenizer.pad_token_id, mem_len=mem_len, attn_type=attn_type)
    transformers.XLNetModel(config).save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


def test_xlnet_reads_a_long_text_in_segments_with_memory_as_whole(tmp_path):
    """Issue 32: XLNet reads a text longer than one segment in consecutive segments, each with the
    states of the ones before as its memory (`mems`). With a memory that holds the whole text and causal
    attention, that is the text encoded whole in one call (with bidirectional attention an earlier
    segment never sees a later one, which no segment-level memory changes)."""
    directory = xlnet_lm(tmp_path / "xlnet", mem_len=1000, attn_type="uni")
    embedder = load_lm(directory)
    assert embedder.memory == 1000
    embedder.window = 7
    long = "".join(TEXTS[:3]) * 2
    assert len(embedder.align(long)[0]) > 3 * embedder.window  # several segments
    (got,) = features(embedder, [long])
    torch.testing.assert_close(got, expected_features(directory, long), atol=1e-5, rtol=1e-4)
    embedder.memory = 3  # a memory that forgets: no longer the whole
    assert not torch.allclose(features(embedder, [long])[0], got, atol=1e-3)


def test_xlnet_memory_carries_context_and_stays_bounded(tmp_path):
    """With a short mem_len (and XLNet's bidirectional attention) each segment is read with the
    last mem_len states before it, never more, and the features are not the independent windows'."""
    directory = xlnet_lm(tmp_path / "xlnet", mem_len=5)
    embedder = load_lm(directory)
    embedder.window = 7
    long = "".join(TEXTS[:3]) * 3
    given, kept, forward = [], [], embedder.lm.forward

    def recording(*args, **options):
        given.append(None if options.get("mems") is None else [m.size(0) for m in options["mems"]])
        out = forward(*args, **options)
        kept.append([m.size(0) for m in out.mems])
        return out

    embedder.lm.forward = recording
    (got,) = features(embedder, [long])
    segments = -(-(len(embedder.align(long)[0]) + 2) // (embedder.window + 2))
    assert len(given) == segments > 3 and given[0] is None
    assert all(sizes == [5, 5] for sizes in given[1:]) and all(max(sizes) <= 5 for sizes in kept)
    del embedder.lm.forward
    # batched with shorter sentences (which leave the batch early) as alone
    torch.testing.assert_close(features(embedder, [TEXTS[1], long, "张三"])[1], got, atol=1e-5, rtol=1e-4)
    embedder.memory = 0
    windows = features(embedder, [long])[0]
    assert not torch.allclose(got, windows, atol=1e-3)  # the memory, not windows, carries the context


def test_xlnet_without_mem_len_keeps_one_segment(subword_lm):
    embedder = load_lm(subword_lm)
    if embedder.lm.config.model_type != "xlnet":
        assert embedder.memory == 0  # windows, as before
        return
    assert embedder.memory == embedder.window + len(embedder.prefix) + len(embedder.suffix)


def test_a_frozen_subword_lms_cache_file_reads_as_running_it(subword_lm, tmp_path, tiny_config):
    """Issue 32: a frozen sub-word LM runs once over the training text into its cache file (a real
    entry on disk, read back on a second build without running the LM); the model's features from the
    cached states equal running the LM live, covered characters, uncovered slots and padding alike."""
    from nerkit.data.splits import read_splits
    from nerkit.features.batch import collate
    from nerkit.training.build import build_pipeline
    from nerkit.training.loop import attach_lm_cache

    cache = tmp_path / "cache"
    config = tiny_config(f"embeddings.lm.path={subword_lm}", f"embeddings.lm.cache={cache}")
    splits = read_splits(config)
    pipe = build_pipeline(config, splits)
    with torch.no_grad():
        pipe.model.lm.sources[0].uncovered.copy_(torch.randn(pipe.model.lm.output_dim))  # not zeros
    examples = [pipe.featurizer.training_example(s) for s in splits.train]
    attach_lm_cache(config, pipe, splits, examples)
    (entry,) = cache.iterdir()
    assert (entry / "features.safetensors").is_file() and all(e.lm_states is not None for e in examples)

    again = [pipe.featurizer.training_example(s) for s in splits.train]  # a second run: the file, no LM
    source = pipe.model.lm.sources[0]
    run, source.states = source.states, None  # calling it would fail
    try:
        attach_lm_cache(config, pipe, splits, again)
    finally:
        source.states = run
    embedder = pipe.model.embedder.eval()
    for start in range(0, len(examples), 8):  # batches of different widths: padding must not matter
        cached, read_back = collate(examples[start:start + 8]), collate(again[start:start + 8])
        live = collate([pipe.featurizer.training_example(s) for s in splits.train[start:start + 8]])
        assert live.lm_states is None and cached.lm_states is not None
        with torch.no_grad():
            from_cache, from_file, from_lm = embedder(cached), embedder(read_back), embedder(live)
        torch.testing.assert_close(from_file, from_cache, atol=0, rtol=0)
        torch.testing.assert_close(from_cache, from_lm, atol=5e-3, rtol=5e-3)  # the cache holds float16


def test_every_parameter_has_a_depth_for_layer_decay(subword_lm):
    """`embeddings.lm.layer_decay` reads each parameter's depth from its name: BERT's, RoBERTa's and
    XLNet's two layers are depths 1 and 2, their embeddings (XLNet's mask_emb too) depth 0."""
    embedder = load_lm(subword_lm, finetune=True)
    depths = embedder.parameter_depths()
    assert len(depths) == len(list(embedder.lm.parameters()))
    names = {id(p): n for n, p in embedder.lm.named_parameters()}
    assert {depth for _, depth in depths} == {0, 1, 2}
    for p, depth in depths:  # (XLNet's layers hold a segment embedding of their own: `layer.0.rel_attn.seg_embed`)
        name = names[id(p)]
        assert f"layer.{depth - 1}." in name if depth else ("emb" in name and "layer." not in name), (name, depth)
