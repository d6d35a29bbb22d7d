"""Typed configuration: dataclasses loaded from YAML, with `${VAR}` interpolation, dotted
`--set section.key=value` overrides, type coercion and unknown-key errors that suggest a fix.

The `encoder` section is `name:` plus the fields of that encoder's options (ENCODER_OPTIONS). This is
the only place a config is checked: every name and choice is validated here, when the file loads,
and loading imports nothing heavy (no torch).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from nerkit.errors import ConfigError, did_you_mean


@dataclass
class DataConfig:
    train: str | None = None  # the training corpus: CoNLL (BIO, BIOES or BMES, detected) or JSON lines
    dev: str | None = None  # when absent, a seeded dev split is carved from train
    test: str | None = None  # reported once at the end, never used for selection
    # the fraction of train carved off as dev (seeded by `split_seed`) when `data.dev` is absent
    dev_split: float = 0.05
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
    insert_spaces: float = 0.0
    scheme: str = "auto"  # the scheme the model tags in: auto (the training file's) | bio | bioes | bmes
    # sentence: each training sentence read alone | document: consecutive sentences of the training
    # file (a `-DOCSTART-` line starts a new document) read as streams in segments of encoder.segment
    # characters, Transformer-XL's memory carried from one to the next (needs encoder.memory;
    # docs/encoders.md). Long sentences are then cut into segments, not at max_len.
    context: str = "sentence"
    # What a CRF learns from a nested training corpus (entities that overlap: nerkit.data.nesting),
    # since it tags each character once: none refuses one, naming the fix | outer keeps the longest
    # entity of each overlap | inner the shortest. Dev and test are scored as written, nested
    # entities counted exactly. (Not the FLAT encoder: a flat projection of the data.)
    flat: str = "none"
    limit: int = 0  # use only the first N training sentences (0 = all)


@dataclass
class LMConfig:
    """A pretrained language model as features (`embeddings.lm.*`). `embeddings.lm` may also be a list
    of such mappings, stacked sources (each with its own path, finetune, lr, layer_decay, layers, bf16
    and cache)
    whose features are concatenated per character in list order (nerkit.pretrained.stacked)."""

    path: str | None = None  # a local Hugging Face encoder directory (any fast tokenizer) or LAC's; None: no LM
    finetune: bool = False  # train the LM's weights too (else frozen, its features cached per corpus)
    lr: float = 0.0  # the LM's own learning rate when fine-tuned (0: train.lr)
    # Layer-wise learning-rate decay of a fine-tuned LM, in (0, 1]: its top layer trains at the LM's
    # rate, each layer below at this times the rate of the layer above, the embeddings lowest (1: one rate)
    layer_decay: float = 1.0
    layers: str = "last"  # last: the top layer | mix: a learned scalar mix of every layer
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
    vectors_keep: str = "all"  # all: every row of a vector file joins the vocabulary | train: training tokens only
    vectors_normalize: bool = True  # pretrained rows scaled to unit length (TENER's and FLAT's code)
    min_freq: int = 1  # characters seen fewer times in train become `<unk>`
    bichar_min_freq: int = 1  # bigrams seen fewer times in train become `<unk>`
    dropout: float = 0.5  # dropout on the concatenated embeddings (and on FLAT's word embeddings)
    token_dropout: float = 0.0  # a training token becomes <unk> with this probability, so <unk> is learnt
    freeze: bool = False  # keep pretrained vectors fixed
    # Random vectors: `normal` is PyTorch's N(0, 1); `scaled` is U(-sqrt(3/dim), sqrt(3/dim)) (std
    # 1/sqrt(dim), unit-norm-sized vectors), what TENER's and FLAT's code (fastNLP StaticEmbedding)
    # start from; with plain SGD at lr ~1e-3 N(0, 1) vectors barely move.
    init: str = "normal"
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


def item_label(section: str, k: int) -> str:
    """How messages name item k of a section given as a list (stacked sources): `embeddings.lm[1]`."""
    return f"{section}[{k}]"


@dataclass
class LexiconConfig:
    source: str = "jieba"  # jieba | path to a word list | path to a word2vec file (its vocabulary)
    min_len: int = 2  # the shortest word matched into the lattice
    max_len: int = 0  # 0 = no limit (long jieba words are mostly organisation names)
    # words whose frequency in the source (jieba's dictionary, a word list's second column) is below this are
    # dropped; a word without one is kept
    min_freq: int = 0
    max_words: int = 400  # lattice cap: words kept per sentence
    drop: str = "longest_first"  # longest_first | frequency


# ------------------------------------------------------------------- encoders' own options
# Each encoder's section is `name:` plus the fields of its options class; ENCODER_OPTIONS names them
# (nerkit.model.encoders.ENCODERS names the modules; a test keeps the two registries' names equal).


@dataclass
class BiLSTMOptions:
    hidden_size: int = 200  # per direction
    num_layers: int = 1  # stacked BiLSTM layers
    dropout: float = 0.3  # between stacked layers and on the output


@dataclass
class TransformerOptions:
    # Defaults equal TENER's MSRA setting (fastnlp/TENER, train_tener_cn.py), so that `transformer`
    # and `tener` differ only in how attention sees positions.
    n_heads: int = 6  # attention heads
    head_dim: int = 80  # d_model = n_heads * head_dim
    num_layers: int = 2  # Transformer layers
    ff_ratio: float = 2.0  # feed-forward width = ff_ratio * d_model (TENER uses 2; Vaswani used 4)
    dropout: float = 0.15  # on sublayer outputs and inside the feed-forward
    attn_dropout: float = 0.15  # on attention weights (TENER leaves dropout_attn unset: it equals dropout)
    # How attention sees positions: absolute (sinusoids added to the input, Vaswani) | learned (a
    # learned row per position added to the input, BERT) | tener | xl | shaw | rope | alibi (relative:
    # scores depend on i - j; see docs/encoders.md)
    attention: str = "absolute"
    key_projection: bool | None = None  # None: as the attention's paper (tener: no; the others: yes)
    scale: bool | None = None  # None: as the paper (tener: no; the others: divide by sqrt(head_dim))
    max_relative_distance: int = 16  # shaw only: distances clipped to [-k, k]
    max_positions: int = 512  # learned only: rows of the position table, the longest input it reads
    # Transformer-XL's segment recurrence (relative attentions only): a text longer than `segment`
    # characters is read segment by segment, each layer attending over the `memory` positions before
    # the segment (cached, no gradient) as well as the segment itself. 0: off, the whole text at once.
    memory: int = 0
    segment: int = 0  # characters per segment when memory is on


@dataclass
class TenerOptions(TransformerOptions):
    attention: str = "tener"  # as `transformer`'s `attention`, with `tener` as the default


@dataclass
class FLATOptions:
    # Defaults: the official code (LeeSureman/Flat-Lattice-Transformer, V0/flat_main.py) for MSRA.
    n_heads: int = 8  # attention heads
    head_dim: int = 20  # d_model = n_heads * head_dim = 160
    num_layers: int = 1  # FLAT layers
    ff_ratio: float = 3.0  # feed-forward width = ff_ratio * d_model = 480
    dropout: float = 0.15  # inside the feed-forward and on sublayer outputs (official ff_dropout)
    attn_dropout: float = 0.0  # on attention weights
    fusion: str = "four"  # four: the paper's [P_hh; P_ht; P_th; P_tt] | two: [P_hh; P_tt], the code's default
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
DEVICES = ("auto", "cpu", "cuda")  # auto: the GPU when torch sees one
CONTEXTS = ("sentence", "document")  # data.context: what a training sequence reads
FLATS = ("none", "outer", "inner")  # data.flat and `--flat`: nerkit.data.nesting's flat projections
# absolute ones, then nerkit.model.encoders.relative.VARIANTS
ATTENTIONS = ("absolute", "learned", "tener", "xl", "shaw", "rope", "alibi")
ABSOLUTE_ATTENTIONS = ("absolute", "learned")  # positions added to the input: the same in every segment


def memory_segment(config: "Config") -> int:
    """The characters a model with Transformer-XL memory reads at a time (`encoder.segment`), or 0
    for a model without memory, which reads a text (or a window of it) at once."""
    options = config.encoder.options
    return options.segment if getattr(options, "memory", 0) else 0
FUSIONS = ("four", "two")  # nerkit.model.encoders.flat.FUSIONS


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
    dropout: float = 0.0  # on encoder outputs before the emission layer ("output dropout")
    algorithm: str = "auto"  # likelihood's forward algorithm: loop | scan (log-depth) | auto (scan on GPU)


@dataclass
class TrainConfig:
    epochs: int = 20  # the most epochs the run trains
    batch_size: int = 32  # sentences per optimiser step (with several processes, the global batch they share)
    eval_batch_size: int = 128  # sentences per batch when scoring dev and test
    optimizer: str = "adam"  # sgd | adam | adamw
    lr: float = 1e-3  # the learning rate (its peak, after any warm-up)
    momentum: float = 0.9  # SGD's momentum
    weight_decay: float = 0.0  # passed to the optimiser (AdamW decouples it from the gradient)
    # The learning rate rises linearly to `lr` over the first steps: below 1 a fraction of the run's
    # steps (0.1: the first tenth, so a config carries to a corpus of any size), 1 or more a number
    # of steps. 0: no warm-up.
    warmup: float = 0.0
    warmup_steps: int = 0  # the same in steps (older configs); set warmup or warmup_steps, not both
    schedule: str = "constant"  # constant | linear | inverse_time
    decay: float = 0.05  # inverse_time: lr / (1 + decay * epoch)
    clip_norm: float = 5.0  # 0 = off
    clip_value: float = 0.0  # 0 = off
    patience: int = 5  # epochs without dev improvement before stopping (0 = never stop early)
    seed: int = 42  # the random seed of initialisation, shuffling and dropout
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch intra-op threads (0: the cores free when nerkit starts, nerkit/cores.py)
    max_steps: int = 0  # stop after N optimiser steps (0 = no limit)
    time_budget: float = 0.0  # seconds (0 = no limit); written with a unit too: 90s, 20m, 1.5h
    checkpoint_every: int = 0  # steps between resumable checkpoints (0 = at epoch ends only)
    # With several processes (torchrun, --nproc): how long a rank waits for the others in one
    # collective before it ends the job. Rank 0's dev evaluation must fit in it (the others wait).
    dist_timeout: float = 1800.0  # seconds, or with a unit: 90s, 20m, 1.5h


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    embeddings: EmbeddingsConfig = field(default_factory=EmbeddingsConfig)
    lexicon: LexiconConfig = field(default_factory=LexiconConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    crf: CRFConfig = field(default_factory=CRFConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    output_dir: str = "runs/model"  # the model directory when `nerkit train` is given no `--out`


CHOICES = {
    ("data", "scheme"): ("auto", "bio", "bioes", "bmes"),
    ("data", "context"): CONTEXTS,
    ("data", "flat"): FLATS,
    ("embeddings", "init"): ("normal", "scaled"),
    ("lexicon", "drop"): ("longest_first", "frequency"),
    ("train", "optimizer"): ("sgd", "adam", "adamw"),
    ("train", "schedule"): ("constant", "linear", "inverse_time"),
    ("train", "device"): DEVICES,
    ("crf", "algorithm"): ("auto", "loop", "scan"),
    ("embeddings", "vectors_keep"): ("all", "train"),
    ("embeddings.lm", "layers"): ("last", "mix"),
    ("encoder", "attention"): ATTENTIONS,
    ("encoder", "fusion"): FUSIONS,
}
NESTED = {("embeddings", "lm"): LMConfig}  # sections inside sections
STACKABLE = {("embeddings", "lm")}  # nested sections that may also be a list of mappings (stacked sources)
DURATIONS = {("train", "time_budget"), ("train", "dist_timeout")}  # seconds, also given as "90s", "20m", "1.5h"
_DURATION = re.compile(r"^\s*(?P<number>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*(?P<unit>[smh]?)\s*$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600}
# Keys that earlier versions wrote into a model directory's config.yaml and that no longer mean
# anything: read and dropped, so that those directories still load.
WARMUP_KEYS = ("warmup", "warmup_steps")  # one warm-up, in either key
RETIRED_KEYS = {("train", "eval_every_epochs")}
# Sizes that torch cannot build with 0, whichever section (or encoder) has them.
AT_LEAST_ONE = {"hidden_size", "num_layers", "n_heads", "head_dim", "eval_batch_size"}
_SECTIONS = {f.name: f for f in fields(Config)}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
DEFAULT_VARS = {"NERKIT_DATA": "data"}


def _suggest(key: str, valid) -> str:
    return did_you_mean(key, valid) or f"valid keys: {', '.join(sorted(valid))}"


def interpolate(value: str, where: str) -> str:
    def sub(m):
        name, default = m.group(1), m.group(2)
        value = os.environ.get(name)
        if value is not None and (value or default is None):
            return value
        if default is not None:  # as in the shell, `${VAR:-default}` also replaces an empty VAR
            return default
        if name in DEFAULT_VARS:
            return DEFAULT_VARS[name]
        raise ConfigError(f"environment variable {name} is not set", where=where,
                          fix=f"export {name}=... or write ${{{name}:-default}}")
    return _VAR.sub(sub, value)


def _coerce(value: Any, annotation, where: str) -> Any:
    """Coerce a YAML value to a field's type: PyYAML reads `1e-3` as a string, users write `"32"`."""
    if isinstance(annotation, str):
        annotation = eval(annotation, {"Any": Any}, {})  # from __future__ annotations
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none", "~")):
            return None
        return _coerce(value, args[0], where)
    if annotation is Any:
        return value
    if isinstance(value, str):
        value = interpolate(value, where)
    try:
        if annotation is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
                return value.lower() in ("true", "yes", "on", "1")
            if isinstance(value, int) and value in (0, 1):
                return bool(value)
            raise ValueError
        if annotation is int:
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, float):
                if not value.is_integer():
                    raise ValueError
                return int(value)
            if isinstance(value, str):
                f = float(value)
                if not f.is_integer():
                    raise ValueError
                return int(f)
            return int(value)
        if annotation is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if annotation is str:
            if isinstance(value, (dict, list)):
                raise ValueError
            return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{value!r} is not a valid {annotation.__name__}", where=where) from None
    return value


