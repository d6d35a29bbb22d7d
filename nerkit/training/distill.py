"""Distillation's side of the training loop (`nerkit distill`): the unlabelled sequences with their
teachers' targets, as the student's examples; the batches of them that an epoch mixes among the
gold batches (`distill.ratio` of them per gold batch, the text cycling across epochs); and the loss
of one such batch, soft (KL of the teachers' averaged marginals against the student's, at
`distill.temperature`) or hard (the teachers' best path as the CRF's target), which the loop weighs
by `distill.weight` in one more named step (`nerkit.training.loop.distill_step`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch

from nerkit.config import DistillConfig
from nerkit.data.tags import detect_scheme, split_tag
from nerkit.errors import UserError
from nerkit.features.batch import Batch, bucketed_batches, collate
from nerkit.model.crf import CRF
from nerkit.training.distill_cache import TeacherTargets


@dataclass
class UnlabelledBatch:
    """A step on unlabelled sequences (their indices), among an epoch's gold batches."""
    indices: list[int]


def check_tags(teacher_tags: list[str], student_tags: list[str], where: str) -> None:
    """A teacher's tag set (of the model directory `where`) must be the student's (names; the order
    may differ). Refused in one line that says which differs, with the fix that fits: the entity
    types (each side's own, a few named), or only the tag scheme (then data.scheme is the fix)."""
    if sorted(teacher_tags) == sorted(student_tags):
        return
    teacher_types, student_types = _types(teacher_tags), _types(student_tags)
    if teacher_types != student_types:
        only_teacher, only_student = teacher_types - student_types, student_types - teacher_types
        differ = ([f"the teacher's {_few(only_teacher)} not in it"] if only_teacher else []) + \
                 ([f"its {_few(only_student)} not the teacher's"] if only_student else [])
        raise UserError(f"a teacher of other entity types than the student's corpus ({'; '.join(differ)})",
                        where=where, fix="train the teacher on a corpus with the student's types")
    teacher_scheme, student_scheme = detect_scheme(teacher_tags), detect_scheme(student_tags)
    raise UserError(f"a teacher that tags in {teacher_scheme.upper()}, the student's corpus in {student_scheme.upper()}",
                    where=where, fix=f"set data.scheme: {teacher_scheme} in the student's config "
                    f"(or --set data.scheme={teacher_scheme})")


def _types(tags: list[str]) -> set[str]:
    return {kind for kind in (split_tag(tag)[1] for tag in tags) if kind is not None}


def _few(types: set[str], shown: int = 5) -> str:
    """"A, B, C, D, E and 4 more" of a set of types."""
    named = sorted(types)
    more = f" and {len(named) - shown} more" if len(named) > shown else ""
    return ", ".join(named[:shown]) + more


# The fields of distill (DistillConfig) that a student's nerkit.json records under
# distilled_from.options: how it learnt (window is recorded beside them, the cache is a path of
# the machine it ran on).
RECORDED_OPTIONS = ("targets", "temperature", "weight", "ratio", "text_limit")


def recorded_options(options: DistillConfig) -> dict:
    """distilled_from.options of a student's nerkit.json: RECORDED_OPTIONS of `options`."""
    return {name: getattr(options, name) for name in RECORDED_OPTIONS}


def marginals_read(options: DistillConfig, teachers: int) -> bool:
    """Whether training reads the teachers' marginals: soft targets are them, and several teachers'
    best path is taken over their average (`combined_targets`); one teacher's hard targets are its
    own best path, and its marginals are then neither computed nor cached."""
    return options.targets == "soft" or teachers > 1


def joined(per_text: list[TeacherTargets]) -> tuple[torch.Tensor | None, torch.Tensor, list[int]]:
    """One teacher's targets over several texts, in order: marginals (None when not cached), paths, offsets."""
    offsets = [0]
    for targets in per_text:
        offsets += [offsets[-1] + n for n in targets.offsets[1:]]
    marginals = None if per_text[0].marginals is None else torch.cat([t.marginals for t in per_text])
    return marginals, torch.cat([t.paths for t in per_text]), offsets


def combined_targets(teachers: list[list[TeacherTargets]], student_tags: list[str]
                     ) -> tuple[torch.Tensor | None, torch.Tensor, list[int]]:
    """The teachers' averaged marginals (characters, K) float16 (None when one teacher's targets
    hold none: `marginals_read`) and best paths (characters,) in the student's tag order. One
    teacher: its Viterbi path. Several: the valid path that maximises the sum of the log averaged
    marginals (a constrained Viterbi over them), since per-position argmaxes may break the tag scheme."""
    total, paths, offsets = None, None, None
    for per_text in teachers:
        marginals, teacher_paths, offsets = joined(per_text)
        if marginals is not None:
            order = [per_text[0].tags.index(t) for t in student_tags]  # student column -> teacher column
            total = marginals[:, order].float() + (total if total is not None else 0.0)
        to_student = torch.tensor([student_tags.index(t) for t in per_text[0].tags])
        paths = to_student[teacher_paths.long()]
    averaged = None if total is None else total / len(teachers)
    if len(teachers) > 1:
        paths = posterior_paths(averaged, offsets, student_tags)
    return None if averaged is None else averaged.to(torch.float16), paths, offsets


