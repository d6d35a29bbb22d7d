"""The configuration's schema: typed dataclasses, one per YAML section, each field's type, default,
choices (a `Literal`), range and duration (its metadata) and meaning (its comment, which
scripts/config_reference.py prints in docs/config.md); `load_config` and `build_config`, which read a
file through nerkit.typed_yaml and check the rules between fields.

The `encoder` section is `name:` plus the fields of that encoder's options (ENCODER_OPTIONS). This is
the only place a config is checked: every name and choice is validated here, when the file loads,
and loading imports nothing heavy (no torch).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import yaml

from nerkit.errors import ConfigError, did_you_mean
from nerkit.typed_yaml import (
    ANY_AMOUNT,
    coerce,
    fill,
    item_label,
    override_origin,
    parse_override,
    ranged,
    read_yaml,
    set_path,
    suggest,
)

# ------------------------------------------------------------------------------ choices
# Each is the one definition of its values: the fields below take them as `Literal[...]`, and the
# modules that act on them (and the command line) import them from here.
SCHEMES = ("bio", "bioes", "bmes")  # the tag schemes (nerkit.data.tags)
CONTEXTS = ("sentence", "document")  # data.context: what a training sequence reads
FLATS = ("none", "outer", "inner")  # data.flat and `--flat`: nerkit.data.nesting's flat projections
LM_LAYERS = ("last", "mix")  # which of a language model's layers become features
VECTORS_KEEP = ("all", "train")  # which rows of a pretrained vector file join the vocabulary
INITS = ("normal", "scaled")  # how embeddings without pretrained vectors start
DROP_POLICIES = ("longest_first", "frequency")  # which lexicon words go over max_words (nerkit.features.lexicon)
ABSOLUTE_ATTENTIONS = ("absolute", "learned")  # positions added to the input: the same in every segment
# Scores that depend on i - j (nerkit.model.encoders.relative.VARIANTS says how each computes them)
RELATIVE_ATTENTIONS = ("tener", "xl", "shaw", "rope", "alibi")
ATTENTIONS = ABSOLUTE_ATTENTIONS + RELATIVE_ATTENTIONS
FUSIONS = ("four", "two")  # FLAT's relative distances (nerkit.model.encoders.flat)


@dataclass(frozen=True)
class HeadTraits:
    """What a head can do, for every caller to ask instead of its name (torch-free: the config's
    rules, the featuriser, the splits and the predictor that ONNX Runtime shares read it too);
    nerkit.model.heads.HEADS gives each name its class, which carries the same traits."""

    has_tags: bool  # one tag per character in data.scheme, trained on tags, windows stitched as tags; else spans of types, nested allowed
    supports_marginals: bool  # per-character tag marginals: a temperature to calibrate, a teacher or student to distil
    has_threshold: bool  # predicts the spans above a probability threshold, which dev and calibration choose
    reads_memory: bool  # can read a stream through Transformer-XL's memory (encoder.memory)
    export_outputs: tuple[str, ...]  # the outputs of its ONNX graph
    options: str  # its config section (its options and their rules)


# model.head: what turns the encoder's output into entities (nerkit.model.heads), the one list of head names
HEAD_TRAITS = {
    "crf": HeadTraits(has_tags=True, supports_marginals=True, has_threshold=False, reads_memory=True,
                      export_outputs=("tag_ids", "emissions"), options="crf"),
    "span": HeadTraits(has_tags=False, supports_marginals=False, has_threshold=True, reads_memory=False,
                       export_outputs=("band",), options="span"),
}
HEADS = tuple(HEAD_TRAITS)
CRF_ALGORITHMS = ("auto", "loop", "scan")  # the CRF likelihood's forward algorithm (nerkit.model.crf)
OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "linear", "inverse_time")
DEVICES = ("auto", "cpu", "cuda")  # auto: the GPU when torch sees one
DISTILL_TARGETS = ("soft", "hard")  # `nerkit distill`: the teachers' marginals, or their best paths
# `nerkit train --from`: the old types' targets, the old model's entities or its marginals, or none (read as O)
GROW_TARGETS = ("hard", "soft", "none")

# Ranges of the numbers that are not ANY_AMOUNT (any finite value from 0 up)
AT_LEAST_ONE = "[1, inf)"  # sizes torch cannot build with 0
POSITIVE = "(0, inf)"
PROBABILITY = "[0, 1)"  # a dropout

# What may change when a run is resumed: how long it goes on and where it runs, nothing that shapes
# the model or the data (with a linear schedule, `epochs` also moves the learning rate).
RESUMABLE = {"resumable": True}


@dataclass
class DataConfig:
    train: str | None = None  # the training corpus: CoNLL (BIO, BIOES or BMES, detected) or JSON lines
    dev: str | None = None  # when absent, a seeded dev split is carved from train
    test: str | None = None  # reported once at the end, never used for selection
    # the fraction of train carved off as dev (seeded by `split_seed`) when `data.dev` is absent
    dev_split: float = ranged(0.05, "[0, 1)")
    split_seed: int = 13  # the seed of the dev split and of `insert_spaces`
    # Longer training sentences are split at punctuation, never inside an entity; prediction reads
    # longer texts in overlapping windows of the longest training sentence, at most max_len
    # (inference.windows; `nerkit predict --window` chooses another).
    max_len: int = 250
    # NFKC, one character for one (full-width ＡＢ１２ -> AB12), on the model's input only: offsets
    # and the entities' text stay the original's. A model directory's config.yaml says what its model
    # was trained with (the benchmark configs and runs from before this default say false).
    normalize: bool = True
    repair: bool = False  # fix invalid tag transitions as conlleval reads them
    # The chance of a space token (tag O) in each gap between training characters that no entity
    # crosses, so that a model trained on text without spaces learns them (splits.insert_spaces).
    # 0 leaves the training data as it is (the benchmark configs and earlier runs); the demo uses it.
    insert_spaces: float = ranged(0.0, "[0, 1]")
    scheme: Literal[("auto", *SCHEMES)] = "auto"  # the scheme the model tags in (auto: the training file's)
    # sentence: each training sentence read alone; document: consecutive sentences of the training
    # file (a `-DOCSTART-` line starts a new document) read as streams in segments of encoder.segment
    # characters, Transformer-XL's memory carried from one to the next (needs encoder.memory;
    # docs/encoders.md). Long sentences are then cut into segments, not at max_len.
    context: Literal[CONTEXTS] = "sentence"
    # What a CRF learns from a nested training corpus (entities that overlap: nerkit.data.nesting),
    # since it tags each character once: none refuses one, naming the fix; outer keeps the longest
    # entity of each overlap, inner the shortest. Dev and test are scored as written, nested
    # entities counted exactly. (Not the FLAT encoder: a flat projection of the data.)
    flat: Literal[FLATS] = "none"
    limit: int = 0  # use only the first N training sentences (0 = all)
    # Another training corpus, read as data.train is and added to its sentences after the dev carve
    # (never carved into dev): e.g. a dictionary's partial annotation beside the gold (docs/partial.md).
    train_extra: str | None = None
    # Simulate a corpus whose annotators missed entities: remove this fraction of data.train's
    # entities at random (seeded by split_seed) before training, each read as O. For benchmarks of
    # span.negative_sampling (configs/bench/partial.yaml); dev, test and train_extra are left as they are.
    hide_entities: float = ranged(0.0, PROBABILITY)


@dataclass
class LMConfig:
    """A pretrained language model as features (`embeddings.lm.*`). `embeddings.lm` may also be a list
    of such mappings, stacked sources (each with its own path, finetune, lr, layer_decay, layers, bf16
    and cache)
    whose features are concatenated per character in list order (nerkit.pretrained.stacked)."""

    path: str | None = None  # a local Hugging Face encoder directory (any fast tokenizer) or LAC's; None: no LM
    finetune: bool = False  # train the LM's weights too (else frozen, its features cached per corpus)
    lr: float = 0.0  # the LM's own learning rate when fine-tuned (0: train.lr)
    # Layer-wise learning-rate decay of a fine-tuned LM: its top layer trains at the LM's
    # rate, each layer below at this times the rate of the layer above, the embeddings lowest (1: one rate)
    layer_decay: float = ranged(1.0, "(0, 1]")
    layers: Literal[LM_LAYERS] = "last"  # last: the top layer; mix: a learned scalar mix of every layer
    bf16: bool = False  # run the LM under bf16 autocast (about twice as fast on CPUs with AVX512-BF16)
    cache: str | None = None  # where frozen features are cached (None: $XDG_CACHE_HOME/nerkit, else ~/.cache/nerkit)


@dataclass
class EmbeddingsConfig:
    # Widths: None takes the vector file's when one is given, else DEFAULT_WIDTHS; a width that
    # disagrees with its vector file is an error naming both.
    char_dim: int | None = None  # 0 turns character embeddings off (a language model's features alone)
    bichar_dim: int | None = None  # 0 turns bigram features off
    word_dim: int | None = None  # lexicon words (FLAT)
    char_vectors: str | None = None  # word2vec text or binary, fastText .vec (.gz allowed)
    # pretrained character-bigram vectors (bigrams as the featuriser makes them: c[i] + c[i+1], the last
    # character + `</s>`)
    bichar_vectors: str | None = None
    word_vectors: str | None = None  # pretrained lexicon-word vectors (FLAT)
    vectors_keep: Literal[VECTORS_KEEP] = "all"  # all: every row of a vector file joins the vocabulary; train: training tokens only
    vectors_normalize: bool = True  # pretrained rows scaled to unit length (TENER's and FLAT's code)
    min_freq: int = 1  # characters seen fewer times in train become `<unk>`
    bichar_min_freq: int = 1  # bigrams seen fewer times in train become `<unk>`
    dropout: float = ranged(0.5, PROBABILITY)  # dropout on the concatenated embeddings (and on FLAT's word embeddings)
    token_dropout: float = ranged(0.0, PROBABILITY)  # a training token becomes <unk> with this probability, so <unk> is learnt
    freeze: bool = False  # keep pretrained vectors fixed
    # Random vectors: `normal` is PyTorch's N(0, 1); `scaled` is U(-sqrt(3/dim), sqrt(3/dim)) (std
    # 1/sqrt(dim), unit-norm-sized vectors), what TENER's and FLAT's code (fastNLP StaticEmbedding)
    # start from; with plain SGD at lr ~1e-3 N(0, 1) vectors barely move.
    init: Literal[INITS] = "normal"
    # one language model (the keys below), or a list of them: stacked sources, each a full mapping,
    # their features joined per character in list order after the character and bigram vectors
    lm: LMConfig | list[LMConfig] = field(default_factory=LMConfig)

    def lm_sources(self) -> list[LMConfig]:
        """The language models whose features join the embeddings, in order: none, one, or a stack."""
        if isinstance(self.lm, list):
            return list(self.lm)
        return [self.lm] if self.lm.path else []

    def lm_label(self, k: int) -> str:
        """How messages name source k of `lm_sources()`: embeddings.lm, or embeddings.lm[k] in a list."""
        return item_label("embeddings.lm", k) if isinstance(self.lm, list) else "embeddings.lm"

    def width(self, kind: str) -> int:
        """The width of the `kind` table (char, bichar, word): as set, else the default."""
        value = getattr(self, f"{kind}_dim")
        return DEFAULT_WIDTHS[kind] if value is None else value


DEFAULT_WIDTHS = {"char": 100, "bichar": 100, "word": 50}


@dataclass
class LexiconConfig:
    source: str = "jieba"  # jieba, the path of a word list, or of a word2vec file (its vocabulary)
    min_len: int = 2  # the shortest word matched into the lattice
    max_len: int = 0  # 0 = no limit (long jieba words are mostly organisation names)
    # words whose frequency in the source (jieba's dictionary, a word list's second column) is below this are
    # dropped; a word without one is kept
    min_freq: int = 0
    max_words: int = 400  # lattice cap: words kept per sentence
    # Over max_words, which words go: longest_first drops the longest first (ties: the latest start);
    # frequency the least frequent in the source first (needs frequencies: jieba, or a counted word list)
    drop: Literal[DROP_POLICIES] = "longest_first"


# ------------------------------------------------------------------- encoders' own options
# Each encoder's section is `name:` plus the fields of its options class; ENCODER_OPTIONS is the one
# list of encoder names (nerkit.model.encoders.ENCODERS gives each its module from it).


@dataclass
class BiLSTMOptions:
    hidden_size: int = ranged(200, AT_LEAST_ONE)  # per direction
    num_layers: int = ranged(1, AT_LEAST_ONE)  # stacked BiLSTM layers
    dropout: float = ranged(0.3, PROBABILITY)  # between stacked layers and on the output


@dataclass
class TransformerOptions:
    # Defaults equal TENER's MSRA setting (fastnlp/TENER, train_tener_cn.py), so that `transformer`
    # and `tener` differ only in how attention sees positions.
    n_heads: int = ranged(6, AT_LEAST_ONE)  # attention heads
    head_dim: int = ranged(80, AT_LEAST_ONE)  # d_model = n_heads * head_dim
    num_layers: int = ranged(2, AT_LEAST_ONE)  # Transformer layers
    ff_ratio: float = ranged(2.0, POSITIVE)  # feed-forward width = ff_ratio * d_model (TENER uses 2; Vaswani used 4)
    dropout: float = ranged(0.15, PROBABILITY)  # on sublayer outputs and inside the feed-forward
    attn_dropout: float = ranged(0.15, PROBABILITY)  # on attention weights (TENER leaves dropout_attn unset: it equals dropout)
    # How attention sees positions: absolute (sinusoids added to the input, Vaswani); learned (a
    # learned row per position added to the input, BERT); or a relative one, whose scores depend on
    # i - j (RELATIVE_ATTENTIONS; docs/encoders.md)
    attention: Literal[ATTENTIONS] = "absolute"
    key_projection: bool | None = None  # None: as the attention's paper (tener: no; the others: yes)
    scale: bool | None = None  # None: as the paper (tener: no; the others: divide by sqrt(head_dim))
    max_relative_distance: int = ranged(16, AT_LEAST_ONE)  # shaw only: distances clipped to [-k, k]
    max_positions: int = ranged(512, AT_LEAST_ONE)  # learned only: rows of the position table, the longest input it reads
    # Transformer-XL's segment recurrence (relative attentions only): a text longer than `segment`
    # characters is read segment by segment, each layer attending over the `memory` positions before
    # the segment (cached, no gradient) as well as the segment itself. 0: off, the whole text at once.
    memory: int = 0
    segment: int = 0  # characters per segment when memory is on


@dataclass
class TenerOptions(TransformerOptions):
    """`tener` is `transformer` under another name, with `attention: tener` as its default (an alias
    kept for the configs that name it)."""

    attention: Literal[ATTENTIONS] = "tener"  # as `transformer`'s `attention`, with `tener` as the default


@dataclass
class FLATOptions:
    # Defaults: the official code (LeeSureman/Flat-Lattice-Transformer, V0/flat_main.py) for MSRA.
    n_heads: int = ranged(8, AT_LEAST_ONE)  # attention heads
    head_dim: int = ranged(20, AT_LEAST_ONE)  # d_model = n_heads * head_dim = 160
    num_layers: int = ranged(1, AT_LEAST_ONE)  # FLAT layers
    ff_ratio: float = ranged(3.0, POSITIVE)  # feed-forward width = ff_ratio * d_model = 480
    dropout: float = ranged(0.15, PROBABILITY)  # inside the feed-forward and on sublayer outputs (official ff_dropout)
    attn_dropout: float = ranged(0.0, PROBABILITY)  # on attention weights
    fusion: Literal[FUSIONS] = "four"  # four: the paper's [P_hh; P_ht; P_th; P_tt]; two: [P_hh; P_tt], the code's default
    key_projection: bool = False  # keys are the node vectors themselves, split into heads (official k_proj)
    scale: bool = False  # logits are not divided by sqrt(head_dim) (official `scaled`)
    attention_chunk: int = 32  # query rows per block of position scores (0 = all at once): bounds memory


@dataclass
class NoEncoderOptions:
    pass  # `encoder.name: none` has nothing to set


ENCODER_OPTIONS = {
    "bilstm": BiLSTMOptions,
    "transformer": TransformerOptions,
    "tener": TenerOptions,
    "flat": FLATOptions,
    "none": NoEncoderOptions,
}


# Names that are another encoder with other defaults: `tener` is `transformer` with attention: tener.
ENCODER_ALIASES = {"tener": "transformer"}


def memory_segment(config: "Config") -> int:
    """The characters a model with Transformer-XL memory reads at a time (`encoder.segment`), or 0
    for a model without memory, which reads a text (or a window of it) at once."""
    options = config.encoder.options
    return options.segment if getattr(options, "memory", 0) else 0


@dataclass
class EncoderConfig:
    name: str = "bilstm"  # which encoder; its options are listed under its name below
    options: Any = None  # an ENCODER_OPTIONS instance (None: that encoder's defaults)

    def __post_init__(self):
        if self.options is None:
            self.options = ENCODER_OPTIONS[self.name]()


@dataclass
class CRFConfig:
    constrain_training: bool = False  # decoding is always constrained; this also masks the likelihood
    dropout: float = ranged(0.0, PROBABILITY)  # on encoder outputs before the emission layer ("output dropout")
    algorithm: Literal[CRF_ALGORITHMS] = "auto"  # likelihood's forward algorithm: scan is log-depth; auto: scan on a GPU

    def check(self, source: str) -> None:
        """The rules between its fields, when the CRF head is the model's: none."""