def _duration(value: Any, where: str) -> Any:
    """A duration in seconds from "90s", "20m", "1.5h" or a plain number; anything else is left to
    `_coerce` (which names the key when it is not a number)."""
    if not isinstance(value, str):
        return value
    m = _DURATION.match(interpolate(value, where))
    if not m:
        raise ConfigError(f"{value!r} is not a duration", where=where,
                          fix='write seconds, or a number with s, m or h: "90s", "20m", "1.5h"')
    return float(m["number"]) * _SECONDS[m["unit"]]


def parse_duration(text: str, where: str) -> float:
    """Seconds from "90s", "20m", "1.5h" or a plain number (a command-line option's duration)."""
    seconds = float(_duration(text, where))
    if seconds < 0:
        raise ConfigError(f"{text!r} must not be negative", where=where)
    return seconds


def _origin(set_by: dict[str, str], dotted: str, source: str) -> str:
    """Where the value of key `dotted` (`train.lr`, `embeddings.lm[1].path`) was given: the `--set`
    that gave it or a section above it (`set_by`: dotted key -> override), else the config `source`."""
    parts = re.sub(r"\[\d+\]", "", dotted).split(".")
    for n in range(len(parts), 0, -1):
        text = set_by.get(".".join(parts[:n]))
        if text is not None:
            return f"--set {text}"
    return source