def posterior_paths(marginals: torch.Tensor, offsets: list[int], tags: list[str], rows: int = 256) -> torch.Tensor:
    """Each sequence's valid path of the largest summed log marginal (the CRF's constrained Viterbi
    with no scores of its own), concatenated."""
    crf = CRF(tags)
    with torch.no_grad():
        for parameter in crf.parameters():
            parameter.zero_()
    log_probs = marginals.clamp(min=1e-12).log()
    found = []
    for first in range(0, len(offsets) - 1, rows):
        spans = list(zip(offsets[first:first + rows], offsets[first + 1:first + rows + 1]))
        width = max(b - a for a, b in spans)
        emissions = torch.zeros(len(spans), width, len(tags))
        mask = torch.zeros(len(spans), width, dtype=torch.bool)
        for row, (a, b) in enumerate(spans):
            emissions[row, :b - a], mask[row, :b - a] = log_probs[a:b], True
        found += [torch.tensor(path) for path in crf.decode(emissions, mask)]
    return torch.cat(found) if found else torch.zeros(0, dtype=torch.long)


@dataclass
class Distillation:
    """The unlabelled sequences (`units`, each a list of characters) and their targets, ready for the
    loop; `attach` makes them the student's examples once its featuriser exists. `checksums` go
    into the run's checkpoint (a resume with another teacher or text is refused); `record` into the
    student's nerkit.json."""
    options: DistillConfig
    units: list[list[str]]
    teachers: list[list[TeacherTargets]]  # per teacher, per text
    checksums: dict
    record: dict
    seed: int = 0
    examples: list = field(default_factory=list)
    marginals: torch.Tensor | None = None
    offsets: list[int] = field(default_factory=list)
    _passes: dict = field(default_factory=dict)

    def attach(self, featurizer) -> None:
        """The units as the student's examples, with the teachers' targets in its tag order."""
        self.marginals, paths, self.offsets = combined_targets(self.teachers, list(featurizer.tags))
        self.examples = []
        for i, tokens in enumerate(self.units):
            example = featurizer.example(tokens)
            example.tag_ids = paths[self.offsets[i]:self.offsets[i + 1]].tolist()
            self.examples.append(example)
        self.teachers = []  # their tensors are in `marginals` now

    @property
    def lengths(self) -> list[int]:
        return [len(u) for u in self.units]

    def steps_per_epoch(self, gold_batches: int) -> int:
        return round(self.options.ratio * gold_batches) if self.units else 0

    def _pass(self, number: int, batch_size: int) -> list[list[int]]:
        """The text's batches in pass `number` over it: its own seeded order, bucketed by length."""
        if number not in self._passes:
            self._passes = {number: bucketed_batches(self.lengths, batch_size, random.Random(self.seed * 7919 + number))}
        return self._passes[number]

    def mix(self, gold: list, epoch: int, batch_size: int) -> list:
        """The epoch's steps: the gold batches with `steps_per_epoch` unlabelled ones spread evenly
        among them, continuing through the text where the previous epoch stopped (a resume
        recomputes the same list from the seed)."""
        count = self.steps_per_epoch(len(gold))
        if not count:
            return gold
        per_pass = math.ceil(len(self.units) / batch_size)
        unlabelled = []
        for g in range((epoch - 1) * count, epoch * count):
            unlabelled.append(UnlabelledBatch(self._pass(g // per_pass, batch_size)[g % per_pass]))
        keyed = [((j + 0.5) / len(gold), 0, b) for j, b in enumerate(gold)]
        keyed += [((j + 0.5) / count, 1, b) for j, b in enumerate(unlabelled)]
        return [b for _, _, b in sorted(keyed, key=lambda k: k[:2])]

    def targets(self, indices: list[int], width: int) -> torch.Tensor:
        """The averaged marginals of the sequences `indices`, padded to `width`: (B, width, K) float32."""
        out = torch.zeros(len(indices), width, self.marginals.size(1))
        for row, i in enumerate(indices):
            a, b = self.offsets[i], self.offsets[i + 1]
            out[row, :b - a] = self.marginals[a:b].float()
        return out

    def loss(self, model, indices: list[int], device) -> tuple[torch.Tensor, int]:
        """The unweighted distillation loss of the sequences `indices` and their characters."""
        batch: Batch = collate([self.examples[i] for i in indices]).to(device)
        if self.options.targets == "hard":
            loss = model.loss(batch)
        else:
            targets = self.targets(indices, batch.mask.size(1)).to(device)
            loss = model.soft_loss(batch, targets, self.options.temperature)
        return loss, sum(len(self.units[i]) for i in indices)
