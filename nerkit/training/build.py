"""Building a pipeline from training data: vocabularies counted through the featuriser, the lexicon,
the language model, pretrained vector rows copied into the embedding tables, and the tagger."""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from nerkit.config import Config
from nerkit.data.records import Sentence
from nerkit.data.splits import Splits
from nerkit.data.tags import scheme_tags
from nerkit.features.featurizer import Featurizer
from nerkit.inference.pipeline import Pipeline
from nerkit.model.encoders import ENCODERS
from nerkit.pretrained.vectors import coverage, normalize_rows

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------ the parts of a run


def build_pipeline(config: Config, splits: Splits, device: torch.device | str = "cpu",
                   unlabelled: list[list[str]] = ()) -> Pipeline:
    """A new model for the training data: vocabularies counted on train (never dev or test) and
    extended by the rows of pretrained vector files (`embeddings.vectors_keep: all`), the lexicon for
    a lattice encoder, a language model's features, the pretrained vectors in their tables, and
    the longest training sentence (`Pipeline.train_max_len`). `unlabelled`: sequences of characters
    the model also trains on (`nerkit distill`'s text), counted into the vocabularies as train is,
    but a training sentence read again as text (its own training text) only once.
    Table widths the config leaves out are the vector files': the pipeline holds a copy of `config`
    with them resolved (the one its model directory saves); `config` itself is left as it is."""
    vectors, config = read_pretrained(config, lattice=ENCODERS[config.encoder.name].uses_lattice)
    emb = config.embeddings
    lexicon = None
    if ENCODERS[config.encoder.name].uses_lattice:
        from nerkit.features.lexicon import Lexicon

        lexicon = Lexicon.from_config(config.lexicon)
    lm = None
    if emb.lm_sources():
        from nerkit.pretrained.loading import load_sources

        lm = load_sources(emb.lm_sources())
        for source, options in zip(lm.sources, emb.lm_sources()):
            log.info(f"language model {options.path}: {source.output_dim} features per character, "
                     f"{'fine-tuned' if options.finetune else 'frozen'}, layers {options.layers}")
    extra = {kind: v.words for kind, v in vectors.items()} if emb.vectors_keep == "all" else {}
    seen = {tuple(s.tokens) for s in splits.train}
    text = [Sentence(list(u)) for u in unlabelled if tuple(u) not in seen]
    featurizer = Featurizer.build(config, [*splits.train, *text], scheme_tags(splits.types, splits.scheme), lexicon,
                                  extra=extra)
    if lexicon is not None:
        log.info(f"lexicon: {len(lexicon)} words; {len(featurizer.counts['word'])} of them occur in the training data")
    pipe = Pipeline(config, featurizer, device, lm)
    # The longest sentence the model trains on (train's pieces): its default prediction window.
    pipe.train_max_len = max((len(s) for s in [*splits.train, *unlabelled]), default=0) or None
    vocabs = {"char": featurizer.chars, "bichar": featurizer.bichars, "word": featurizer.words}
    for kind, found in vectors.items():
        vocab, rows = vocabs[kind], found.index()
        hits = [(i, rows[token]) for i, token in enumerate(vocab.tokens) if i > 1 and token in rows]
        matrix = normalize_rows(found.matrix) if emb.vectors_normalize else found.matrix
        ids, source = zip(*hits) if hits else ((), ())
        pipe.model.load_rows(kind, list(ids), torch.from_numpy(matrix[list(source)]), freeze=emb.freeze)
        log.info(f"{kind} vectors {found.path}: {len(hits):,} of {len(vocab) - 2:,} table rows pretrained; "
                 f"training {kind}s with a vector: {coverage(featurizer.counts[kind], rows)}")
    return pipe


def read_pretrained(config: Config, lattice: bool) -> tuple[dict, Config]:
    """The vector files the config names (by kind: char, bichar, word), and a copy of the config
    with the tables' widths taken from them: a width the config sets must be the file's."""
    from nerkit.data.word2vec import read_vectors
    from nerkit.pretrained.vectors import check_dim

    emb, found, widths = config.embeddings, {}, {}
    for kind, path in vector_files(config, lattice).items():
        found[kind] = read_vectors(path)
        check_dim(found[kind], getattr(emb, f"{kind}_dim"), f"embeddings.{kind}_dim")
        widths[f"{kind}_dim"] = found[kind].dim
    return found, replace(config, embeddings=replace(emb, **widths))


def vector_files(config: Config, lattice: bool) -> dict[str, str]:
    """The vector files a run reads, by kind (char, bichar, word): those the config names for a table
    the model has (words only with a `lattice` encoder)."""
    emb = config.embeddings
    paths = {kind: getattr(emb, f"{kind}_vectors") for kind in ("char", "bichar", "word")}
    return {kind: path for kind, path in paths.items()
            if path and (kind != "word" or lattice) and emb.width(kind) != 0}


def check_pretrained_files(config: Config) -> None:
    """Raise a UserError now if a pretrained input the run would read is not there, or its first
    lines are not in its format: its vector files, its language model's directory, a lattice
    encoder's lexicon file. A run looks before it reads its data, and `nerkit train --dry-run` looks
    too."""
    from nerkit.files import check_input
    from nerkit.pretrained.bert import FETCH_FIX
    from nerkit.pretrained.hub_cache import lm_directory
    from nerkit.data.word2vec import check_vector_file

    lattice = ENCODERS[config.encoder.name].uses_lattice
    for kind, path in vector_files(config, lattice).items():
        check_input(path, f"embeddings.{kind}_vectors", "vector file not found",
                    fix="check the path; `make vectors` builds the benchmark configs' vectors/")
        check_vector_file(path, f"embeddings.{kind}_vectors")
    for k, source in enumerate(config.embeddings.lm_sources()):
        lm_directory(source.path, f"{config.embeddings.lm_label(k)}.path", FETCH_FIX)
    if lattice and config.lexicon.source != "jieba":
        check_input(config.lexicon.source, "lexicon.source", "lexicon file not found",
                    fix="set lexicon.source to jieba, a word list, or a word2vec vector file")
        from nerkit.features.lexicon import check_source_file

        check_source_file(config.lexicon.source, "lexicon.source")