@dataclass
class ModelConfig:
    head: Literal[HEADS] = "crf"  # crf: one tag per character, entities never overlap; span: nested and overlapping spans (GlobalPointer)


@dataclass
class SpanConfig:
    max_width: int = ranged(32, AT_LEAST_ONE)  # the longest entity scored, in characters (cost: types x length x max_width)
    size: int = ranged(64, AT_LEAST_ONE)  # the width of each type's start and end projections (even: rotary positions)
    threshold: float = ranged(0.5, "(0, 1)")  # a span is predicted when its probability is above this
    # true: after every epoch, training chooses the threshold of best dev F1 (from 0.05 to 0.95) and
    # fits the map of the scores at it, as `nerkit calibrate` does, so epochs are selected, and dev
    # and test reported, at the threshold the saved model predicts with; false: `threshold` throughout
    choose_threshold: bool = True
    # false: every span above the threshold, nested and overlapping; true: the non-overlapping set of
    # them with the largest sum of log-odds (the most probable flat labelling)
    flat: bool = False
    dropout: float = ranged(0.0, PROBABILITY)  # on encoder outputs before the projections
    # For a corpus whose annotators missed entities (or a dictionary's marks): 0 counts every span no
    # entity marks as a negative (outside unknown regions); above 0, only ceil(this x the sentence's
    # length) of them drawn at random each step, unknown regions included (Li et al., ICLR 2021's
    # negative sampling; docs/partial.md)
    negative_sampling: float = ranged(0.0, "[0, 10]")

    def check(self, source: str) -> None:
        """The rules between its fields, when the span head is the model's: rotary positions rotate
        pairs of numbers."""
        if self.size % 2:
            raise ConfigError(f"span.size = {self.size}: rotary positions need an even width", where=source,
                              fix="choose an even span.size, e.g. 64")


