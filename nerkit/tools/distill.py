"""`nerkit distill`: a student trained on its gold corpus and on unlabelled text that teacher models
have tagged. Each text is read as `nerkit predict` reads a file (a line is a text; the model's
featuriser normalises it; a line longer than the window is read in overlapping windows), less the
lines that overlap the student's dev or test sets (nerkit.data.overlap, as `nerkit lm adapt
--exclude`); the teachers' targets are cached per (teacher, text) (nerkit.training.distill_cache);
the training loop trains on both (nerkit.training.distill); the student's nerkit.json records what
it learnt from.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from pathlib import Path

from nerkit.config import Config, head_traits
from nerkit.data.overlap import remove_overlaps
from nerkit.data.splits import read_splits
from nerkit.data.stats import sha256_file
from nerkit.data.tags import scheme_tags
from nerkit.errors import UserError
from nerkit.files import check_input
from nerkit.inference.model_dir import WEIGHTS_FILE, ModelDir, update_meta
from nerkit.inference.pipeline import Pipeline
from nerkit.inference.windows import text_windows
from nerkit.tools.resources.lm_adapt import read_lines
from nerkit.training.checkpoint import TEACHING_KEY
from nerkit.training.distill import Distillation, check_tags, marginals_read, recorded_options
from nerkit.training.distill_cache import TargetOptions, cached_targets, default_cache_root, teacher_sha256
from nerkit.training.loop import train
from nerkit.training.run_dir import check_run

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 250  # the unlabelled sequences' length when neither distill.window nor a teacher sets one


def load_teacher(directory: Path, device: str) -> Pipeline:
    """A teacher on torch: any nerkit model directory (an ONNX export has no CRF marginals here)."""
    if ModelDir.read(directory).is_export:
        raise UserError("an ONNX export cannot teach (its marginals need the torch model)", where=str(directory),
                        fix="pass the model directory it was exported from")
    pipe = Pipeline.load(directory, device)
    if not pipe.head.supports_marginals:
        raise UserError(f"a model with model.head: {pipe.config.model.head} cannot teach: distillation uses a "
                        "CRF's marginals", where=str(directory), fix="pass a model trained with model.head: crf")
    return pipe


def text_units(lines: list[str], window: int) -> list[list[str]]:
    """Each line's characters in the windows `nerkit predict` would read it in."""
    return [list(line[a:b]) for line in lines for a, b in text_windows(len(line), window)]


def reading_window(config: Config, teachers: list[Pipeline]) -> int:
    """distill.window, else the smallest prediction window of the teachers (0: none sets one)."""
    if config.distill.window:
        return config.distill.window
    windows = [t.window for t in teachers if t.window]
    return min(windows) if windows else (config.data.max_len or DEFAULT_WINDOW)


def without_evaluation_lines(path: Path, lines: list[str], splits) -> tuple[list[str], dict]:
    """The text's lines less those overlapping the student's dev or test sentences, and the counts."""
    sets = {"dev": [s.text for s in splits.dev]}
    if splits.test:
        sets["test"] = [s.text for s in splits.test]
    kept, reports = remove_overlaps(lines, sets)
    for report in reports:
        log.info(f"{path}: {report.lines_removed:,} lines overlap {report.name} "
                 f"({report.found:,} of its {report.sentences:,} sentences found in the text)")
    log.info(f"{path}: {len(kept):,} of {len(lines):,} lines kept")
    return kept, {"lines": len(lines), "lines_used": len(kept), "lines_excluded": len(lines) - len(kept),
                  "excluded": [r.to_dict() for r in reports]}


