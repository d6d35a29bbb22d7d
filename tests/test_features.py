"""Tests for nerkit.features.featurizer: vocabulary ids, bigrams, word2vec vector loading, collation and
length-bucketed batching."""

from __future__ import annotations

import random
from collections import Counter

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nerkit.data.text import END, bigrams
from nerkit.features.batch import bucketed_batches, collate
from nerkit.features.featurizer import PAD, UNK, Example, Vocab

# ------------------------------------------------------------------------------------------ Vocab


def test_vocab_reserves_pad_zero_and_unk_one():
    vocab = Vocab(["甲", "乙"])
    assert vocab.tokens == [PAD, UNK, "甲", "乙"]
    assert vocab.index[PAD] == 0 and vocab.index[UNK] == 1
    assert vocab.ids(["乙", "甲", "丙"]) == [3, 2, 1]  # unknown -> 1
    assert len(vocab) == 4
    assert "甲" in vocab and "丙" not in vocab


def test_vocab_does_not_duplicate_special_tokens_given_as_tokens():
    vocab = Vocab([UNK, "a", PAD, "b"])
    assert vocab.tokens == [PAD, UNK, "a", "b"]


def test_vocab_build_orders_by_frequency_then_token_and_applies_min_freq():
    counts = Counter({"c": 2, "a": 2, "b": 5, "d": 1})
    assert Vocab.build(counts).tokens == [PAD, UNK, "b", "a", "c", "d"]
    assert Vocab.build(counts, min_freq=2).tokens == [PAD, UNK, "b", "a", "c"]


@given(st.lists(st.sampled_from(list("abcdef中文字") + ["ab", "中文"]), max_size=40), st.randoms())
def test_vocab_build_does_not_depend_on_insertion_order(tokens, rnd):
    shuffled = tokens[:]
    rnd.shuffle(shuffled)
    assert Vocab.build(Counter(tokens)).tokens == Vocab.build(Counter(shuffled)).tokens


# ---------------------------------------------------------------------------------------- bigrams


def test_bigrams_pair_each_char_with_the_next_and_end_with_the_marker():
    assert bigrams(["北", "京", "市"]) == ["北京", "京市", "市" + END]
    assert bigrams(["a"]) == ["a" + END]
    assert bigrams([]) == []


def test_collate_pads_to_the_longest_and_masks_real_positions():
    examples = [Example([5, 6, 7], [8, 9, 10], [1, 2, 0]), Example([4], [3], [2]), Example([2, 2], [1, 1], [0, 1])]
    batch = collate(examples)
    assert batch.char_ids.shape == batch.bichar_ids.shape == batch.mask.shape == batch.tag_ids.shape == (3, 3)
    assert batch.mask.dtype == torch.bool
    assert batch.mask.tolist() == [[True] * 3, [True, False, False], [True, True, False]]
    assert batch.char_ids.tolist() == [[5, 6, 7], [4, 0, 0], [2, 2, 0]]
    assert batch.bichar_ids.tolist() == [[8, 9, 10], [3, 0, 0], [1, 1, 0]]
    assert batch.tag_ids.tolist() == [[1, 2, 0], [2, 0, 0], [0, 1, 0]]
    assert int(batch.mask.sum()) == 6
    assert batch.word_ids is None


def test_collate_without_tags_and_with_lattice_words():
    examples = [Example([1, 2], [1, 2], word_ids=[4], word_heads=[0], word_tails=[1]),
                Example([3], [3], word_ids=[5, 6, 7], word_heads=[0, 0, 0], word_tails=[0, 0, 0])]
    batch = collate(examples)
    assert batch.tag_ids is None
    assert batch.word_ids.shape == batch.word_heads.shape == batch.word_tails.shape == batch.word_mask.shape == (2, 3)
    assert batch.word_mask.tolist() == [[True, False, False], [True, True, True]]
    assert batch.word_ids.tolist() == [[4, 0, 0], [5, 6, 7]]


# ------------------------------------------------------------------------------ bucketed_batches


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=400), st.integers(1, 17), st.one_of(st.none(), st.integers(0, 99)),
       st.integers(1, 6))
def test_bucketed_batches_cover_every_index_exactly_once(lengths, batch_size, seed, bucket_factor):
    rng = random.Random(seed) if seed is not None else None
    batches = bucketed_batches(lengths, batch_size, rng, bucket_factor)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    assert all(1 <= len(b) <= batch_size for b in batches)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=200), st.integers(1, 17), st.one_of(st.none(), st.integers(0, 99)))
def test_bucketed_batches_within_a_pool_hold_disjoint_length_ranges(lengths, batch_size, seed):
    # One pool (bucket_factor large enough): each batch is a run of the length-sorted examples, so
    # no two batches' length ranges interleave, whatever the shuffling.
    rng = random.Random(seed) if seed is not None else None
    batches = bucketed_batches(lengths, batch_size, rng, bucket_factor=1000)
    ranges = sorted((min(lengths[i] for i in b), max(lengths[i] for i in b)) for b in batches)
    for (_, hi), (lo, _) in zip(ranges, ranges[1:]):
        assert hi <= lo