@dataclass
class TrainConfig:
    epochs: int = ranged(20, AT_LEAST_ONE, resumable=True)  # the most epochs the run trains
    batch_size: int = ranged(32, AT_LEAST_ONE)  # sentences per optimiser step (with several processes, the global batch they share)
    eval_batch_size: int = ranged(128, AT_LEAST_ONE, resumable=True)  # sentences per batch when scoring dev and test
    optimizer: Literal[OPTIMIZERS] = "adam"  # AdamW decouples weight decay from the gradient
    lr: float = 1e-3  # the learning rate (its peak, after any warm-up)
    momentum: float = 0.9  # SGD's momentum
    weight_decay: float = 0.0  # passed to the optimiser
    # The learning rate rises linearly to `lr` over the first steps: below 1 a fraction of the run's
    # steps (0.1: the first tenth, so a config carries to a corpus of any size), 1 or more a number
    # of steps. 0: no warm-up.
    warmup: float = 0.0
    warmup_steps: int = 0  # the same in steps (older configs); set warmup or warmup_steps, not both
    schedule: Literal[SCHEDULES] = "constant"  # how the learning rate moves after any warm-up
    decay: float = 0.05  # inverse_time: lr / (1 + decay * epoch)
    clip_norm: float = 5.0  # 0 = off
    clip_value: float = 0.0  # 0 = off
    patience: int = ranged(5, ANY_AMOUNT, resumable=True)  # epochs without dev improvement before stopping (0 = never stop early)
    seed: int = 42  # the random seed of initialisation, shuffling and dropout
    device: Literal[DEVICES] = field(default="auto", metadata=RESUMABLE)  # auto: the GPU when torch sees one
    threads: int = ranged(0, ANY_AMOUNT, resumable=True)  # torch intra-op threads (0: the cores free when nerkit starts, nerkit/cores.py)
    max_steps: int = ranged(0, ANY_AMOUNT, resumable=True)  # stop after N optimiser steps (0 = no limit)
    time_budget: float = ranged(0.0, ANY_AMOUNT, duration=True, resumable=True)  # seconds (0 = no limit)
    checkpoint_every: int = ranged(0, ANY_AMOUNT, resumable=True)  # steps between resumable checkpoints (0 = at epoch ends only)
    # With several processes (torchrun, --nproc): how long a rank waits for the others in one
    # collective before it ends the job. Rank 0's dev evaluation must fit in it (the others wait).
    dist_timeout: float = ranged(1800.0, POSITIVE, duration=True, resumable=True)  # seconds


