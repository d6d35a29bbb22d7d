"""`nerkit bench`: train and measure every run of a benchmark matrix (nerkit.tools.bench)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from nerkit.cli.options import (
    Device,
    flag,
)
from nerkit.errors import UserError


bench_app = typer.Typer(invoke_without_command=True, help="Train and measure every run of a benchmark matrix "
                        "(`nerkit bench --matrix FILE`), or simulate the annotation loop (`nerkit bench loop`).")


@bench_app.callback()
def bench(
    ctx: typer.Context,
    matrix: Optional[Path] = typer.Option(None, "--matrix", help="Matrix YAML, e.g. configs/bench/full.yaml."),
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
    if ctx.invoked_subcommand is not None:
        return
    if matrix is None:
        raise UserError("nerkit bench needs --matrix FILE (or a subcommand: loop)", fix="see `nerkit bench --help`")
    from nerkit.tools.bench import parse_seeds, run_bench

    table, failed = run_bench(matrix, out, quick=quick, only=only, resume=resume, device=device,
                              markdown_only=markdown_only, sets=set_, seeds=parse_seeds(seeds), jobs=jobs)
    typer.echo(table, nl=False)
    if failed:
        raise typer.Exit(1)


@bench_app.command("loop")
def loop(
    config: Path = typer.Option(..., "--config", "-c", help="The model's config (its data.train is the pool, "
                                "data.dev selects and data.test scores), e.g. configs/peopledaily_bilstm.yaml."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for results.jsonl (and, while it runs, the state)."),
    start: int = typer.Option(200, "--start", min=1, help="Random training sentences of round 0."),
    add: int = typer.Option(200, "--add", min=1, help="Sentences chosen in each round after."),
    rounds: int = typer.Option(5, "--rounds", min=1, help="Rounds after round 0."),
    seeds: str = typer.Option("1,2,3", "--seeds", help="Comma-separated seeds: each its own start and training."),
    strategies: str = typer.Option("uncertainty,random", "--strategies", help="Comma-separated: uncertainty, random."),
    dev_limit: int = typer.Option(0, "--dev-limit", min=0, help="Select each run's epoch on the first N dev "
                                  "sentences (0: all); all of them are scored."),
    set_: List[str] = typer.Option([], "--set", help="Override a config value of every round: --set train.epochs=10."),
    device: Optional[Device] = typer.Option(None, "--device", help="train.device of every round."),
    resume: bool = flag("--resume", help="Go on with the loop in --out where it stopped."),
):
    """Simulate the annotation loop with the gold labels as the annotator: dev and test F1 by round,
    choosing by uncertainty against at random."""
    from nerkit.tools.bench import parse_seeds
    from nerkit.tools.bench.loop import LoopOptions, simulate, summary
    from nerkit.tools.select import STRATEGIES

    chosen = tuple(s.strip() for s in strategies.split(",") if s.strip())
    if not chosen or set(chosen) - set(STRATEGIES):
        raise UserError(f"--strategies takes {', '.join(STRATEGIES)}, not {strategies!r}")
    options = LoopOptions(start, add, rounds, tuple(parse_seeds(seeds)), chosen, dev_limit)
    records = simulate(config, set_, out, options, resume=resume, device=device)
    typer.echo(summary(records), nl=False)
