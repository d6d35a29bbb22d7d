"""The `nerkit` command line: each command parses its options, calls one function, and prints its
result on stdout; diagnostics go to stderr through `logging` (`--quiet`, `--verbose`).

A `UserError` anywhere ends the program with its message and exit code 2; `--debug` (anywhere on
the command line) shows the traceback instead. Options with a fixed set of values or a range are
declared so, and the config is checked where it loads (config.py), so no command validates twice.
"""

from __future__ import annotations

import inspect
import logging
import sys

import typer
from typer._click.exceptions import (  # the click that typer carries
    NoArgsIsHelpError,
    UsageError,
)

from nerkit import __version__
from nerkit.cli.bench import bench_app
from nerkit.cli.data import data_app
from nerkit.cli.distill import distill
from nerkit.cli.lexicon import lexicon_app
from nerkit.cli.export import export
from nerkit.cli.lm import lm_app
from nerkit.cli.model import calibrate, evaluate, predict, report
from nerkit.cli.options import flag
from nerkit.cli.plot import plot_app
from nerkit.cli.serve import serve
from nerkit.cli.shards import shards_app
from nerkit.cli.train import train
from nerkit.cli.vectors import vectors_app
from nerkit.ending import end_process
from nerkit.errors import Interrupted, JobError, UserError
from nerkit.log import configure_logging

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
                  help="nerkit: train, evaluate and apply Chinese named-entity recognisers.")

# One module per command group; the order here is the order of `nerkit --help`.
app.command()(train)  # nerkit/cli/train.py
app.command()(distill)  # nerkit/cli/distill.py
app.command("eval")(evaluate)  # nerkit/cli/model.py
app.command()(predict)
app.add_typer(shards_app, name="shards")  # nerkit/cli/shards.py
app.command()(serve)  # nerkit/cli/serve.py
app.command()(export)  # nerkit/cli/export.py
app.command()(report)  # nerkit/cli/model.py
app.command()(calibrate)  # nerkit/cli/model.py
app.add_typer(bench_app, name="bench")  # nerkit/cli/bench.py
app.add_typer(data_app, name="data")  # nerkit/cli/data.py
app.add_typer(vectors_app, name="vectors")  # nerkit/cli/vectors.py
app.add_typer(plot_app, name="plot")  # nerkit/cli/plot.py
app.add_typer(lm_app, name="lm")  # nerkit/cli/lm.py
app.add_typer(lexicon_app, name="lexicon")  # nerkit/cli/lexicon.py


def _one_line_summaries(group: typer.Typer) -> None:
    """Give each command of `group` (and of the groups under it) its docstring's first paragraph
    as one line for the list of commands: in its default (rich) markup mode typer keeps the
    docstring's line breaks there, though not in the command's own --help, so a summary wrapped in
    the source broke mid-sentence at every width."""
    for info in group.registered_commands:
        if info.short_help is None and info.callback is not None and info.callback.__doc__:
            info.short_help = " ".join(inspect.cleandoc(info.callback.__doc__).split("\n\n")[0].split())
    for sub_group in group.registered_groups:
        _one_line_summaries(sub_group.typer_instance)


_one_line_summaries(app)


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
    except Interrupted as e:  # Ctrl-C or SIGTERM stopped training after its checkpoint: not an error
        if str(e):  # rank 0's says how to go on; other ranks stay silent
            print(f"nerkit: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    # Ctrl-C outside training ends with 130 and a closed pipe with 1 inside typer itself (predict
    # handles its own closed pipe and ends with 0); training saves a checkpoint first and says so.


def process_main() -> None:
    """`main` as a process's entry point (`python -m nerkit`, the `nerkit` script, `nerkit.cli:main`):
    the same exit code, without the interpreter's teardown (nerkit.ending)."""
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    end_process(code)


if __name__ == "__main__":  # `python -m nerkit.cli.app` as well as `python -m nerkit` and `nerkit`
    process_main()
