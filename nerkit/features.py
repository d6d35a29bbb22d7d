"""Features: the one place text becomes model input. `Featurizer` turns a sentence's characters
into character, character-bigram ("bichar") and lexicon-word ids (normalisation and the FLAT
lattice included), and counts the vocabularies from training text through the very same steps;
then length-bucketed batches of tensors with a bool mask, and pretrained word2vec-format vectors."""

from __future__ import annotations

import gzip
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from nerkit.corpus import Sentence, detect_scheme, normalize_char, spans_to_tags
from nerkit.errors import ModelDirError, UserError
from nerkit.lexicon import Lexicon, SentenceLattice, build_lattice

PAD, UNK = "<pad>", "<unk>"
END = "</s>"  # bigram end marker: the last character's bigram is c[n-1] + END


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

    def ids(self, tokens) -> list[int]:
        get = self.index.get
        return [get(t, 1) for t in tokens]

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: str) -> bool:
        return token in self.index


def bigrams(chars: list[str]) -> list[str]:
    return [a + b for a, b in zip(chars, chars[1:] + [END])]


def load_vectors(path: str | Path, vocab: Vocab, dim: int) -> tuple[torch.Tensor | None, int]:
    """Rows of `vocab` found in a word2vec text file (`.gz` allowed, header line optional).

    Returns a (len(vocab), dim) tensor whose missing rows are random, and how many were found."""
    path = Path(path)
    if not path.exists():
        raise UserError("pretrained vector file not found", where=str(path),
                        fix="check embeddings.*_vectors in the config, or remove it for random init")
    opener = gzip.open if path.suffix == ".gz" else open
    table = torch.empty(len(vocab), dim).normal_(0.0, dim ** -0.5)
    table[0] = 0.0
    found = 0
    with opener(path, "rt", encoding="utf-8", errors="strict") as f:
        try:
            for number, line in enumerate(f, 1):
                parts = line.rstrip("\n").rstrip(" ").split(" ")
                if number == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                    continue  # "N D" header
                if len(parts) < 2:
                    continue
                word, values = parts[0], parts[1:]
                if len(values) != dim:
                    raise UserError(f"vector of dimension {len(values)}, expected {dim}", where=f"{path}:{number}",
                                    fix="set embeddings.*_dim to the file's dimension")
                row = vocab.index.get(word)
                if row is None or row == 0:
                    continue
                try:
                    table[row] = torch.tensor([float(v) for v in values])
                except ValueError:
                    raise UserError("a vector value is not a number", where=f"{path}:{number}") from None
                found += 1
        except UnicodeDecodeError:
            raise UserError("the vector file is not UTF-8 text", where=str(path)) from None
    return table, found


@dataclass
class Units:
    """What a sentence is made of, as the model sees it: normalised characters, their bigrams and,
    for a lattice encoder, the lexicon words matched in the normalised text."""

    chars: list[str]
    bichars: list[str]
    lattice: SentenceLattice | None = None


