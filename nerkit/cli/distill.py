"""`nerkit distill`: train a student model on its gold corpus and on unlabelled text tagged by
teacher models (nerkit.tools.distill). The command parses its options, calls one function, and prints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import typer

from nerkit.cli.options import flag


def distill(
    teacher: List[Path] = typer.Option(..., "--teacher", help="A trained nerkit model directory (torch); "
                                       "repeatable: several teachers' marginals are averaged."),
    text: List[Path] = typer.Option(..., "--text", "-t", help="Unlabelled text, one text a line (as `nerkit "
                                    "predict` reads it); repeatable."),
    config: Path = typer.Option(..., "--config", "-c", help="The student's YAML config: its gold corpus, model, "
                                "training and `distill:` section."),
    out: Path = typer.Option(..., "--out", "-o", help="The student's model directory."),
    set_: List[str] = typer.Option([], "--set", help="Override a config value: --set distill.targets=hard "
                                   "(repeatable)."),
    resume: bool = flag("--resume", help="Continue the interrupted run in --out (the same teachers, text and config)."),
    force: bool = flag("--force", help="Replace a non-empty output directory."),
):
    """Distil teacher models into a (faster) student through unlabelled text."""
    from nerkit.config import load_config
    from nerkit.tools.distill import distill as run

    # Ctrl-C or SIGTERM: Interrupted, the CLI's to report (its message says how to resume)
    metrics = run(load_config(config, list(set_)), teacher, text, out, force=force, resume=resume)
    summary = {"best_epoch": metrics["best_epoch"], "dev_f1": round(100 * metrics["dev"]["f1"], 2)}
    if "test" in metrics:
        summary["test_f1"] = round(100 * metrics["test"]["f1"], 2)
    summary["unlabelled_sequences"] = sum(t["sequences"] for t in metrics["distillation"]["texts"])
    summary["cache"] = metrics["cache"]
    typer.echo(json.dumps(summary, ensure_ascii=False))
