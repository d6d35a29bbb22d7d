"""`nerkit export`: a model directory as an ONNX model directory (the `onnx` extra) that `nerkit
predict` and `nerkit eval` run on ONNX Runtime, without torch.

The command parses its options, calls `nerkit.tools.onnx.export.export_model` and prints what it wrote;
the graph and its checks are described in docs/export.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Optional

import typer

from nerkit.cli.options import flag
from nerkit.inference.model_dir import EXPORT_FORMATS, QUANTIZE

ExportFormat = Literal[EXPORT_FORMATS]


Quantize = Literal[QUANTIZE]


def export(
    model: Path = typer.Option(..., "--model", "-m", help="Model directory written by `nerkit train`."),
    out: Path = typer.Option(..., "--out", "-o", help="The model directory to write: a new or empty one, or "
                             "an earlier export with --force."),
    fmt: ExportFormat = typer.Option("onnx", "--format", "-f", help="Export format."),
    quantize: Optional[Quantize] = typer.Option(None, "--quantize", help="Store the linear and LSTM layers' weights as "
                                                "int8 (dynamic quantisation): smaller and faster on a CPU, "
                                                "tags mostly but not always the same."),
    force: bool = flag("--force", help="Replace --out if it holds an earlier ONNX export (never anything else)."),
):
    """Export a model to ONNX: the network, the constrained CRF decoding and all, in one graph that
    gives tag ids; the directory written runs with `nerkit predict` and `nerkit eval`, without torch."""
    from nerkit.tools.onnx.export import export_model

    summary = export_model(model, out, fmt, quantize, force)
    typer.echo(json.dumps(summary))