def distill(config: Config, teachers: list[Path], texts: list[Path], out: Path, force: bool = False,
            resume: bool = False, progress_bar: bool | None = None, splits=None) -> dict:
    """Train the student of `config` on its gold corpus and on `texts` tagged by `teachers`; returns
    the training's metrics with a `distillation` record (also in OUT/nerkit.json). `splits`: the
    config's, where the caller has read them (`nerkit bench` scores them after)."""
    out = Path(out)
    config = replace(config, output_dir=str(out))
    if not head_traits(config).supports_marginals:
        raise UserError(f"the student has model.head: {config.model.head}; distillation trains a CRF's "
                        "marginals", where="--config", fix="distil into a model with model.head: crf")
    for directory in teachers:  # first, as the paths typed on the command line: a typo fails at once
        check_input(str(directory), "--teacher", "no such model directory", directory=True)
    for path in texts:
        check_input(str(path), "--text", "no such file")
    check_run(config, out, force, resume)
    splits = splits if splits is not None else read_splits(config)
    student_tags = scheme_tags(splits.types, splits.scheme)
    pipes = [load_teacher(Path(t), config.train.device) for t in teachers]
    for directory, pipe in zip(teachers, pipes):
        check_tags(list(pipe.tags), student_tags, str(directory))
    window, dc = reading_window(config, pipes), config.distill
    root = Path(dc.cache) if dc.cache else default_cache_root()
    units, per_teacher, record = [], [[] for _ in pipes], {"teachers": [], "texts": [], "window": window}
    teacher_shas = [teacher_sha256(Path(t)) for t in teachers]
    for path in texts:
        lines = read_lines([path])
        if dc.text_limit:
            lines = lines[:dc.text_limit]
        lines, counts = without_evaluation_lines(path, lines, splits)
        text_sha = sha256_file(path)
        options = TargetOptions(window, dc.temperature, hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest(),
                                marginals=marginals_read(dc, len(teachers)))
        these = text_units(lines, window)
        units += these
        record["texts"].append({"path": str(path), "sha256": text_sha, **counts, "sequences": len(these),
                                "characters": sum(map(len, these))})
        for k, (directory, pipe) in enumerate(zip(teachers, pipes)):
            targets = cached_targets(pipe, Path(directory), teacher_shas[k], text_sha, these, options, root,
                                     config.train.eval_batch_size, progress_bar)
            per_teacher[k].append(targets)
            size = targets.size_bytes()
            log.info(f"teacher {directory} on {path}: {len(these):,} sequences, cache {size / 1e6:.1f} MB "
                     f"({'reused' if not targets.scored else f'{targets.scored:,} scored'}) in {targets.directory}")
    del pipes  # the teachers' weights are not needed while the student trains
    record["teachers"] = [{"path": str(t), "sha256": sha, "weights_sha256": sha256_file(Path(t) / WEIGHTS_FILE)}
                          for t, sha in zip(teachers, teacher_shas)]
    record["options"] = recorded_options(dc)
    cache_use = [{"teacher": str(t), "text": str(p), "scored": targets.scored, "cache": str(targets.directory),
                  "bytes": targets.size_bytes()}
                 for t, per_text in zip(teachers, per_teacher) for p, targets in zip(texts, per_text)]
    checksums = {f"{TEACHING_KEY}{k}_{j}": targets.key for k, per_text in enumerate(per_teacher)
                 for j, targets in enumerate(per_text)}
    if not units:
        raise UserError("no line of the text is left to distil on", where=str(texts[0]),
                        fix="give more text, or text that does not repeat the dev or test sets")
    log.info(f"distillation: {len(units):,} unlabelled sequences ({sum(map(len, units)):,} characters), "
             f"{len(teachers)} teacher(s), {dc.targets} targets, weight {dc.weight:g}, {dc.ratio:g} unlabelled "
             f"batches per gold batch")
    plan = Distillation(dc, units, per_teacher, checksums, record, seed=config.train.seed)
    metrics = train(config, out, force=force, resume=resume, progress_bar=progress_bar, splits=splits, distill=plan)
    update_meta(out, {"distilled_from": record})  # the teachers and texts the student learnt from
    return {**(metrics or {}), "distillation": record, "cache": cache_use}
