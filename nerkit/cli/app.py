"""The `nerkit` command line: each command parses its options, calls one function, and prints its
result on stdout; diagnostics go to stderr through `logging` (`--quiet`, `--verbose`).

A `UserError` anywhere ends the program with its message and exit code 2; `--debug` (anywhere on
the command line) shows the traceback instead. Options with a fixed set of values or a range are
declared so, and the config is checked where it loads (config.py), so no command validates twice.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import List, Literal, Optional

import typer
from typer._click.exceptions import (  # the click that typer carries
    NoArgsIsHelpError,
    UsageError,
)

from nerkit import __version__
from nerkit.cli.export import export
from nerkit.cli.lm import lm_app
from nerkit.cli.plot import plot_app
from nerkit.cli.serve import serve
from nerkit.cli.vectors import vectors_app
from nerkit.config import DEVICES
from nerkit.errors import JobError, UserError
from nerkit.log import configure_logging

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
                  help="nerkit: train, evaluate and apply Chinese named-entity recognisers.")


data_app = typer.Typer(no_args_is_help=True, help="Inspect, check and convert corpus files.")


app.add_typer(data_app, name="data")


app.add_typer(vectors_app, name="vectors")


app.add_typer(plot_app, name="plot")
app.add_typer(lm_app, name="lm")


# Options with a fixed set of values (typer turns a Literal into a choice that it checks).
Device = Literal[DEVICES]


# nerkit.inference.formats.FORMATS (a test keeps them equal)
Format = Literal["jsonl", "conll", "inline", "html", "doccano", "label-studio"]


Target = Literal["bio", "bioes", "bmes", "jsonl", "doccano", "label-studio"]


# nerkit.data.corpus.FORMATS (a test keeps them equal)
Source = Literal["auto", "conll", "jsonl", "cluener", "doccano", "label-studio"]


def flag(*names: str, help: str, default: bool | None = False, **kwargs):
    """A boolean option that --help shows as a plain flag (no metavar), not as one taking `<bool>`
    (typer's own --help keeps its `<bool>`)."""
    return typer.Option(default, *names, metavar="", help=help, **kwargs)


DEVICE = typer.Option("cpu", "--device", help="Where the model runs.")


THREADS = typer.Option(0, "--threads", min=0, help="torch threads (0 = the cores free when nerkit starts).")


WINDOW = typer.Option(None, "--window", min=0, help="Read a text longer than N characters in overlapping windows "
                      "of N (default: the longest training sentence, at most data.max_len; 0 = each text whole).")


def _echo_json(obj) -> None:
    typer.echo(json.dumps(obj, ensure_ascii=False, indent=2))


def _version(value: bool) -> None:
    if value:
        typer.echo(f"nerkit {__version__}")
        raise typer.Exit()


@app.callback()
def options(
    quiet: bool = flag("--quiet", "-q", help="Only warnings and errors on stderr."),
    verbose: bool = flag("--verbose", "-v", help="Also debugging messages on stderr."),
    version: bool = flag("--version", help="Print the version.", callback=_version, is_eager=True),
):
    """nerkit: train, evaluate and apply Chinese named-entity recognisers."""
    configure_logging(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)


@app.command()
def train(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config file."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Model directory (default: the config's output_dir)."),
    set_: List[str] = typer.Option([], "--set", help="Override a config value: --set train.lr=0.01 (repeatable)."),
    dry_run: bool = flag("--dry-run", help="Print the fully resolved config, check that every file it names "
                         "exists and --out is usable, read the corpora as the run would (with its "
                         "warnings), and exit."),
    force: bool = flag("--force", help="Replace a non-empty output directory."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the interrupted run in this directory."),
    nproc: int = typer.Option(1, "--nproc", min=1, help="Processes on this machine (data-parallel, started "
                              "by torchrun); train.batch_size is the global batch they share."),
):
    """Train a model from a YAML config, or resume an interrupted run."""
    from nerkit.config import config_to_yaml, load_config

    if resume is not None:
        from nerkit.training.run_dir import resume_config

        if config is not None:
            raise UserError("--resume continues a run with its saved config", fix="drop --config when resuming")
        cfg, out = resume_config(resume, set_), resume
    elif config is None:
        raise UserError("no config given", fix="pass --config FILE (e.g. configs/demo.yaml) or --resume DIR")
    else:
        cfg = load_config(config, set_)
    if out is not None:
        cfg.output_dir = str(out)
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
    from nerkit.training.loop import Interrupted
    from nerkit.training.loop import train as run_training

    try:
        metrics = run_training(cfg, force=force, resume=resume is not None)
    except Interrupted as e:
        if str(e):  # rank 0's says how to resume; other ranks stay silent
            print(f"nerkit: {e}", file=sys.stderr)
        raise typer.Exit(e.exit_code)
    if metrics is None:  # a rank other than 0: rank 0 reports
        return
    summary = {k: metrics[k] for k in ("best_epoch", "epochs", "stopped")}
    summary["dev_f1"] = round(100 * metrics["dev"]["f1"], 2)
    if "test" in metrics:
        summary["test_f1"] = round(100 * metrics["test"]["f1"], 2)
    typer.echo(json.dumps(summary))


@app.command("eval")
def evaluate(
    model: Path = typer.Option(..., "--model", "-m", help="Model directory."),
    data: Path = typer.Option(..., "--data", "-d", help="Gold corpus (CoNLL or .jsonl)."),
    output: Optional[Path] = typer.Option(None, "--output", help="Write `char gold predicted` lines here."),
    as_json: bool = flag("--json", help="Print the metrics as JSON."),
    batch_size: int = typer.Option(128, "--batch-size", min=1, help="Sentences per batch."),
    repair: Optional[bool] = flag("--repair/--no-repair", default=None, help="Read invalid tag transitions as "
                                  "conlleval does (default: as the model's training data was read)."),
    device: Device = DEVICE,
    threads: int = THREADS,
    show_errors: bool = flag("--errors", help="Also break the errors down by type: wrong type, "
                             "wrong boundary, both, missed, spurious."),
    window: Optional[int] = WINDOW,
):
    """Entity-level precision, recall and F1 of a model on a gold corpus."""
    from nerkit.files import atomic_write_text, check_output
    from nerkit.inference.evaluate import format_errors, format_table
    from nerkit.inference.formats import eval_output
    from nerkit.inference.loading import load_pipeline

    if output:
        check_output(output, data)  # before the evaluation: a wrong path costs no wait
    pipe = load_pipeline(model, device, threads)  # an ONNX export (`nerkit export`) runs without torch
    result = pipe.evaluation(data, batch_size, repair=repair, with_errors=show_errors, window=window)
    if output:
        atomic_write_text(output, eval_output(result.sentences, result.predicted, result.scheme))
    metrics = result.metrics
    if as_json:
        typer.echo(json.dumps(metrics))
    else:
        typer.echo(format_table(metrics))
        if show_errors:
            typer.echo("\n" + format_errors(metrics["errors"]))


@app.command()
def predict(
    source: str = typer.Argument("-", help="Text file, one text per line; - reads stdin."),
    model: Path = typer.Option(..., "--model", "-m", help="Model directory."),
    fmt: Format = typer.Option("jsonl", "--format", "-f", help="Output format (doccano, label-studio: "
                               "pre-annotations to import into those tools)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write here instead of stdout."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Sentences per batch."),
    device: Device = DEVICE,
    threads: int = typer.Option(0, "--threads", min=0, help="torch threads in all, shared out among the "
                                "workers (0 = one per core)."),
    workers: int = typer.Option(1, "--workers", min=1, help="Processes that predict at once, each "
                                "holding a copy of the model (1 = this process)."),
    window: Optional[int] = WINDOW,
):
    """Tag every line of a text file (or stdin, a pipe, /dev/stdin)."""
    from nerkit.inference.stream import predict_file

    predict_file(model, source, str(output) if output else None, fmt, batch_size, device, threads, workers, window)



app.command()(serve)  # nerkit/cli/serve.py


app.command()(export)  # nerkit/cli/export.py


@app.command()
def report(
    model: Path = typer.Option(..., "--model", "-m", help="Model directory."),
    data: Path = typer.Option(..., "--data", "-d", help="Gold corpus (CoNLL or .jsonl)."),
    out: Path = typer.Option(..., "--out", "-o", help="The HTML page to write."),
    batch_size: int = typer.Option(128, "--batch-size", min=1, help="Sentences per batch."),
    repair: Optional[bool] = flag("--repair/--no-repair", default=None, help="Read invalid tag transitions as "
                                  "conlleval does (default: as the model's training data was read)."),
    device: Device = DEVICE,
    threads: int = THREADS,
):
    """One self-contained HTML page: scores, training curves, entity-type confusions, the error
    breakdown and every sentence with an error, filterable by type and kind."""
    from nerkit.device import set_threads
    from nerkit.tools.report import write_report

    set_threads(threads)
    metrics = write_report(model, data, out, batch_size, repair=repair, device=device)
    typer.echo(f"wrote {out} (F1 {100 * metrics['f1']:.2f})")


@app.command()
def bench(
    matrix: Path = typer.Option(..., "--matrix", help="Matrix YAML, e.g. configs/bench/full.yaml."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output directory (default bench-out/MATRIX_NAME)."),
    quick: bool = flag("--quick", help="Apply the matrix's quick: overrides (a small slice, minutes)."),
    only: List[str] = typer.Option([], "--only", help="Only the runs with this name or name prefix (repeatable, or a,b)."),
    resume: bool = flag("--resume", help="Skip runs recorded as ok in OUT/results.jsonl; continue a run from its "
                        "checkpoint when only train limits, threads or device changed (e.g. a larger "
                        "train.time_budget)."),
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


@data_app.command("stats")
def data_stats(
    files: List[Path] = typer.Argument(..., help="Corpus files."),
    as_json: bool = flag("--json", help="Print JSON."),
):
    """Sentences, characters, entities per type, lengths, scheme, invalid transitions, sha256.
    A file that cannot be read gets one error line; the others are still reported (exit 2)."""
    from nerkit.data.stats import files_stats, format_stats

    stats, failures = files_stats(files)
    if as_json:
        _echo_json(stats)
    elif stats:
        typer.echo("\n\n".join(format_stats(s) for s in stats))
    for error in failures:
        print(f"nerkit: error: {error}", file=sys.stderr)
    if failures:
        raise typer.Exit(2)


@data_app.command("validate")
def data_validate(
    file: Path = typer.Argument(..., help="Corpus file."),
    repair: Optional[Path] = typer.Option(None, "--repair", help="Write a repaired copy here."),
):
    """Check a corpus strictly and list its errors (the first 20, and how many); with --repair OUT,
    fix invalid transitions, split tokens of several characters, and write the result."""
    from nerkit.data.corpus import read_corpus, scheme_label, write_corpus

    corpus = read_corpus(file, repair=repair is not None, max_errors=20,
                         repair_option="pass --repair OUT for a repaired copy")
    if repair is not None:
        write_corpus(repair, corpus.sentences, "jsonl" if repair.suffix in (".jsonl", ".json") else corpus.scheme, file)
        split = f", split {corpus.split_tokens} tokens of several characters" if corpus.split_tokens else ""
        typer.echo(f"{file}: repaired {corpus.repaired} tags ({corpus.invalid_transitions} invalid transitions){split}; "
                   f"wrote {repair}")
    else:
        typer.echo(f"{file}: OK, {len(corpus.sentences)} sentences, {scheme_label(corpus.labels)}, "
                   f"types {', '.join(corpus.types) or '-'}")


@data_app.command("convert")
def data_convert(
    source: Path = typer.Argument(..., help="Input corpus (CoNLL or .jsonl; others with --from)."),
    target: Path = typer.Argument(..., help="Output file."),
    to: Target = typer.Option(..., "--to", help="Target tag scheme or format (doccano: its JSONL; label-studio: "
                              "its JSON, a task with one annotation per sentence)."),
    from_: Source = typer.Option("auto", "--from", help="Input format: auto (.jsonl and .json are JSON lines, "
                                 "anything else CoNLL), CLUENER's JSON (cluener), doccano's JSONL export (doccano) "
                                 "or Label Studio's JSON export (label-studio)."),
    repair: bool = flag("--repair", help="Fix invalid transitions and split tokens of several characters "
                        "while reading."),
):
    """Convert between tag schemes and formats."""
    from nerkit.data.corpus import read_corpus, write_corpus

    corpus = read_corpus(source, repair=repair, fmt=from_)
    write_corpus(target, corpus.sentences, to, source, from_)
    typer.echo(f"{source} ({corpus.labels}) -> {target} ({to}), {len(corpus.sentences)} sentences")


def _usage_error(e: UsageError) -> str:
    """A command-line mistake (an unknown option, a value out of its choices or range) as one line."""
    message = " ".join(e.format_message().replace("Value error, ", "").split())
    path = e.ctx.command_path if e.ctx is not None else "nerkit"
    return f"{message} (see `{path} --help`)"


def main() -> None:
    debug = "--debug" in sys.argv[1:]
    try:  # sys.argv keeps --debug for `train --nproc`, which passes it on
        code = app(args=[a for a in sys.argv[1:] if a != "--debug"], prog_name="nerkit", standalone_mode=False)
        sys.exit(code or 0)
    except NoArgsIsHelpError:  # the help has been printed
        sys.exit(2)
    except UsageError as e:
        if debug:
            raise
        print(f"nerkit: error: {_usage_error(e)}", file=sys.stderr)
        sys.exit(2)
    except UserError as e:
        if debug:
            raise
        for line in e.lines():
            print(f"nerkit: error: {line}", file=sys.stderr)
        sys.exit(2)
    except JobError as e:  # a distributed run that lost a process: not the user's doing
        if debug:
            raise
        print(f"nerkit: error: {e}", file=sys.stderr)
        sys.exit(1)


    # Ctrl-C outside training ends with 130 and a closed pipe with 1 inside typer itself (predict
    # handles its own closed pipe and ends with 0); training saves a checkpoint first and says so.


if __name__ == "__main__":  # `python -m nerkit.cli.app` as well as `python -m nerkit` and `nerkit`
    main()