@dataclass
class DistillConfig:
    targets: Literal[DISTILL_TARGETS] = "hard"  # hard: the teachers' best path as a CRF target; soft: KL(teacher marginals || student marginals). hard measured better (docs/distillation.md)
    temperature: float = ranged(1.0, POSITIVE)  # soft targets: teacher and student marginals both at this temperature (loss times T^2)
    weight: float = ranged(1.0, ANY_AMOUNT)  # the distillation loss's weight against the gold likelihood
    ratio: float = ranged(1.0, ANY_AMOUNT)  # unlabelled batches per gold batch in an epoch (the text cycles across epochs)
    window: int = ranged(0, ANY_AMOUNT)  # characters per unlabelled sequence (0: the smallest prediction window of the teachers)
    text_limit: int = ranged(0, ANY_AMOUNT)  # read only the first N lines of each text (0 = all), as data.limit does sentences
    cache: str | None = None  # where teacher targets are cached (None: $XDG_CACHE_HOME/nerkit/distill, else ~/.cache/nerkit/distill)


@dataclass
class GrowConfig:
    # The corpus of data.train labels the new types alone; the model grown keeps the source's types and weights
    source: str | None = None  # the trained model directory to grow (None: an ordinary run); `nerkit train --from DIR` sets it
    # hard: the source model's entities of its own types, merged into the new labels as known tags
    # (a CRF's tags, a span head's spans); soft: its CRF marginals of its types as distillation
    # targets beside the new labels' partial likelihood (a head with marginals); none: no target, every
    # character the corpus does not mark is O for every type (plain fine-tuning: the baseline that forgets)
    targets: Literal[GROW_TARGETS] = "hard"
    weight: float = ranged(1.0, ANY_AMOUNT)  # soft targets: the weight of their KL against the new labels' likelihood
    # L2-SP (Li, Grandvalet & Davoine, ICML 2018): this x the squared distance of every weight the grown
    # model shares with its source from the source's value, added to each batch's loss; the head's new
    # rows stay free. 0: off
    anchor: float = ranged(0.0, "[0, 100]")

    def check(self, source: str) -> None:
        """The rules between its fields, once grow.source is final (`nerkit train --from` sets it after
        the file loads): an anchor needs a source to anchor to."""
        if self.anchor and not self.source:
            raise ConfigError(f"grow.anchor = {self.anchor:g} anchors a grown model's weights to its source's, "
                              "and there is no grow.source", where=source,
                              fix="pass --from MODEL (grow.source), or set grow.anchor: 0")


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    embeddings: EmbeddingsConfig = field(default_factory=EmbeddingsConfig)
    lexicon: LexiconConfig = field(default_factory=LexiconConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    crf: CRFConfig = field(default_factory=CRFConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    span: SpanConfig = field(default_factory=SpanConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    grow: GrowConfig = field(default_factory=GrowConfig)
    output_dir: str = "runs/model"  # the model directory when `nerkit train` is given no `--out`


RESUMABLE_KEYS = {f"train.{f.name}" for f in fields(TrainConfig) if f.metadata.get("resumable")}
# Keys that earlier versions wrote into a model directory's config.yaml and that no longer mean
# anything: read and dropped, so that those directories still load.
RETIRED_KEYS = {"train": frozenset({"eval_every_epochs"})}
WARMUP_KEYS = ("warmup", "warmup_steps")  # one warm-up, in either key
_SECTIONS = {f.name: f for f in fields(Config)}


def _encoder_config(values: dict, source: str, file_keys: set[str], file_name: str, origin) -> EncoderConfig:
    values = dict(values or {})
    where = origin("encoder.name")
    name = coerce(values.pop("name", "bilstm"), str, f"{where}: encoder.name")
    if name not in ENCODER_OPTIONS:
        hint = did_you_mean(name, ENCODER_OPTIONS)
        raise ConfigError(f"unknown encoder {name!r}", where=f"{where}: encoder.name",
                          fix=(f"{hint} " if hint else "") + f"(encoders: {', '.join(sorted(ENCODER_OPTIONS))})")
    option_cls = ENCODER_OPTIONS[name]
    known = {f.name for f in fields(option_cls)}
    # Keys the file wrote for its own encoder are dropped when `--set encoder.name=` switches to an
    # encoder that lacks them; any other unknown key (a typo, or one given by --set) is an error.
    file_cls = ENCODER_OPTIONS.get(file_name)
    carried_over = file_keys & {f.name for f in fields(file_cls)} if file_cls else set()
    for k in [k for k in values if k not in known and k in carried_over]:
        values.pop(k)
    options = fill(option_cls, values, "encoder", origin)
    _check_encoder(options, f"{source}: encoder")
    return EncoderConfig(name, options)


def _check_encoder(options, where: str) -> None:
    """What an encoder's options must satisfy between fields, checked before anything is built."""
    attention = getattr(options, "attention", None)
    if hasattr(options, "head_dim"):
        # Sinusoids are sin/cos pairs: the width they are built at must be even (tener and rope: one
        # head's width; absolute, xl and FLAT: the model width; shaw, alibi and learned have none).
        per_head = attention in ("tener", "rope")
        width = options.head_dim if per_head else options.n_heads * options.head_dim
        if attention not in ("shaw", "alibi", "learned") and width % 2:
            what = "head_dim" if per_head else "n_heads * head_dim"
            raise ConfigError(f"sinusoidal positions need an even width, but {what} = {width}", where=where,
                              fix="choose an even head_dim")
    memory, segment = getattr(options, "memory", 0), getattr(options, "segment", 0)
    if memory and attention in ABSOLUTE_ATTENTIONS:
        raise ConfigError(f"memory = {memory} needs a relative attention, but attention is {attention}: absolute "
                          "positions repeat in every segment, so a cached state could not tell where it came from",
                          where=where, fix=f"use attention: {', '.join(RELATIVE_ATTENTIONS[:-1])} or {RELATIVE_ATTENTIONS[-1]}, or memory: 0")
    if memory and not segment:
        raise ConfigError(f"memory = {memory} needs segment, the characters read at a time", where=where,
                          fix="e.g. segment: 128")
    if segment and not memory:
        raise ConfigError(f"segment = {segment} without memory would cut texts into unrelated pieces", where=where,
                          fix="set memory (e.g. memory: 128), or segment: 0")


def _is_list(raw: dict, path: list[str]) -> bool:
    """Whether the file gives the section at `path` (e.g. embeddings.lm) as a list of sources."""
    section = raw.get(path[0])
    return isinstance(section, dict) and isinstance(section.get(path[1]), list)


def _nested(path: list[str]) -> bool:
    """Whether `section.key` is a section inside a section (embeddings.lm), which a third part may set."""
    section = _SECTIONS[path[0]].default_factory
    key = next((f for f in fields(section) if f.name == path[1]), None) if dataclasses.is_dataclass(section) else None
    return key is not None and key.default_factory is not dataclasses.MISSING


def _apply_overrides(raw: dict, overrides: list[str], file_encoder_keys: set[str]) -> dict[str, str]:
    """Apply `--set` overrides to `raw` in place; the dotted key -> override that gave it."""
    set_by: dict[str, str] = {}
    for text in overrides:
        path, value = parse_override(text)
        set_by[".".join(path)] = text
        if path[0] not in _SECTIONS:
            raise ConfigError(f"unknown key {path[0]!r} in --set {text}", fix=suggest(path[0], _SECTIONS))
        if len(path) == 1:
            raw[path[0]] = value
            continue
        if len(path) > 3 or (len(path) == 3 and not _nested(path)):
            raise ConfigError(f"override {text!r} is nested too deep", fix="write --set section.key=value")
        if len(path) == 3 and _is_list(raw, path[:2]):
            raise ConfigError(f"--set {text}: {path[0]}.{path[1]} is a list of sources, and the override does not say which",
                              fix=f"set the whole list, e.g. --set '{path[0]}.{path[1]}=[{{path: A}}, {{path: B, finetune: true}}]'")
        if path[0] == "train" and path[1] in WARMUP_KEYS and isinstance(raw.get("train"), dict):
            # a warm-up given on the command line replaces the file's, in whichever of the two keys
            raw["train"] = {k: v for k, v in raw["train"].items() if k not in WARMUP_KEYS}
        raw[path[0]] = set_path(raw.get(path[0]), path[1:], value)
        if path[0] == "encoder":
            file_encoder_keys.discard(path[1])
    return set_by


def build_config(raw: dict, source: str = "<config>", overrides: list[str] = ()) -> Config:
    raw = dict(raw or {})
    file_encoder = raw.get("encoder") if isinstance(raw.get("encoder"), dict) else {}
    file_encoder_keys = set(file_encoder)
    file_encoder_name = str(file_encoder.get("name", "bilstm"))
    origin = override_origin(_apply_overrides(raw, list(overrides), file_encoder_keys), source)
    for key in raw:
        if key not in _SECTIONS:
            raise ConfigError(f"unknown section {key!r}", where=source, fix=suggest(key, _SECTIONS))
    values = {}
    for name, f in _SECTIONS.items():  # in the file's order of sections, so the first error is the first key
        if name == "encoder":
            values[name] = _encoder_config(raw.get(name), source, file_encoder_keys, file_encoder_name, origin)
        elif name == "output_dir":
            values[name] = coerce(raw.get(name, f.default), str, f"{origin(name)}: {name}")
        else:
            values[name] = fill(f.default_factory, raw.get(name), name, origin, RETIRED_KEYS.get(name, frozenset()))
    config = Config(**values)
    _check_stack(config.embeddings, origin)
    _check_config(config, source)
    _check_context(config, source)
    _check_head(config, source)
    return config


def _check_stack(emb: EmbeddingsConfig, origin) -> None:
    """Stacked language models (embeddings.lm as a list) each have a path, no path twice; a list of
    one is that one mapping."""
    if not isinstance(emb.lm, list):
        return
    seen = {}
    for k, item in enumerate(emb.lm):
        label = item_label("embeddings.lm", k)
        if not item.path:
            raise ConfigError(f"{label} has no path", where=origin(label),
                              fix="give each listed source its directory, or remove the item")
        same = seen.setdefault(os.path.normpath(os.path.expanduser(item.path)), label)
        if same != label:
            raise ConfigError(f"{label} repeats the path of {same} ({item.path})", where=origin(label),
                              fix="list each language model once")
    if len(emb.lm) == 1:
        emb.lm = emb.lm[0]


def _check_config(config: Config, source: str) -> None:
    """The rules between fields (each field's own range and choices are checked as it is read)."""
    emb = config.embeddings
    if emb.char_dim == 0 and not emb.lm_sources():
        raise ConfigError("embeddings.char_dim is 0 and there is no language model: the model would see nothing",
                          where=source, fix="set embeddings.char_dim, or embeddings.lm.path")
    tc = config.train
    if tc.warmup and tc.warmup_steps:
        raise ConfigError(f"train.warmup = {tc.warmup:g} and train.warmup_steps = {tc.warmup_steps} are both set",
                          where=source, fix="keep one: train.warmup (a fraction of the steps, or steps) is the newer")
    if tc.warmup >= 1 and tc.warmup != int(tc.warmup):
        raise ConfigError(f"train.warmup = {tc.warmup:g} is neither a fraction below 1 nor a whole number of steps",
                          where=source, fix="e.g. 0.1 (a tenth of the run's steps) or 500 (steps)")
    options = config.encoder.options
    if getattr(options, "attention", None) == "learned" and not 0 < config.data.max_len <= options.max_positions:
        raise ConfigError(f"attention: learned reads at most encoder.max_positions = {options.max_positions} characters, "
                          f"but data.max_len is {config.data.max_len} (0: no limit)", where=source,
                          fix=f"set data.max_len to at most {options.max_positions}, or raise encoder.max_positions")


def _check_context(config: Config, source: str) -> None:
    """`data.context: document` carries a Transformer's memory from segment to segment: it needs one."""
    if config.data.context != "document" or getattr(config.encoder.options, "memory", 0):
        return
    lacks = "has memory = 0" if hasattr(config.encoder.options, "memory") else "has no memory"
    raise ConfigError(f"data.context = document reads each document as a stream of segments that carry "
                      f"Transformer-XL's memory, but encoder {config.encoder.name} {lacks}", where=source,
                      fix="use encoder.name: transformer with a relative attention (e.g. attention: xl), "
                          "memory and segment (e.g. memory: 128, segment: 128), or data.context: sentence")


def _check_head(config: Config, source: str) -> None:
    """The head's own options (its section's `check`), and a head that reads each window or sentence
    whole does not stream through Transformer-XL's memory."""
    traits = head_traits(config)
    getattr(config, traits.options).check(source)
    if config.span.negative_sampling and traits.options != "span":
        raise ConfigError(f"span.negative_sampling = {config.span.negative_sampling:g} is the span head's, but "
                          f"model.head is {config.model.head}", where=source,
                          fix="set model.head: span (--set model.head=span), or span.negative_sampling: 0")
    if not traits.reads_memory and getattr(config.encoder.options, "memory", 0):
        raise ConfigError(f"model.head: {config.model.head} reads each sentence or window whole, not through "
                          "Transformer-XL's memory (encoder.memory)", where=source,
                          fix="set encoder.memory: 0, or model.head: crf")


def head_traits(config: Config) -> HeadTraits:
    """What the config's head can do (HEAD_TRAITS)."""
    return HEAD_TRAITS[config.model.head]


def load_config(path: str | Path, overrides: list[str] = ()) -> Config:
    path = Path(path)
    raw = read_yaml(path, "config file", fix="check the path, e.g. configs/demo.yaml")
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError("the config must be a mapping of sections", where=str(path))
    return build_config(raw or {}, str(path), overrides)


def config_to_dict(config: Config) -> dict:
    out = {}
    for f in fields(Config):
        value = getattr(config, f.name)
        if f.name == "encoder":
            out["encoder"] = {"name": value.name, **dataclasses.asdict(value.options)}
        elif dataclasses.is_dataclass(value):
            out[f.name] = dataclasses.asdict(value)
        else:
            out[f.name] = value
    return out


def config_to_yaml(config: Config) -> str:
    return yaml.safe_dump(config_to_dict(config), sort_keys=False, allow_unicode=True)
