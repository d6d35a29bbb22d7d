"""The corpora a config names, read for training: train (long sentences split where no entity is
cut), dev (its own file, or a seeded slice carved from train, as MSRA has none; in contiguous
blocks with `data.context: document`) and test (scored once at the end, never used for
selection), with their entity types, tag scheme and checksums."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from nerkit.config import Config, head_traits
from nerkit.data.corpus import REPAIR_OPTION, read_corpus, refuse_nested, refuse_partial
from nerkit.data.documents import contiguous_dev_split, documents
from nerkit.data.matching import hide_entities
from nerkit.data.nesting import FLAT_RULES
from nerkit.data.records import Corpus, Sentence, flatten, unknown_regions
from nerkit.data.stats import sha256_file
from nerkit.data.tags import continues
from nerkit.data.text import SPACE, split_sentence
from nerkit.errors import UserError
from nerkit.files import check_input

log = logging.getLogger(__name__)


@dataclass
class Splits:
    train: list[Sentence]
    dev: list[Sentence]
    test: list[Sentence] | None
    types: list[str]
    scheme: str
    checksums: dict


def seeded_dev_split(sentences: list[Sentence], fraction: float, seed: int) -> tuple[list[Sentence], list[Sentence]]:
    """Carve a reproducible dev set from training sentences (MSRA has no dev set)."""
    order = list(range(len(sentences)))
    random.Random(seed).shuffle(order)
    n_dev = max(1, round(fraction * len(sentences)))
    dev_idx = set(order[:n_dev])
    train = [s for i, s in enumerate(sentences) if i not in dev_idx]
    dev = [s for i, s in enumerate(sentences) if i in dev_idx]
    return train, dev


def insert_spaces(sentences: list[Sentence], rate: float, seed: int) -> list[Sentence]:
    """Training sentences with a SPACE token (tag O) in each gap between characters, and at either
    end, that no entity crosses, with probability `rate` per gap (seeded: the same on a resume).
    Char-per-line corpora hold no spaces, so a model would meet its first at prediction; here it
    learns that a space is outside every entity and that names stop before one. Entities keep
    their characters, and dev and test are left as they are."""
    rnd = random.Random(seed)
    spaced = []
    for sent in sentences:
        tokens, tags, known = [], [], []
        was_known = sent.known()
        for i, (token, tag) in enumerate(zip(sent.tokens + [None], sent.tags + [None])):
            outside = tag is None or not continues(tag)  # no entity crosses the gap
            # a gap inside an unknown region, or at its edge, is left alone: a space there is no known O
            annotated = (i == 0 or was_known[i - 1]) and (i == len(sent) or was_known[i])
            if outside and rnd.random() < rate and annotated:
                tokens.append(SPACE)
                tags.append("O")
                known.append(True)
            if token is not None:
                tokens.append(token)
                tags.append(tag)
                known.append(was_known[i])
        spaced.append(Sentence(tokens, tags, sent.line, sent.document, unknown=unknown_regions(known)))
    return spaced


TRAIN_REPAIR_OPTION = "set data.repair: true (--set data.repair=true)"  # how a training run asks for repair


def flat_training(sentences: list[Sentence], corpus: Corpus, flat: str) -> list[Sentence]:
    """The training sentences a CRF can learn from: a nested corpus is refused unless `flat`
    (data.flat) projects it, and what the projection dropped is logged."""
    if flat == "none":
        refuse_nested(sentences, corpus.path, corpus.format, "a CRF head tags each character once",
                      "train on a flat projection: data.flat: outer (the longest entity of each overlap) or inner "
                      "(the shortest), e.g. --set data.flat=outer; or the span head, model.head: span (--set model.head=span)")
        return sentences
    sentences, dropped = flatten(sentences, flat)
    if dropped:
        log.info(f"{corpus.path}: dropped {dropped:,} overlapping entities from training (data.flat: {flat} "
                 f"{FLAT_RULES[flat]})")
    return sentences


def log_pieces(sentences: int, pieces: list[Sentence], max_len: int) -> None:
    """Say how many pieces `data.max_len` cut the training sentences into, and those kept longer:
    a piece that holds an entity longer than max_len is as long as the entity needs."""
    longer = [len(p) for p in pieces if max_len and len(p) > max_len]
    if len(pieces) == sentences and not longer:
        return
    kept = (f" ({len(longer):,} kept longer to keep an entity whole, the longest {max(longer):,})" if longer else "")
    log.info(f"train: {sentences:,} sentences split into {len(pieces):,} pieces of at most {max_len} characters{kept}")


def log_too_wide(sentences: list[Sentence], max_width: int, path: str) -> None:
    """The span head scores spans of at most `span.max_width` characters (nerkit.model.span): say how
    many training entities are longer, and so left out of its loss (and never predicted)."""
    wide = [sp.end - sp.start for s in sentences for sp in s.spans() if sp.end - sp.start > max_width]
    if wide:
        log.info(f"{path}: {len(wide):,} training entities longer than span.max_width ({max_width} characters) are "
                 f"left out of the span head's loss, the longest {max(wide):,}; raise span.max_width to learn them")


def read_gold(path: str, repair: bool, repair_option: str = REPAIR_OPTION, limit: int = 0) -> Corpus:
    """A corpus file, its nested entities kept (gold is scored as written; training projects them,
    `flat_training`); the tags `repair` fixed and the tokens it split are logged, never silent.
    `repair_option` and `limit`: as read_corpus's."""
    corpus = read_corpus(path, repair=repair, repair_option=repair_option, flat="none", limit=limit)
    if corpus.repaired:
        log.info(f"{path}: repaired {corpus.repaired} tags in {corpus.invalid_transitions} invalid transitions")
    if corpus.split_tokens:
        log.info(f"{path}: split {corpus.split_tokens} tokens of several characters into their characters")
    return corpus


