"""`nerkit bench`: train and measure every run of a benchmark matrix (nerkit.tools.bench)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from nerkit.cli.options import (
    Device,
    flag,
)


def bench(
    matrix: Path = typer.Option(..., "--matrix", help="Matrix YAML, e.g. configs/bench/full.yaml."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output directory (default bench-out/MATRIX_NAME)."),
    quick: bool = flag("--quick", help="Apply the matrix's quick: overrides (a small slice, minutes)."),
    only: List[str] = typer.Option([], "--only", help="Only the runs with this name or name prefix (repeatable, or a,b)."),
    resume: bool = flag("--resume", help="Skip runs recorded as ok in OUT/results.jsonl; continue a run from its "
                        "checkpoint when only train limits, threads or device changed (e.g. a larger "
                        "train.time_budget); a run whose model or data changed starts over, saying what "
                        "changed (its old log kept as logs/NAME.previous.log)."),
    device: Optional[Device] = typer.Option(None, "--device", help="train.device of every run."),
    markdown_only: bool = flag("--markdown-only", help="Only rebuild RESULTS.md from results.jsonl."),
    set_: List[str] = typer.Option([], "--set", help="Override a config value of every run: --set train.time_budget=900."),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Comma-separated seeds replacing every entry's, e.g. 1,2."),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Runs trained at once (each its own process)."),
):
    """Train and measure every run of a benchmark matrix, each in its own process; exit 1 if any failed."""
    from nerkit.tools.bench import parse_seeds, run_bench

    table, failed = run_bench(matrix, out, quick=quick, only=only, resume=resume, device=device,
                              markdown_only=markdown_only, sets=set_, seeds=parse_seeds(seeds), jobs=jobs)
    typer.echo(table, nl=False)
    if failed:
        raise typer.Exit(1)
