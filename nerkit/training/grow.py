"""Adding entity types to a trained model (`nerkit train --from MODEL`, the config's `grow:` section;
docs/grow.md). The run's corpus is labelled for the new types only. The grown model keeps the source
model's architecture, vocabulary, embeddings and encoder, and its head grows (`Head.grow_from`); the
old types' targets on the new text come from the source model: its entities as known tags (`hard`)
or its CRF marginals as distillation targets (`soft`), or nothing (`none`, plain fine-tuning, the
baseline that forgets: every character the corpus does not mark is O). A character that no label speaks of for a
type is unknown for that type, never O. With `grow.anchor`, the loss also pulls the weights the grown
model shares with its source back towards the source's (`Anchor`, L2-SP). The training loop trains it
as any run, with `Growth` as one more source of targets, and its nerkit.json records what it grew
from (`grown_from`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from nerkit.config import Config, config_to_dict, head_traits
from nerkit.data.records import Sentence
from nerkit.data.splits import Splits
from nerkit.data.tags import Span, detect_scheme, scheme_tags, spans_to_tags, split_tag
from nerkit.errors import ConfigError, UserError
from nerkit.features.featurizer import Example, Featurizer
from nerkit.files import check_input
from nerkit.inference.model_dir import ModelDir
from nerkit.inference.pipeline import Pipeline
from nerkit.inference.predictor import read_model_dir
from nerkit.training.distill_cache import teacher_sha256
from nerkit.training.resume import flatten

log = logging.getLogger(__name__)

# The config sections a grown model takes from its source: what shapes its weights and its input.
ARCHITECTURE = ("embeddings", "lexicon", "encoder", "crf", "model", "span")
# data keys that shape the input the source's vocabulary was counted on
SOURCE_DATA_KEYS = ("normalize",)
SOURCE_KEY = "grow_source"  # the source model's checksum among a run's checksums: a resume refuses another
FROM_FIX = "pass --from the directory of a model `nerkit train` wrote"


def grown_config(config: Config, source: Config, where: str) -> Config:
    """The config a grown model trains with: the source model's architecture (ARCHITECTURE and
    SOURCE_DATA_KEYS, as its config.yaml says) with this config's data, train and grow sections. A
    key of those sections that this config sets to other than both its default and the source's is
    refused: the weights come from the source, whose shapes and input it fixes."""
    mine, theirs, defaults = (config_to_dict(c) for c in (config, source, Config()))
    for section in ARCHITECTURE:
        found, kept, default = (flatten(c[section]) for c in (mine, theirs, defaults))
        for key, value in found.items():
            if value != kept.get(key) and value != default.get(key):
                raise ConfigError(f"{section}.{key} is {value!r} here but {kept.get(key)!r} in the model it grows from: "
                                  "a grown model keeps its source's architecture", where=where,
                                  fix=f"remove {section}.{key} from the config (the model's value is used)")
    data = replace(config.data, **{key: getattr(source.data, key) for key in SOURCE_DATA_KEYS})
    return replace(source, data=data, train=config.train, distill=config.distill, grow=config.grow,
                   output_dir=config.output_dir)


def overlaps(a: Span, b: Span) -> bool:
    return a.start < b.end and b.start < a.end


@dataclass
class Anchor:
    """L2-SP (Li, Grandvalet & Davoine, "Explicit inductive bias for transfer learning with
    convolutional networks", ICML 2018): `strength` x the squared distance of the weights a grown
    model shares with its source from the values it started with, the source's, added to each batch's
    loss: a corpus that barely exercises the old types moves their weights only as far as it pays for.
    `weights`: each trainable parameter the model shares, its starting values (a frozen copy on its
    device, never saved: a resume grows the model again and takes them anew) and where it is shared
    (a bool mask, None for all of it): the head's rows and columns of the new tags or types are free."""

    strength: float
    weights: list[tuple[torch.nn.Parameter, torch.Tensor, torch.Tensor | None]]

    @classmethod
    def of(cls, model, head_shared: dict[str, torch.Tensor], strength: float) -> "Anchor":
        """The anchor of a model just grown: every trainable parameter outside the head whole (they
        are the source's), the head's where `Head.grow_from` copied the source's (`head_shared`)."""
        head = dict(model.head.named_parameters())
        in_head = {id(p) for p in head.values()}
        weights = [(p, p.detach().clone(), None) for p in model.parameters() if p.requires_grad and id(p) not in in_head]
        for name, p in head.items():
            shared = head_shared[name]
            if p.requires_grad and shared.any():
                weights.append((p, p.detach().clone(), None if shared.all() else shared))
        return cls(strength, weights)

    def penalty(self) -> torch.Tensor:
        """strength x the sum over the shared entries of (weight - its start)^2."""
        total = 0.0
        for p, start, shared in self.weights:
            moved = p - start
            total = total + (moved if shared is None else moved[shared]).square().sum()
        return self.strength * total


@dataclass
class Growth:
    """A run that adds types to the model `source`: the grown config (`start`), the source's
    targets on the training sentences and the grown pipeline (`pipeline`), each training sentence
    as an example with them (`examples`), and the loss of a batch (`loss`). `checksums` go into the
    run's checkpoint, `record` into the model's nerkit.json as `grown_from`."""

    config: Config
    source: Path
    source_meta: dict
    source_tags: list[str]
    sha256: str
    new_types: list[str] = field(default_factory=list)
    scored_types: dict = field(default_factory=dict)  # "dev"/"test": the types they are scored on (None: all)
    old_spans: list[list[Span]] = field(default_factory=list)  # the source's entities on each training sentence
    marginals: list | None = None  # soft: its marginals on each, (T, K_old) float16, with its tags
    merged: torch.Tensor | None = None  # soft: (K,) the tags the source lacks, counted as its O
    anchor: Anchor | None = None  # grow.anchor > 0: the weights shared with the source, pulled back to it

    @classmethod
    def start(cls, config: Config, where: str = "the config") -> "Growth":
        """The source model read (its config, vocabulary and nerkit.json, not yet its weights) and the
        run's config grown from it (`where`: the config's file, for its errors); a config already
        grown from it stays as it is."""
        options = config.grow
        check_input(options.source, "--from (grow.source)", "no such model directory", directory=True, fix=FROM_FIX)
        source = Path(options.source)
        if ModelDir.read(source).is_export:
            raise UserError("an ONNX export cannot grow (its weights are a graph)", where=str(source),
                            fix="pass the model directory it was exported from")
        files = read_model_dir(source)
        grown = grown_config(config, files.config, where)
        if options.targets == "soft" and not head_traits(grown).supports_marginals:
            raise UserError(f"grow.targets: soft reads a CRF's marginals, and the model {source} has model.head: "
                            f"{grown.model.head}", where=str(source), fix="use grow.targets: hard (--set grow.targets=hard)")
        if grown.data.context == "document":
            raise UserError("a grown model trains on sentences whose old types are partly unknown, which data.context: "
                            "document cannot read", where=str(source), fix="set data.context: sentence")
        return cls(grown, source, files.model_dir.meta, list(files.vocab["tags"]), teacher_sha256(source))

    @property
    def old_types(self) -> list[str]:
        return sorted({split_tag(t)[1] for t in self.source_tags if t != "O"})

    @property
    def soft(self) -> bool:
        return self.config.grow.targets == "soft"

    @property
    def checksums(self) -> dict:
        return {SOURCE_KEY: self.sha256}

    def check(self, splits: Splits) -> None:
        """The corpus's types are new ones, and (with tags) in the source's scheme; dev and test are
        scored on the types they carry when they lack some of the grown model's. (`nerkit train
        --dry-run` checks it too.)"""
        where, source_scheme = self.config.data.train, detect_scheme(self.source_tags)
        taken = sorted(set(splits.types) & set(self.old_types))
        # With no targets from the source the corpus's labels are all there is to learn: a corpus
        # labelled for every type (Label Studio's annotations, nerkit.tools.loop) fine-tunes the
        # model, its new types growing the head.
        if taken and self.config.grow.targets != "none":
            raise UserError(f"the corpus labels {', '.join(taken)}, which the model {self.source} already has: a "
                            "corpus for growing a model labels its new types only", where=where,
                            fix=f"remove its {', '.join(taken)} entities (the model's own are its targets), or train "
                                "a new model on a corpus labelled for every type")
        if head_traits(self.config).has_tags and splits.scheme != source_scheme:
            raise UserError(f"the corpus tags in {splits.scheme.upper()}, the model {self.source} in "
                            f"{source_scheme.upper()}", where=where,
                            fix=f"set data.scheme: {source_scheme} (--set data.scheme={source_scheme}): its "
                                "entities are re-tagged in the model's scheme")
        self.new_types = sorted(set(splits.types) - set(self.old_types))
        every = set(self.old_types) | set(self.new_types)
        for name, sentences in (("dev", splits.dev), ("test", splits.test)):
            carried = {sp.type for s in sentences or () for sp in s.spans()} & every
            if sentences and carried != every:
                self.scored_types[name] = sorted(carried)
                log.warning(f"{name} labels only {', '.join(sorted(carried)) or 'no type'} of the grown model's "
                            f"{', '.join(sorted(every))}: it is scored on those alone"
                            + (" (the epoch is chosen without the others: give data.dev labelled for every type)"
                               if name == "dev" else ""))

    def pipeline(self, splits: Splits, device) -> Pipeline:
        """The source's targets on the training sentences, then the grown pipeline: the source's
        vocabularies and weights with the tag set of the old and new types (the vocabulary stays
        the source's: a character it lacks reads as <unk>)."""
        old = Pipeline.load(self.source)
        old.device = torch.device(device)  # the run's (a resolved one: cuda:1, say)
        old.model.to(old.device)
        self.check(splits)
        self.source_targets(old, splits.train)
        tags = scheme_tags(self.old_types + self.new_types, old.scheme)
        base = old.featurizer
        featurizer = Featurizer.from_config(self.config, base.chars, base.bichars, tags, base.words, base.lexicon)
        pipe = Pipeline(self.config, featurizer, device, old.model.lm)
        for name, module in old.model.named_children():  # every part but the head, exactly
            if name != "head":
                getattr(pipe.model, name).load_state_dict(module.state_dict())
        head_shared = pipe.model.head.grow_from(old.model.head, old.span_score_map)
        if self.config.grow.anchor:
            self.anchor = Anchor.of(pipe.model, head_shared, self.config.grow.anchor)
        pipe.span_threshold = old.span_threshold  # training chooses it again (span.choose_threshold)
        pipe.train_max_len = max([old.train_max_len or 0, *(len(s) for s in splits.train)]) or None
        unseen = sum(1 for s in splits.train for c in featurizer.units(s.tokens).chars if c not in base.chars)
        log.info(f"growing {self.source} ({', '.join(self.old_types)}) by {', '.join(self.new_types)}: "
                 f"{self.config.grow.targets} targets for the old types from the model"
                 + (f", weight {self.config.grow.weight:g}" if self.soft else "")
                 + (f", anchored to its weights (L2-SP, grow.anchor {self.anchor.strength:g})" if self.anchor else "")
                 + (f"; {unseen:,} training characters outside its vocabulary read as <unk>" if unseen else ""))
        if self.soft:
            self.merged = torch.tensor([t != "O" and split_tag(t)[1] in self.new_types for t in tags])
        return pipe

    def source_targets(self, old: Pipeline, sentences: list[Sentence]) -> None:
        """The source's entities on each sentence (what it predicts), and with soft targets its CRF
        marginals over its tags, each sentence read whole."""
        if self.config.grow.targets == "none":
            return
        tokens = [s.tokens for s in sentences]
        batch, window = self.config.train.eval_batch_size, max([1, *map(len, tokens)])  # one window a sentence
        self.old_spans = old.predict_tokens(tokens, batch, window)
        if not self.soft:
            return
        self.marginals = [None] * len(tokens)
        with torch.inference_mode():
            for rows, emissions, mask, _ in old.decoded_windows(tokens, batch, window):
                probabilities = old.model.head.crf.marginals(emissions, mask)  # (B, T, K_old)
                for (i, _), found, length in zip(rows, probabilities, mask.sum(1).tolist()):
                    self.marginals[i] = (found[:length].to(torch.float16).cpu(), list(old.tags))

    def examples(self, pipe: Pipeline, sentences: list[Sentence]) -> list[Example]:
        """Each training sentence as an example with its targets (`example`)."""
        return [self.example(pipe, s, i) for i, s in enumerate(sentences)]

    def example(self, pipe: Pipeline, sentence: Sentence, i: int) -> Example:
        """One training sentence's targets. The new types' labels are complete: a character outside
        their entities is no new type's. The source's entities (hard) are the old types' known
        tags, or spans, except one that overlaps a new entity: the new label wins there and that
        old entity becomes unknown for its type. With soft targets the old types are unknown
        everywhere but inside the new entities, and the source's marginals are their target
        outside them. An unknown region of the corpus is unknown for the new types."""
        featurizer, new = pipe.featurizer, sentence.spans()
        if self.config.grow.targets == "none":  # plain fine-tuning: what the corpus does not mark is O
            return featurizer.training_example(sentence)
        kept = [s for s in self.old_spans[i] if not any(overlaps(s, n) for n in new)]
        dropped = [s for s in self.old_spans[i] if any(overlaps(s, n) for n in new)]
        if not pipe.head.has_tags:  # the span head: cells of a type, positive, negative or neither
            index = {t: k for k, t in enumerate(featurizer.types)}
            example = featurizer.example(sentence.tokens)
            example.spans = [(index[s.type], s.start, s.end - s.start - 1) for s in new + kept]
            example.unsure = [(index[s.type], s.start, s.end - s.start - 1) for s in dropped]
            example.known = sentence.known() if sentence.partial else None
            return example
        tags, scheme, length = featurizer.tags, featurizer.scheme, len(sentence)
        old_types = set(self.old_types)
        old_tag = torch.tensor([t == "O" or split_tag(t)[1] in old_types for t in tags])  # (K,)
        new_tags = spans_to_tags(length, new, scheme)
        example = featurizer.example(sentence.tokens, spans_to_tags(length, sorted(new + kept, key=lambda s: s.start),
                                                                      scheme))
        allowed = old_tag.expand(length, len(tags)).clone()  # (T, K): no new type's, any old type's
        known = sentence.known()
        path = spans_to_tags(length, kept, scheme)
        undecided = {t for s in dropped for t in range(s.start, s.end)}
        for t in range(length):
            if new_tags[t] != "O":
                allowed[t] = one_tag(tags, new_tags[t])
            elif not known[t] and (self.soft or t in undecided):
                allowed[t] = True  # nobody annotated it: no type is known there
            elif not self.soft and t not in undecided:
                allowed[t] = one_tag(tags, path[t])  # the source's tag; where it says O, unknown for the new types
                if not known[t] and path[t] == "O":
                    allowed[t] |= ~old_tag
        example.allowed = allowed
        if self.soft:
            found, source_tags = self.marginals[i]
            teacher = torch.zeros(length, len(tags), dtype=torch.float16)
            teacher[:, [tags.index(t) for t in source_tags]] = found
            inside = torch.tensor([t != "O" for t in new_tags])
            example.teacher = teacher.masked_fill(inside[:, None], 0.0)  # the new label wins inside its entities
        return example

    def loss(self, model, batch) -> torch.Tensor:
        """A batch's loss: the head's over the tags or spans each position allows (hard targets are
        among them), with soft targets plus grow.weight x the KL of the source's marginals, and with
        grow.anchor plus the anchor's penalty."""
        if not self.soft:
            loss = model.loss(batch)
        else:
            loss = model.loss_with_teacher(batch, self.merged.to(batch.mask.device), self.config.grow.weight)
        return loss if self.anchor is None else loss + self.anchor.penalty()

    @property
    def record(self) -> dict:
        """nerkit.json's `grown_from`: the source model (its path, name, nerkit version, checksum and
        types, and what it grew from itself), the types added and how the old ones were taught (and
        anchored)."""
        meta, options = self.source_meta, self.config.grow
        return {"path": str(self.source), "name": self.source.resolve().name, "nerkit_version": meta.get("nerkit_version"),
                "sha256": self.sha256, "types": self.old_types, "new_types": self.new_types,
                "targets": options.targets, **({"weight": options.weight} if self.soft else {}),
                **({"anchor": options.anchor} if options.anchor else {}),
                **({"grown_from": meta["grown_from"]} if meta.get("grown_from") else {})}


def one_tag(tags: list[str], tag: str) -> torch.Tensor:
    """(K,) bool: `tag` alone."""
    return torch.tensor([t == tag for t in tags])
