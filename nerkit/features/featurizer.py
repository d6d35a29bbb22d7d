"""Features: the one place text becomes model input. `Featurizer` turns a sentence's characters
into character, character-bigram ("bichar") and lexicon-word ids (normalisation and the FLAT
lattice included), and counts the vocabularies from training text through the very same steps.
Batches of them are nerkit.features.batch's."""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nerkit.config import head_traits
from nerkit.data.records import Sentence
from nerkit.data.tags import detect_scheme, spans_to_tags, split_tag
from nerkit.data.text import SPACE, bigrams, normalize_char
from nerkit.errors import ModelDirError
from nerkit.features.lexicon import Lexicon, SentenceLattice, build_lattice

if TYPE_CHECKING:  # no torch at run time: the ONNX runtime featurises without it
    import torch

PAD, UNK = "<pad>", "<unk>"


class Vocab:
    """Token <-> id. Id 0 is padding, id 1 the unknown token."""

    def __init__(self, tokens: list[str]):
        self.tokens = [PAD, UNK] + [t for t in tokens if t not in (PAD, UNK)]
        self.index = {t: i for i, t in enumerate(self.tokens)}

    @classmethod
    def build(cls, counts: Counter, min_freq: int = 1) -> "Vocab":
        # Most frequent first, ties by the token itself, so a vocabulary is reproducible.
        kept = sorted((t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t))
        return cls(kept)

    def extended(self, tokens) -> "Vocab":
        """This vocabulary with `tokens` it lacks appended, in their order (ids stay as they were)."""
        new = [t for t in dict.fromkeys(tokens) if t not in self.index]
        return Vocab(self.tokens + new) if new else self

    def ids(self, tokens) -> list[int]:
        get = self.index.get
        return [get(t, 1) for t in tokens]

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: str) -> bool:
        return token in self.index


@dataclass
class Units:
    """What a sentence is made of, as the model sees it: normalised characters (every whitespace
    character the one SPACE), their bigrams and, for a lattice encoder, the lexicon words matched
    in the normalised text."""

    chars: list[str]
    bichars: list[str]
    lattice: SentenceLattice | None = None