def _fill(cls, values: dict, section: str, source: str, label: str | None = None,
          set_by: dict[str, str] | None = None):
    """Build dataclass `cls` from `values`, naming `label.key` (`label`: `section`, or e.g.
    `embeddings.lm[1]` for one item of a list) and where its value was given (`_origin`: a `--set`
    of `set_by`, else `source`) in every error."""
    label, set_by = label or section, set_by or {}
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"section {label!r} must be a mapping of keys to values", where=source)
    known = {f.name: f for f in fields(cls)}
    kwargs = {}
    for key, value in values.items():
        where = _origin(set_by, f"{label}.{key}", source)
        if key not in known:
            if (section, key) in RETIRED_KEYS:
                continue
            raise ConfigError(f"unknown key {label}.{key}", where=where, fix=_suggest(key, known))
        nested = NESTED.get((section, key))
        if nested is not None:  # a section inside a section, e.g. embeddings.lm
            if (section, key) in STACKABLE and isinstance(value, list):
                kwargs[key] = _stacked(nested, value, f"{section}.{key}", source, set_by)
            else:
                kwargs[key] = _fill(nested, value, f"{section}.{key}", source, set_by=set_by)
            continue
        if (section, key) in DURATIONS:
            value = _duration(value, f"{where}: {label}.{key}")
        kwargs[key] = _coerce(value, known[key].type, f"{where}: {label}.{key}")
        choices = CHOICES.get((section, key))
        if choices and kwargs[key] not in choices:
            raise ConfigError(f"{label}.{key} = {kwargs[key]!r} is not one of {', '.join(choices)}", where=where,
                              fix=did_you_mean(kwargs[key], choices))
        if isinstance(kwargs[key], (int, float)) and not isinstance(kwargs[key], bool) and kwargs[key] < 0:
            raise ConfigError(f"{label}.{key} = {kwargs[key]} must not be negative", where=where)
        if isinstance(kwargs[key], float) and not math.isfinite(kwargs[key]):
            raise ConfigError(f"{label}.{key} = {kwargs[key]} must be a finite number", where=where)
        if key in AT_LEAST_ONE and kwargs[key] < 1:
            raise ConfigError(f"{label}.{key} = {kwargs[key]} must be at least 1", where=where)
        if key.endswith("dropout") and kwargs[key] >= 1:
            raise ConfigError(f"{label}.{key} = {kwargs[key]} must be below 1 (a probability)", where=where)
    return cls(**kwargs)