class Featurizer:
    """Characters -> ids. `units` is the single definition of what the model sees; the vocabularies
    are counted over `units` of the training sentences (`build`) and `example` looks the same units
    up, so the two can never disagree."""

    def __init__(self, chars: Vocab, bichars: Vocab, tags: list[str], words: Vocab | None = None,
                 lexicon: Lexicon | None = None, *, normalize: bool = False, use_bichars: bool = True,
                 max_words: int | None = None, drop: str = "longest_first"):
        self.chars, self.bichars, self.tags, self.words, self.lexicon = chars, bichars, tags, words, lexicon
        self.normalize, self.use_bichars, self.max_words, self.drop = normalize, use_bichars, max_words, drop
        self.tag_index = {t: i for i, t in enumerate(tags)}
        self.scheme = detect_scheme(tags)

    @classmethod
    def from_config(cls, config, chars: Vocab, bichars: Vocab, tags: list[str], words: Vocab | None = None,
                    lexicon: Lexicon | None = None) -> "Featurizer":
        return cls(chars, bichars, tags, words, lexicon, normalize=config.data.normalize,
                   use_bichars=config.embeddings.bichar_dim > 0, max_words=config.lexicon.max_words,
                   drop=config.lexicon.drop)

    @classmethod
    def build(cls, config, sentences: list[Sentence], tags: list[str], lexicon: Lexicon | None = None) -> "Featurizer":
        """Vocabularies counted over the training sentences (never dev or test text); `lexicon` is
        given for an encoder that reads the lattice."""
        counting = cls.from_config(config, Vocab([]), Vocab([]), tags, Vocab([]) if lexicon else None, lexicon)
        char_counts, bichar_counts, word_counts = Counter(), Counter(), Counter()
        for sent in sentences:
            units = counting.units(sent.tokens)
            char_counts.update(units.chars)
            bichar_counts.update(units.bichars)
            if units.lattice is not None:
                word_counts.update(units.lattice.words)
        emb = config.embeddings
        return cls.from_config(config, Vocab.build(char_counts, emb.min_freq),
                               Vocab.build(bichar_counts, emb.bichar_min_freq) if emb.bichar_dim else Vocab([]),
                               tags, Vocab.build(word_counts, 1) if lexicon else None, lexicon)

    def units(self, tokens: list[str]) -> Units:
        chars = [normalize_char(c) for c in tokens] if self.normalize else list(tokens)
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
        return ex

    def training_example(self, sentence: Sentence) -> Example:
        return self.example(sentence.tokens, spans_to_tags(len(sentence), sentence.spans(), self.scheme))

    def sizes(self) -> dict:
        """The table sizes the model is built with."""
        return {"num_chars": len(self.chars), "num_bichars": len(self.bichars), "tags": self.tags,
                "num_words": len(self.words) if self.words is not None else 0}

    def to_json(self) -> dict:
        return {"chars": self.chars.tokens, "bichars": self.bichars.tokens, "tags": self.tags,
                "words": self.words.tokens if self.words is not None else None}

    @classmethod
    def from_json(cls, config, vocab: dict, lexicon: Lexicon | None, where: str) -> "Featurizer":
        try:
            chars, bichars, tags = Vocab(vocab["chars"]), Vocab(vocab["bichars"]), list(vocab["tags"])
            words = Vocab(vocab["words"]) if vocab.get("words") is not None else None
        except (KeyError, TypeError):
            raise ModelDirError("vocab.json lacks chars, bichars or tags", where=where) from None
        return cls.from_config(config, chars, bichars, tags, words, lexicon)


@dataclass
class Example:
    """One sentence as ids, ready to batch."""

    char_ids: list[int]
    bichar_ids: list[int]
    tag_ids: list[int] | None = None
    word_ids: list[int] | None = None  # lattice words (FLAT), after the characters
    word_heads: list[int] | None = None
    word_tails: list[int] | None = None

    def __len__(self) -> int:
        return len(self.char_ids)


@dataclass
class Batch:
    char_ids: torch.Tensor  # (B, T)
    bichar_ids: torch.Tensor  # (B, T)
    mask: torch.Tensor  # (B, T) bool, True at real characters, left-aligned
    tag_ids: torch.Tensor | None = None  # (B, T)
    word_ids: torch.Tensor | None = None  # (B, W)
    word_heads: torch.Tensor | None = None  # (B, W)
    word_tails: torch.Tensor | None = None  # (B, W)
    word_mask: torch.Tensor | None = None  # (B, W) bool

    def to(self, device) -> "Batch":
        return Batch(**{k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
                        for k, v in self.__dict__.items()})

    @property
    def num_chars(self) -> int:
        return int(self.mask.sum())


def _pad(rows: list[list[int]], width: int) -> torch.Tensor:
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long)


def collate(examples: list[Example]) -> Batch:
    width = max(1, max(len(e) for e in examples))
    lengths = torch.tensor([len(e) for e in examples])
    mask = torch.arange(width)[None, :] < lengths[:, None]
    batch = Batch(
        char_ids=_pad([e.char_ids for e in examples], width),
        bichar_ids=_pad([e.bichar_ids for e in examples], width),
        mask=mask,
        tag_ids=_pad([e.tag_ids for e in examples], width) if examples[0].tag_ids is not None else None,
    )
    if examples[0].word_ids is not None:
        words = max(1, max(len(e.word_ids) for e in examples))
        counts = torch.tensor([len(e.word_ids) for e in examples])
        batch.word_ids = _pad([e.word_ids for e in examples], words)
        batch.word_heads = _pad([e.word_heads for e in examples], words)
        batch.word_tails = _pad([e.word_tails for e in examples], words)
        batch.word_mask = torch.arange(words)[None, :] < counts[:, None]
    return batch


def bucketed_batches(lengths: list[int], batch_size: int, rng: random.Random | None = None,
                     bucket_factor: int = 50) -> list[list[int]]:
    """Index batches of similar lengths (little padding). With `rng`, the order is shuffled:
    examples within pools of `bucket_factor` batches, then the batches themselves."""
    order = list(range(len(lengths)))
    if rng is not None:
        rng.shuffle(order)
    pool = batch_size * bucket_factor
    batches = []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start:start + pool], key=lambda i: lengths[i])
        batches.extend(chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size))
    if rng is not None:
        rng.shuffle(batches)
    return batches