class Featurizer:
    """Characters -> ids. `units` is the single definition of what the model sees; the vocabularies
    are counted over `units` of the training sentences (`build`) and `example` looks the same units
    up, so the two can never disagree."""

    def __init__(self, chars: Vocab, bichars: Vocab, tags: list[str], words: Vocab | None = None,
                 lexicon: Lexicon | None = None, *, normalize: bool = False, use_bichars: bool = True,
                 max_words: int | None = None, drop: str = "longest_first", lm_vocab=None, span_head: bool = False):
        self.chars, self.bichars, self.tags, self.words, self.lexicon = chars, bichars, tags, words, lexicon
        # a language model's character vocabulary (nerkit.pretrained: LMVocab, a stack's StackedVocab), or None
        self.lm_vocab = lm_vocab
        self.normalize, self.use_bichars, self.max_words, self.drop = normalize, use_bichars, max_words, drop
        self.tag_index = {t: i for i, t in enumerate(tags)}
        self.scheme = detect_scheme(tags)
        # The span head learns from spans (nested ones too), not tags; its types in the model's order.
        self.span_head = span_head
        self.types = sorted({split_tag(t)[1] for t in tags if t != "O"})
        self.counts: dict[str, Counter] = {}  # by kind, the training tokens `build` counted

    @classmethod
    def from_config(cls, config, chars: Vocab, bichars: Vocab, tags: list[str], words: Vocab | None = None,
                    lexicon: Lexicon | None = None, lm_vocab=None) -> "Featurizer":
        return cls(chars, bichars, tags, words, lexicon, normalize=config.data.normalize,
                   use_bichars=config.embeddings.width("bichar") > 0, max_words=config.lexicon.max_words,
                   drop=config.lexicon.drop, lm_vocab=lm_vocab, span_head=not head_traits(config).has_tags)

    @classmethod
    def build(cls, config, sentences: list[Sentence], tags: list[str], lexicon: Lexicon | None = None,
              lm_vocab=None, extra: dict[str, list[str]] | None = None) -> "Featurizer":
        """Vocabularies counted over the training sentences (never dev or test text); `lexicon` is
        given for an encoder that reads the lattice, `lm_vocab` for language-model features.
        `extra`: tokens by kind (char, bichar, word) that join after the training ones, in order:
        the rows of pretrained vector files, kept whether or not training saw them."""
        counting = cls.from_config(config, Vocab([]), Vocab([]), tags, Vocab([]) if lexicon is not None else None, lexicon)
        char_counts, bichar_counts, word_counts = Counter(), Counter(), Counter()
        for sent in sentences:
            units = counting.units(sent.tokens)
            char_counts.update(units.chars)
            bichar_counts.update(units.bichars)
            if units.lattice is not None:
                word_counts.update(units.lattice.words)
        emb, extra = config.embeddings, extra or {}
        chars = Vocab.build(char_counts, emb.min_freq).extended(extra.get("char", ()))
        bichars = Vocab.build(bichar_counts, emb.bichar_min_freq).extended(extra.get("bichar", ())) \
            if emb.width("bichar") else Vocab([])
        words = Vocab.build(word_counts, 1).extended(extra.get("word", ())) if lexicon is not None else None
        built = cls.from_config(config, chars, bichars, tags, words, lexicon, lm_vocab)
        built.counts = {"char": char_counts, "bichar": bichar_counts, "word": word_counts}  # for coverage reports
        return built

    def units(self, tokens: list[str]) -> Units:
        chars = [SPACE if c.isspace() else normalize_char(c) if self.normalize else c for c in tokens]
        lattice = None
        if self.lexicon is not None:
            lattice = build_lattice("".join(chars), self.lexicon, self.max_words, self.drop)
        return Units(chars, bigrams(chars) if self.use_bichars else [], lattice)

    def example(self, tokens: list[str], tags: list[str] | None = None) -> Example:
        units = self.units(tokens)
        ex = Example(self.chars.ids(units.chars),
                     self.bichars.ids(units.bichars) if self.use_bichars else [0] * len(units.chars))
        if tags is not None:
            ex.tag_ids = [self.tag_index[t] for t in tags]
        if units.lattice is not None:
            ex.word_ids = self.words.ids(units.lattice.words)
            ex.word_heads, ex.word_tails = units.lattice.word_heads, units.lattice.word_tails
        if self.lm_vocab is not None:  # the LM sees the text as given: it has its own case and width folding
            ex.lm_ids = self.lm_vocab.ids(tokens)
        return ex

    def training_example(self, sentence: Sentence) -> Example:
        """A gold sentence as ids: its tags in the model's scheme, or for the span head its spans;
        a partially annotated one (`Sentence.unknown`) also says which characters are `known`."""
        if self.span_head:  # every gold span, nested or not, as (type, start, width - 1)
            example = self.example(sentence.tokens)
            index = {t: k for k, t in enumerate(self.types)}
            example.spans = [(index[s.type], s.start, s.end - s.start - 1) for s in sentence.spans()]
        else:  # an unknown region's placeholder O tags are never read: the CRF allows every tag there
            example = self.example(sentence.tokens, spans_to_tags(len(sentence), sentence.spans(), self.scheme))
        if sentence.partial:
            example.known = sentence.known()
        return example

    def sizes(self) -> dict:
        """The table sizes the model is built with."""
        return {"num_chars": len(self.chars), "num_bichars": len(self.bichars), "tags": self.tags,
                "num_words": len(self.words) if self.words is not None else 0}

    def to_json(self) -> dict:
        return {"chars": self.chars.tokens, "bichars": self.bichars.tokens, "tags": self.tags,
                "words": self.words.tokens if self.words is not None else None}

    def with_lm_vocab(self, lm_vocab) -> "Featurizer":
        """This featuriser, giving each example a language model's ids too (`lm_vocab.ids(chars)`)."""
        other = copy.copy(self)
        other.lm_vocab = lm_vocab
        return other

    @classmethod
    def from_json(cls, config, vocab: dict, lexicon: Lexicon | None, where: str, lm_vocab=None) -> "Featurizer":
        try:
            chars, bichars, tags = Vocab(vocab["chars"]), Vocab(vocab["bichars"]), list(vocab["tags"])
            words = Vocab(vocab["words"]) if vocab.get("words") is not None else None
        except (KeyError, TypeError):
            raise ModelDirError("vocab.json lacks chars, bichars or tags", where=where) from None
        return cls.from_config(config, chars, bichars, tags, words, lexicon, lm_vocab)


@dataclass
class Example:
    """One sentence as ids, ready to batch."""

    char_ids: list[int]
    bichar_ids: list[int]
    tag_ids: list[int] | None = None
    word_ids: list[int] | None = None  # lattice words (FLAT), after the characters
    word_heads: list[int] | None = None
    word_tails: list[int] | None = None
    # one language-model token per character; stacked sources (nerkit.pretrained.stacked): a tuple, one row each
    lm_ids: list[int] | tuple[list[int], ...] | None = None
    # (T, S, D) a frozen LM's cached layer states, instead of running it; stacked: a tuple, None where a source runs
    lm_states: torch.Tensor | tuple[torch.Tensor | None, ...] | None = None
    spans: list[tuple[int, int, int]] | None = None  # the span head's gold: (type, start, width - 1)
    known: list[bool] | None = None  # partial annotation: per character, whether it is annotated (None: all)
    # A corpus labelled for some types only (a grown model's, nerkit.training.grow): the tags each
    # character may take (T, K) bool; the source model's marginals over its tags, in this model's tag
    # order (T, K) float16, a row of zeros where they are not a target; the span head's cells of a type
    # that are no negative, as (type, start, width - 1)
    allowed: torch.Tensor | None = None
    teacher: torch.Tensor | None = None
    unsure: list[tuple[int, int, int]] | None = None

    def __len__(self) -> int:
        return len(self.char_ids)