def test_bucketed_batches_pad_far_less_than_random_batches_and_are_reproducible():
    rnd = random.Random(0)
    lengths = [rnd.randint(1, 200) for _ in range(3000)]

    def padding(batches):
        return sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in batches)

    order = list(range(len(lengths)))
    rnd.shuffle(order)
    random_batches = [order[i:i + 32] for i in range(0, len(order), 32)]
    bucketed = bucketed_batches(lengths, 32, random.Random(1), bucket_factor=10)
    assert padding(bucketed) < 0.2 * padding(random_batches)  # about 0.1 with pools of 320
    assert bucketed == bucketed_batches(lengths, 32, random.Random(1), bucket_factor=10)
    assert bucketed != bucketed_batches(lengths, 32, random.Random(2), bucket_factor=10)


# ----------------------------------------------------------------------- the featuriser


def featurizer_for(tmp_path, tiny_config, *overrides, words="AB公司\n北京\n"):
    """A FLAT featuriser over a word list and one training sentence written in full-width letters."""
    from nerkit.data.records import Sentence
    from nerkit.data.tags import Span, scheme_tags
    from nerkit.features.featurizer import Featurizer
    from nerkit.features.lexicon import Lexicon

    lexicon_file = tmp_path / "words.txt"
    lexicon_file.write_text(words, encoding="utf-8")
    config = tiny_config("encoder.name=flat", f"lexicon.source={lexicon_file}", *overrides)
    sentence = Sentence(list("他在ＡＢ公司工作"), ["O", "O", "B-ORG", "I-ORG", "I-ORG", "I-ORG", "O", "O"])
    assert sentence.spans() == [Span(2, 6, "ORG")]
    lexicon = Lexicon.from_source(str(lexicon_file), 2)
    return Featurizer.build(config, [sentence], scheme_tags(["ORG"], "bio"), lexicon), sentence


def test_a_word_matched_only_after_normalisation_has_its_own_id(tmp_path, tiny_config):
    """With data.normalize, "ＡＢ公司" reads as "AB公司", a lexicon word: it is counted into the
    word vocabulary from the same normalised text that examples are built from, so it never
    reaches the model as <unk> (it did when the counting saw the raw text)."""
    featurizer, sentence = featurizer_for(tmp_path, tiny_config, "data.normalize=true")
    assert "AB公司" in featurizer.words
    example = featurizer.example(sentence.tokens)
    assert example.word_ids == [featurizer.words.index["AB公司"]]
    assert (example.word_heads, example.word_tails) == ([2], [5])
    assert featurizer.chars.index["A"] == example.char_ids[2]  # characters normalised the same way


def test_without_normalisation_the_raw_text_is_matched(tmp_path, tiny_config):
    featurizer, sentence = featurizer_for(tmp_path, tiny_config, "data.normalize=false")
    assert featurizer.example(sentence.tokens).word_ids == [] and len(featurizer.words) == 2
    assert "Ａ" in featurizer.chars


def test_examples_and_counting_agree_on_every_unit(tmp_path, tiny_config):
    """No unit of a training sentence (character, bigram, lattice word) maps to <unk>: the
    vocabularies were counted from exactly what `example` looks up."""
    featurizer, sentence = featurizer_for(tmp_path, tiny_config, "data.normalize=true",
                                          words="AB公司\n公司\n工作\nAB\n在ＡＢ\n")
    example = featurizer.example(sentence.tokens)
    assert 1 not in example.char_ids and 1 not in example.bichar_ids and 1 not in example.word_ids
    assert len(example.word_ids) == 4  # AB, AB公司, 公司, 工作 (在ＡＢ only matches the raw text)


def test_every_whitespace_character_is_one_space_to_the_model(tmp_path, tiny_config):
    """A tab, U+3000, a no-break space or a line break reads as the one SPACE that training with
    data.insert_spaces teaches, normalised or not; other characters stay as they are."""
    from nerkit.features.featurizer import SPACE

    for normalize in ("false", "true"):
        featurizer, _ = featurizer_for(tmp_path, tiny_config, f"data.normalize={normalize}")
        units = featurizer.units(list("北 京\t上\u3000海\xa0\n\u2003。"))
        assert units.chars == ["北", SPACE, "京", SPACE, "上", SPACE, "海", SPACE, SPACE, SPACE, "。"]
        assert units.bichars[:2] == ["北" + SPACE, SPACE + "京"]


def test_a_binary_word2vec_file_is_the_lattice_of_a_trained_pipeline(tmp_path, tiny_config):
    """`lexicon.source` may be a binary word2vec file, as `embeddings.word_vectors` may (issue 42: one
    reader for both): a FLAT pipeline built from it matches its words in a training sentence and its
    model takes a step on them."""
    import numpy as np

    from nerkit.data.corpus import read_corpus
    from nerkit.data.splits import read_splits
    from nerkit.features.batch import collate
    from nerkit.training.build import build_pipeline

    sentence = read_corpus(tiny_config().data.train).sentences[0]
    words = ["".join(sentence.tokens[i:i + 2]) for i in range(0, len(sentence.tokens) - 1, 2)]
    records = b"".join(w.encode() + b" " + np.full(4, 0.5, "<f4").tobytes() + b"\n" for w in words)
    path = tmp_path / "w2v.bin"
    path.write_bytes(f"{len(words)} 4\n".encode() + records)
    config = tiny_config("encoder.name=flat", "encoder.n_heads=2", "encoder.head_dim=4", "embeddings.word_dim=4",
                         f"lexicon.source={path}")
    pipe = build_pipeline(config, read_splits(config))
    example = pipe.featurizer.example(sentence.tokens, sentence.tags)
    assert {pipe.featurizer.words.tokens[i] for i in example.word_ids} == set(words)
    loss = pipe.model.loss(collate([example]))
    loss.backward()
    assert torch.isfinite(loss)
