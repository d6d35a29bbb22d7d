"""`nerkit train`: train a model from a YAML config, resume a run, check a config with
`--dry-run`, or start several processes with `--nproc` (nerkit.training)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from nerkit.cli.options import (
    flag,
)


def train(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config file."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Model directory (default: the config's output_dir)."),
    set_: List[str] = typer.Option([], "--set", help="Override a config value: --set train.lr=0.01 (repeatable)."),
    dry_run: bool = flag("--dry-run", help="Print the fully resolved config, check that every file it names "
                         "exists and --out is usable, read the corpora as the run would (with its "
                         "warnings), and exit."),
    force: bool = flag("--force", help="Replace a non-empty output directory."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the interrupted run in this directory."),
    from_: Optional[Path] = typer.Option(None, "--from", help="A trained model directory to add entity types to: "
                                         "the config's data.train labels the new types only, and the model's "
                                         "architecture, vocabulary and weights are kept (grow.source; docs/grow.md)."),
    nproc: int = typer.Option(1, "--nproc", min=1, help="Processes on this machine (data-parallel, started "
                              "by torchrun); train.batch_size is the global batch they share."),
):
    """Train a model from a YAML config, or resume an interrupted run."""
    from nerkit.config import config_to_yaml
    from nerkit.training.run_dir import run_config

    cfg = run_config(config, resume, set_, out, grow_from=from_)
    if dry_run or nproc > 1:
        from nerkit.training.run_dir import check_run

        if dry_run:
            typer.echo(config_to_yaml(cfg), nl=False)
        from nerkit.training.distributed import World

        world_size = nproc if nproc > 1 else World.from_env().size  # --nproc, or this rank's torchrun world
        check_run(cfg, Path(cfg.output_dir), force, resume is not None, world_size)
    if dry_run:
        from nerkit.training.run_dir import read_for_dry_run

        read_for_dry_run(cfg)
        return
    if nproc > 1:
        from nerkit.training.distributed import launch

        raise typer.Exit(launch(nproc, sys.argv[1:], cfg.output_dir))
    from nerkit.training.loop import train as run_training

    metrics = run_training(cfg, force=force, resume=resume is not None)  # Ctrl-C: Interrupted, the CLI's to report
    if metrics is None:  # a rank other than 0: rank 0 reports
        return
    summary = {k: metrics[k] for k in ("best_epoch", "epochs", "stopped")}
    summary["dev_f1"] = round(100 * metrics["dev"]["f1"], 2)
    if "test" in metrics:
        summary["test_f1"] = round(100 * metrics["test"]["f1"], 2)
    typer.echo(json.dumps(summary))
