"""The run directory of `nerkit train --out`: checking it before a run (fresh, --force, --resume),
with the files the config names and what `--dry-run` reads, preparing it, and the run's config saved
beside the model and read back on a resume."""

from __future__ import annotations

import logging
import shutil
from dataclasses import replace
from pathlib import Path

from nerkit.config import RESUMABLE_KEYS, Config, config_to_yaml, load_config
from nerkit.data.splits import check_data_files
from nerkit.errors import UserError
from nerkit.files import CHECKPOINT, atomic_write_text, check_output_directory
from nerkit.inference.model_dir import CONFIG_FILE, META_FILE
from nerkit.training.build import check_pretrained_files
from nerkit.training.distributed import (
    check_batch_size,
)

log = logging.getLogger(__name__)


# What a training run writes in its directory first; any of them marks an earlier run that --force may replace.
RUN_MARKERS = (CONFIG_FILE, META_FILE, "metrics.jsonl", CHECKPOINT)


def is_run_dir(directory: Path) -> bool:
    return any((directory / name).exists() for name in RUN_MARKERS)


def input_files(config: Config) -> list[str]:
    """Every file or directory a run reads (corpora, vectors, language models, a lexicon): its
    output directory must hold none of them."""
    paths = [config.data.train, config.data.dev, config.data.test, config.lexicon.source,
             config.embeddings.char_vectors, config.embeddings.bichar_vectors, config.embeddings.word_vectors,
             *(source.path for source in config.embeddings.lm_sources())]
    return [p for p in paths if p and p != "jieba"]


def check_output_dir(out: Path, force: bool, config: Config | None = None) -> None:
    """Raise a UserError if a new run could not write its model directory `out`: a file there, a
    directory that is not empty (unless `force` replaces an earlier run's), one that holds what the
    run reads, or a place it cannot create or write."""
    check_output_directory(out, force, own=is_run_dir, inputs=input_files(config) if config else (),
                           what="an earlier run's directory")


def check_run(config: Config, out: Path, force: bool, resume: bool, world_size: int = 1,
              writes: bool = True) -> None:
    """What a run checks before it reads any data: a grow.anchor has its grow.source (GrowConfig.check,
    which the file's load cannot, `--from` coming after it), the corpora and the pretrained inputs exist, the
    global batch splits over the `world_size` processes, and a new run's output directory is usable
    (`--force` replaces a non-empty one; a resumed run continues in its own). `writes`: whether this
    process writes the output directory (rank 0 alone does). A model grown from another
    (`grow.source`) reads no pretrained input: its weights are the source's."""
    config.grow.check("the config")
    check_data_files(config)
    if not config.grow.source:
        check_pretrained_files(config)
    check_batch_size(config.train.batch_size, world_size)
    if writes and not resume:
        check_output_dir(out, force, config)


def read_for_dry_run(config: Config) -> None:
    """What `nerkit train --dry-run` does after `check_run`: read the corpora as the run would (a
    corpus error shows now, not after the model is built), and say how many steps they make, with
    the run's warning when the warm-up takes too much of them."""
    from nerkit.data.splits import read_splits
    from nerkit.training.schedule import run_steps, warn_long_run_warmup

    splits = read_splits(config)
    if config.grow.source:  # the corpus's types and scheme against the model it grows
        from nerkit.training.grow import Growth

        Growth.start(config).check(splits)
    steps_per_epoch, total_steps = run_steps(config, len(splits.train))
    log.info(f"train: {len(splits.train):,} sentences, {steps_per_epoch:,} batches an epoch, "
             f"{total_steps:,} steps in all")
    warn_long_run_warmup(config, steps_per_epoch, total_steps)


def prepare_output_dir(out: Path, force: bool) -> None:
    check_output_dir(out, force)
    if out.exists() and any(out.iterdir()):
        shutil.rmtree(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the output directory ({e.strerror})", where=str(out)) from None


def save_run_config(out: str | Path, config: Config) -> None:
    """The run's resolved config, beside its model: the directory keeps explaining itself."""
    atomic_write_text(Path(out) / CONFIG_FILE, config_to_yaml(config))


def resume_config(out: str | Path, overrides: list[str] = ()) -> Config:
    """The resolved config saved with a run, for `nerkit train --resume DIR [--set train.epochs=N]`."""
    path = Path(out) / CONFIG_FILE
    if not path.is_file():
        raise UserError("not a training run directory (no config.yaml)", where=str(out),
                        fix="pass the --out directory of an interrupted `nerkit train`")
    for text in overrides:
        key = text.split("=", 1)[0].strip()
        if key not in RESUMABLE_KEYS:
            raise UserError(f"--set {key} cannot change when resuming", where=str(path),
                            fix=f"a resumed run may change only {', '.join(sorted(RESUMABLE_KEYS))}")
    return load_config(path, overrides)


def run_config(config: str | Path | None, resume: str | Path | None, overrides: list[str] = (),
               out: str | Path | None = None, grow_from: str | Path | None = None) -> Config:
    """The config a `nerkit train` runs: the file's (`config`) or, to continue a run, the one saved
    in `resume`, with `overrides`; its output_dir is `out`, else the resumed run's, else its own.
    `grow_from`: the trained model it adds types to (`grow.source`, `nerkit train --from`), whose
    architecture it then has (nerkit.training.grow)."""
    if resume is not None:
        if config is not None:
            raise UserError("--resume continues a run with its saved config", fix="drop --config when resuming")
        if grow_from is not None:
            raise UserError("--resume continues a run from the model it started from (its config.yaml's grow.source)",
                            fix="drop --from when resuming")
        loaded, out = resume_config(resume, list(overrides)), resume
    elif config is None:
        raise UserError("no config given", fix="pass --config FILE (e.g. configs/demo.yaml) or --resume DIR")
    else:
        loaded = load_config(config, list(overrides))
    if grow_from is not None:
        from nerkit.training.grow import Growth

        loaded = Growth.start(replace(loaded, grow=replace(loaded.grow, source=str(grow_from))), str(config)).config
    loaded.grow.check(str(config or Path(resume) / CONFIG_FILE))
    return loaded if out is None else replace(loaded, output_dir=str(out))