def _stacked(cls, values: list, section: str, source: str, set_by: dict[str, str]):
    """A nested section given as a list (stacked language models): each item a full mapping of
    `cls` with a path, no path twice. A list of one is that one mapping."""
    if not values:
        raise ConfigError(f"{section} is an empty list", where=source,
                          fix=f"list at least one source (a mapping with a path), or leave {section} out")
    items, seen = [], {}
    for k, value in enumerate(values):
        label = item_label(section, k)
        if not isinstance(value, dict):
            raise ConfigError(f"{label} is {type(value).__name__} {value!r}, not a mapping", where=source,
                              fix="write each source as a mapping, e.g. - {path: lm/m3e-small, finetune: true}")
        item = _fill(cls, value, section, source, label, set_by)
        if not item.path:
            raise ConfigError(f"{label} has no path", where=source,
                              fix="give each listed source its directory, or remove the item")
        same = seen.setdefault(os.path.normpath(os.path.expanduser(item.path)), label)
        if same != label:
            raise ConfigError(f"{label} repeats the path of {same} ({item.path})", where=source,
                              fix="list each language model once")
        items.append(item)
    return items[0] if len(items) == 1 else items


def _encoder_config(values: dict, source: str, file_keys: set[str], file_name: str,
                    set_by: dict[str, str]) -> EncoderConfig:
    values = dict(values or {})
    where = _origin(set_by, "encoder.name", source)
    name = _coerce(values.pop("name", "bilstm"), str, f"{where}: encoder.name")
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
    options = _fill(option_cls, values, "encoder", source, set_by=set_by)
    _check_encoder(options, f"{source}: encoder")
    return EncoderConfig(name, options)


