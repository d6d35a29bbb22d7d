"""Options and choices that several commands share, declared once: typer checks a Literal's values
and an option's range, so no command validates them again."""

from __future__ import annotations

import json
from typing import Literal

import typer

from nerkit.config import DEVICES, FLATS, DataConfig
from nerkit.data import corpus
from nerkit.inference import formats, model_dir

# Options with a fixed set of values (typer turns a Literal into a choice that it checks), each read
# from the module that owns the values.
Device = Literal[DEVICES]

Format = Literal[formats.FORMATS]  # what `nerkit predict --format` writes

Runtime = Literal[("auto", *model_dir.RUNTIMES)]  # auto: what the model directory's nerkit.json says

Target = Literal[corpus.TARGETS]  # what `nerkit data convert --to` writes

Source = Literal[corpus.FORMATS]  # what `nerkit data convert --from` reads

# The flat projections of nested entities (nerkit.data.nesting); leaving the option out is none.
Flat = Literal[FLATS[1:]]


def flag(*names: str, help: str, default: bool | None = False, **kwargs):
    """A boolean option that --help shows as a plain flag (no metavar), not as one taking `<bool>`
    (typer's own --help keeps its `<bool>`)."""
    return typer.Option(default, *names, metavar="", help=help, **kwargs)


DEVICE = typer.Option("cpu", "--device", help="Where the model runs.")

THREADS = typer.Option(0, "--threads", min=0, help="torch threads, or an ONNX export's batches read at once "
                       "(0 = the cores free when nerkit starts).")

WINDOW = typer.Option(None, "--window", min=0, help="Read a text longer than N characters in overlapping windows "
                      "of N (default: the longest training sentence, at most data.max_len; 0 = each text whole; "
                      "a model with encoder.memory reads any text whole, segment by segment).")
MAX_LEN = typer.Option(DataConfig.max_len, "--max-len", min=0, help="Count the texts longer than N characters, "
                       "which training cuts into pieces: the config's data.max_len (0: none).")
RUNTIME = typer.Option("auto", "--runtime", help="What runs the model: auto (what its nerkit.json says: "
                       "torch as trained, onnx for a `nerkit export` directory); torch or onnx also refuse a "
                       "directory made for the other.")
DOCUMENT = flag("--document", help="Read the lines in order as one document (a model with "
                "encoder.memory): each line's context reaches back into the lines before it.")


def echo_json(obj) -> None:
    typer.echo(json.dumps(obj, ensure_ascii=False, indent=2))