def partial_training(train: list[Sentence], config: Config) -> None:
    """Say how much of the training data is partially annotated (Sentence.unknown), and refuse what
    cannot learn from it: document streams carry no unknown regions."""
    partial = [s for s in train if s.partial]
    if not partial:
        return
    unknown = sum(e - s for sent in partial for s, e in sent.unknown)
    if config.data.context == "document":
        raise UserError(f"{len(partial):,} training sentences have unknown regions, which data.context: document "
                        "cannot learn from", where=config.data.train_extra or config.data.train,
                        fix="set data.context: sentence, or give complete annotation")
    how = ("read as unlabelled: span.negative_sampling draws the negatives" if config.span.negative_sampling
           and not head_traits(config).has_tags else "left out of the loss (partial-label training)")
    log.info(f"train: {len(partial):,} sentences partially annotated, {unknown:,} characters unknown, {how}")


def check_data_files(config: Config, keys: tuple[str, ...] = ("train", "dev", "test"), fix: str | None = None) -> None:
    """Raise a UserError now if a corpus the config names (data.train, dev, test: `keys`) is not a
    readable file: a run looks before it reads, and a missing test file costs no wait for train.
    `fix`: what to do instead of the default (check the path, or `--set` it)."""
    dc = config.data
    if not dc.train:
        raise UserError("data.train is not set", fix="name the training file in the config's data section")
    for key in keys:
        path = getattr(dc, key)
        if path:
            check_input(path, f"data.{key}", "no such file",
                        fix=fix or f"check the path (and NERKIT_DATA), or give it with --set data.{key}=PATH")