def _check_encoder(options, where: str) -> None:
    """What an encoder's options must satisfy beyond their types, checked before anything is built."""
    ff_ratio = getattr(options, "ff_ratio", None)
    if ff_ratio is not None and ff_ratio <= 0:
        raise ConfigError(f"ff_ratio = {ff_ratio} must be positive", where=where, fix="e.g. 2 (TENER) or 4 (Vaswani)")
    attention = getattr(options, "attention", None)
    if hasattr(options, "head_dim"):
        # Sinusoids are sin/cos pairs: the width they are built at must be even (tener: one head's
        # width; absolute, xl and FLAT: the model width).
        width = options.head_dim if attention in ("tener", "rope") else options.n_heads * options.head_dim
        if attention not in ("shaw", "alibi", "learned") and width % 2:
            what = "head_dim" if attention in ("tener", "rope") else "n_heads * head_dim"
            raise ConfigError(f"sinusoidal positions need an even width, but {what} = {width}", where=where,
                              fix="choose an even head_dim")
    if attention == "shaw" and options.max_relative_distance < 1:
        raise ConfigError("max_relative_distance must be at least 1", where=where)
    if attention == "learned" and options.max_positions < 1:
        raise ConfigError("max_positions must be at least 1", where=where)
    memory, segment = getattr(options, "memory", 0), getattr(options, "segment", 0)
    if memory and attention in ABSOLUTE_ATTENTIONS:
        raise ConfigError(f"memory = {memory} needs a relative attention, but attention is {attention}: absolute "
                          "positions repeat in every segment, so a cached state could not tell where it came from",
                          where=where, fix="use attention: tener, xl, shaw, rope or alibi, or memory: 0")
    if memory and not segment:
        raise ConfigError(f"memory = {memory} needs segment, the characters read at a time", where=where,
                          fix="e.g. segment: 128")
    if segment and not memory:
        raise ConfigError(f"segment = {segment} without memory would cut texts into unrelated pieces", where=where,
                          fix="set memory (e.g. memory: 128), or segment: 0")


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} has no '='", fix="write --set section.key=value, e.g. --set train.lr=0.01")
    key, raw = text.split("=", 1)
    path = key.strip().split(".")
    if not all(path):
        raise ConfigError(f"override key {key!r} is malformed", fix="write --set section.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return path, value


def _set(section, path: list[str], value):
    """A copy of `section` (a mapping, or nothing yet) with `value` at `path`."""
    section = dict(section) if isinstance(section, dict) else {}
    section[path[0]] = value if len(path) == 1 else _set(section.get(path[0]), path[1:], value)
    return section


def _is_list(raw: dict, path: list[str]) -> bool:
    """Whether the file gives the section at `path` (e.g. embeddings.lm) as a list of sources."""
    section = raw.get(path[0])
    return isinstance(section, dict) and isinstance(section.get(path[1]), list)


def build_config(raw: dict, source: str = "<config>", overrides: list[str] = ()) -> Config:
    raw = dict(raw or {})
    file_encoder = raw.get("encoder") if isinstance(raw.get("encoder"), dict) else {}
    file_encoder_keys = set(file_encoder)
    file_encoder_name = str(file_encoder.get("name", "bilstm"))
    set_by: dict[str, str] = {}  # dotted key -> the override that gave it, named in errors about its value
    for text in overrides:
        path, value = parse_override(text)
        set_by[".".join(path)] = text
        if path[0] not in _SECTIONS:
            raise ConfigError(f"unknown key {path[0]!r} in --set {text}", fix=_suggest(path[0], _SECTIONS))
        if len(path) == 1:
            raw[path[0]] = value
            continue
        if len(path) > 3 or (len(path) == 3 and (path[0], path[1]) not in NESTED):
            raise ConfigError(f"override {text!r} is nested too deep", fix="write --set section.key=value")
        if len(path) == 3 and _is_list(raw, path[:2]):
            raise ConfigError(f"--set {text}: {path[0]}.{path[1]} is a list of sources, and the override does not say which",
                              fix=f"set the whole list, e.g. --set '{path[0]}.{path[1]}=[{{path: A}}, {{path: B, finetune: true}}]'")
        if path[0] == "train" and path[1] in WARMUP_KEYS and isinstance(raw.get("train"), dict):
            # a warm-up given on the command line replaces the file's, in whichever of the two keys
            raw["train"] = {k: v for k, v in raw["train"].items() if k not in WARMUP_KEYS}
        raw[path[0]] = _set(raw.get(path[0]), path[1:], value)
        if path[0] == "encoder":
            file_encoder_keys.discard(path[1])
    for key in raw:
        if key not in _SECTIONS:
            raise ConfigError(f"unknown section {key!r}", where=source, fix=_suggest(key, _SECTIONS))
    config = Config(
        data=_fill(DataConfig, raw.get("data"), "data", source, set_by=set_by),
        embeddings=_fill(EmbeddingsConfig, raw.get("embeddings"), "embeddings", source, set_by=set_by),
        lexicon=_fill(LexiconConfig, raw.get("lexicon"), "lexicon", source, set_by=set_by),
        encoder=_encoder_config(raw.get("encoder"), source, file_encoder_keys, file_encoder_name, set_by),
        crf=_fill(CRFConfig, raw.get("crf"), "crf", source, set_by=set_by),
        train=_fill(TrainConfig, raw.get("train"), "train", source, set_by=set_by),
        output_dir=_coerce(raw.get("output_dir", "runs/model"), str, f"{_origin(set_by, 'output_dir', source)}: output_dir"),
    )
    if not 0 <= config.data.dev_split < 1:
        raise ConfigError(f"data.dev_split = {config.data.dev_split} must be in [0, 1)", where=source)
    emb = config.embeddings
    if emb.char_dim == 0 and not emb.lm_sources():
        raise ConfigError("embeddings.char_dim is 0 and there is no language model: the model would see nothing",
                          where=source, fix="set embeddings.char_dim, or embeddings.lm.path")
    for k, lm in enumerate(emb.lm_sources()):
        if not 0 < lm.layer_decay <= 1:
            raise ConfigError(f"{emb.lm_label(k)}.layer_decay = {lm.layer_decay:g} must be in (0, 1]", where=source,
                              fix="e.g. 0.8: each layer down trains at 0.8 times the rate of the one above; 1: one rate")
    if config.data.insert_spaces > 1:
        raise ConfigError(f"data.insert_spaces = {config.data.insert_spaces} must be in [0, 1] (a probability)",
                          where=source, fix="e.g. 0.05")
    if config.train.epochs < 1:
        raise ConfigError("train.epochs must be at least 1", where=source)
    if config.train.batch_size < 1:
        raise ConfigError("train.batch_size must be at least 1", where=source)
    tc = config.train
    if tc.warmup and tc.warmup_steps:
        raise ConfigError(f"train.warmup = {tc.warmup:g} and train.warmup_steps = {tc.warmup_steps} are both set",
                          where=source, fix="keep one: train.warmup (a fraction of the steps, or steps) is the newer")
    if tc.warmup >= 1 and tc.warmup != int(tc.warmup):
        raise ConfigError(f"train.warmup = {tc.warmup:g} is neither a fraction below 1 nor a whole number of steps",
                          where=source, fix="e.g. 0.1 (a tenth of the run's steps) or 500 (steps)")
    if config.train.dist_timeout <= 0:
        raise ConfigError("train.dist_timeout must be positive", where=source, fix='e.g. "30m" (the default)')
    options = config.encoder.options
    _check_context(config, source)
    if getattr(options, "attention", None) == "learned" and not 0 < config.data.max_len <= options.max_positions:
        raise ConfigError(f"attention: learned reads at most encoder.max_positions = {options.max_positions} characters, "
                          f"but data.max_len is {config.data.max_len} (0: no limit)", where=source,
                          fix=f"set data.max_len to at most {options.max_positions}, or raise encoder.max_positions")
    return config


def _check_context(config: Config, source: str) -> None:
    """`data.context: document` carries a Transformer's memory from segment to segment: it needs one."""
    if config.data.context != "document" or getattr(config.encoder.options, "memory", 0):
        return
    lacks = "has memory = 0" if hasattr(config.encoder.options, "memory") else "has no memory"
    raise ConfigError(f"data.context = document reads each document as a stream of segments that carry "
                      f"Transformer-XL's memory, but encoder {config.encoder.name} {lacks}", where=source,
                      fix="use encoder.name: transformer with a relative attention (e.g. attention: xl), "
                          "memory and segment (e.g. memory: 128, segment: 128), or data.context: sentence")


# What to do about a YAML syntax error, at the line the message names.
YAML_FIX = ("correct the YAML at that line: spaces, not tabs, for indentation; a ': ' after each key; "
            "quotes around a value holding ': ' or ' #'")


def read_yaml(path: str | Path, what: str, fix: str | None = None) -> Any:
    """A YAML file's contents; a missing file, bad YAML (with its line) or non-UTF-8 text is a ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} not found", where=str(path), fix=fix)
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"not valid YAML ({getattr(e, 'problem', e)})", where=where, fix=YAML_FIX) from None
    except UnicodeDecodeError:
        raise ConfigError(f"the {what} is not UTF-8 text", where=str(path), fix="save it as UTF-8") from None


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


# What may change when a run is resumed: how long it goes on and where it runs, nothing that
# shapes the model or the data. (With a linear schedule, `epochs` also moves the learning rate.)
RESUMABLE_KEYS = {"train.epochs", "train.patience", "train.max_steps", "train.time_budget",
                  "train.checkpoint_every", "train.threads", "train.device", "train.eval_batch_size",
                  "train.dist_timeout"}


def run_differences(a: Config, b: Config) -> list[str]:
    """How two configs differ in what trains the model and what it is trained on, one
    `section.key: A -> B` each (nested keys flattened with dots); what a resumed run may change
    (RESUMABLE_KEYS) and the output directory do not count."""

    def fixed(config: Config) -> dict:
        resolved = config_to_dict(config)
        resolved.pop("output_dir")
        for key in RESUMABLE_KEYS:
            section, name = key.split(".")
            resolved[section].pop(name)
        for kind in ("char", "bichar", "word"):  # a width the vector file gives: null before training, the file's after
            if resolved["embeddings"].get(f"{kind}_vectors"):
                resolved["embeddings"].pop(f"{kind}_dim")
        for split in ("train", "dev", "test"):  # one file named two ways (NERKIT_DATA relative or absolute) is one file
            path = resolved["data"][split]
            if path and Path(path).is_file():
                resolved["data"][split] = str(Path(path).resolve())
        return flatten(resolved)

    def flatten(tree: dict, prefix: str = "") -> dict:
        flat = {}
        for key, value in tree.items():
            if isinstance(value, dict):
                flat.update(flatten(value, f"{prefix}{key}."))
            else:
                flat[f"{prefix}{key}"] = value
        return flat

    fa, fb = fixed(a), fixed(b)
    return [f"{key}: {fa.get(key)!r} -> {fb.get(key)!r}" for key in sorted(fa.keys() | fb.keys())
            if fa.get(key) != fb.get(key)]


def same_run(a: Config, b: Config) -> bool:
    """Whether two configs train the same model on the same data, differing at most in what a
    resumed run may change (RESUMABLE_KEYS) and in the output directory."""
    return not run_differences(a, b)