def train_and_dev(config: Config) -> tuple[Corpus, list[Sentence], list[Sentence]]:
    """The training corpus, and its sentences as training takes them (`data.limit`, then the dev
    carve-out where `data.dev` is not set, from its completely annotated sentences) with the dev split:
    the one place the carve is made, so that what is mined from the training text (`nerkit lexicon
    build --config`) is what trains."""
    dc = config.data
    # with data.limit a char-per-line file is read up to its limit: the scheme and types are those
    # of the sentences read (their entities hold the E-/S- or M- tags that tell the scheme)
    train_corpus = read_gold(dc.train, dc.repair, TRAIN_REPAIR_OPTION, limit=dc.limit)
    train = [s for s in train_corpus.sentences if len(s)]  # an empty JSON-lines text has nothing to learn
    if dc.limit:
        train = train[: dc.limit]
    if dc.dev:
        dev = read_gold(dc.dev, dc.repair, TRAIN_REPAIR_OPTION)
        refuse_partial(dev, role="dev set")  # an epoch chosen on it would be scored against missing gold
        return train_corpus, train, dev.sentences
    if dc.dev_split <= 0:
        raise UserError("no dev data: data.dev is not set and data.dev_split is 0",
                        fix="set data.dev, or data.dev_split (e.g. 0.05) to carve a dev set from train")
    carve = contiguous_dev_split if dc.context == "document" else seeded_dev_split
    # dev is carved from the completely annotated sentences only: it is scored
    partial = [s for s in train if s.partial]
    if partial and len(partial) == len(train):
        raise UserError("every training sentence has unknown regions, so no dev set can be carved from it",
                        where=dc.train, fix="set data.dev to a completely annotated file")
    train, dev = carve([s for s in train if not s.partial], dc.dev_split, dc.split_seed)
    train += partial
    blocks = f", {len(documents(dev))} contiguous blocks" if dc.context == "document" else ""
    log.info(f"dev: {len(dev)} sentences carved from {dc.train} (seed {dc.split_seed}, {dc.dev_split:.0%}{blocks})")
    return train_corpus, train, dev


def read_splits(config: Config) -> Splits:
    dc = config.data
    check_data_files(config, ("train", "train_extra", "dev", "test"))
    train_corpus, train, dev = train_and_dev(config)
    test = None
    if dc.test:
        test_corpus = read_gold(dc.test, dc.repair, TRAIN_REPAIR_OPTION)
        refuse_partial(test_corpus, role="test set")
        test = test_corpus.sentences
    if dc.hide_entities:
        before = sum(len(s.spans()) for s in train)
        train = hide_entities(train, dc.hide_entities, dc.split_seed)
        hidden = before - sum(len(s.spans()) for s in train)
        log.info(f"train: {hidden:,} entities hidden (read as O) to simulate missed annotation "
                 f"(data.hide_entities = {dc.hide_entities:g}, seed {dc.split_seed})")
    if dc.train_extra:
        extra = [s for s in read_gold(dc.train_extra, dc.repair, TRAIN_REPAIR_OPTION).sentences if len(s)]
        log.info(f"train: {len(extra):,} sentences of {dc.train_extra} added (data.train_extra)")
        train = train + extra
    partial_training(train, config)
    if head_traits(config).has_tags or dc.flat != "none":  # a head without tags learns nested entities as they are
        train = flat_training(train, train_corpus, dc.flat)  # dev and test stay as written (nested gold)
    if dc.insert_spaces:
        before = sum(len(s) for s in train)
        train = insert_spaces(train, dc.insert_spaces, dc.split_seed)
        log.info(f"train: {sum(len(s) for s in train) - before:,} space tokens inserted "
                 f"(data.insert_spaces = {dc.insert_spaces})")
    # In document context a long sentence is read as consecutive segments (nerkit.data.documents):
    # data.max_len cuts nothing.
    max_len = 0 if dc.context == "document" else dc.max_len
    pieces = [p for s in train for p in split_sentence(s, max_len)]
    log_pieces(len(train), pieces, max_len)
    if not head_traits(config).has_tags:
        log_too_wide(pieces, config.span.max_width, dc.train)
    types = sorted({sp.type for s in train for sp in s.spans()})
    scheme = train_corpus.scheme if dc.scheme == "auto" else dc.scheme
    if not types:
        raise UserError("the training data has no entities", where=dc.train)
    checksums = {name: sha256_file(path) for name, path in (("train", dc.train), ("train_extra", dc.train_extra),
                                                             ("dev", dc.dev), ("test", dc.test)) if path}
    return Splits(pieces, dev, test, types, scheme, checksums)
