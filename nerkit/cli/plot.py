"""`nerkit plot`: training curves, position encodings and attention maps as PNG or SVG files.

Each command parses its options, calls one function of `nerkit.tools.reports.plot`, and prints the file it wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from nerkit.errors import UserError

plot_app = typer.Typer(no_args_is_help=True, help="Draw training curves, position encodings and attention maps.")


OUT = typer.Option(..., "--out", "-o", help="The image to write: .png or .svg.")


@plot_app.command()
def curves(
    runs: List[Path] = typer.Argument(..., help="Run directories written by `nerkit train` (their metrics.jsonl)."),
    out: Path = OUT,
):
    """Loss, learning rate and dev F1 per epoch of one or more runs, on one figure."""
    from nerkit.tools.reports.plot import plot_curves

    typer.echo(f"wrote {plot_curves(runs, out)}")


@plot_app.command()
def positions(
    out: Path = OUT,
    dim: int = typer.Option(64, "--dim", help="Width of the sinusoidal encodings (even)."),
    max_distance: int = typer.Option(50, "--max-distance", min=1, help="Offsets k from -N to N."),
):
    """What attention reads of positions: sinusoids' P_i . P_i+k, through random projections, and TENER's term."""
    from nerkit.tools.reports.plot import plot_positions

    typer.echo(f"wrote {plot_positions(dim, out, max_distance)}")


@plot_app.command()
def attention(
    model: list[Path] = typer.Option(..., "--model", "-m", help="Model directory (a transformer, tener or flat "
                                     "encoder); repeat it to draw several models one under the other."),
    text: Optional[str] = typer.Option(None, "--text", "-t", help="One sentence."),
    out: Path = OUT,
    layer: int = typer.Option(0, "--layer", min=0, help="Only this layer, counted from 1 (0: every layer)."),
    head: int = typer.Option(0, "--head", min=0, help="Only this head, counted from 1 (0: every head)."),
    data: Optional[Path] = typer.Option(None, "--data", "-d", help="Instead of --text, a corpus: how much of "
                                        "each layer's attention goes to the memory of a model with encoder.memory, "
                                        "by distance and by place in the segment, over its sentences longer than "
                                        "a segment."),
    limit: int = typer.Option(400, "--limit", min=1, help="With --data: at most this many sentences."),
):
    """Attention weights of every layer and head on one sentence, labelled with its characters (and FLAT's
    words), and how far each layer's attention reaches; or, with --data, the share on Transformer-XL's memory."""
    if (text is None) == (data is None):
        raise UserError("give --text (one sentence's maps) or --data (a corpus: the attention on the memory)",
                        fix="pass exactly one of them")
    if data is not None:
        memory(model, data, out, limit, layer or head)
        return
    from nerkit.tools.reports.plot import plot_attention

    path, spread = plot_attention(model, text, out, layer, head)
    for row in spread:
        typer.echo(f"{row['model']} ({row['encoder']}) layer {row['layer']}: mean attended distance "
                   f"{row['mean_distance']:.2f} characters, {100 * row['within_2']:.1f}% of the weight within 2")
    typer.echo(f"wrote {path}")


def memory(model: list[Path], data: Path, out: Path, limit: int, chosen: int) -> None:
    """`plot attention --data`: one model's attention on its memory (nerkit.tools.reports.plot_memory)."""
    if len(model) > 1 or chosen:
        raise UserError("--data draws one model's attention on its memory, every layer on one figure",
                        fix="give one --model and no --layer or --head")
    from nerkit.tools.reports.plot_memory import plot_memory_attention

    path, rows = plot_memory_attention(model[0], data, out, limit)
    for row in rows:
        typer.echo(f"layer {row['layer']}: {100 * row['on_memory']:.1f}% of attention on the memory; by the query's "
                   f"place in a segment after the first: first {100 * row['first']:.1f}%, middle "
                   f"{100 * row['middle']:.1f}%, last {100 * row['last']:.1f}%")
    typer.echo(f"wrote {path}")


@plot_app.command()
def loop(
    results: Path = typer.Argument(..., help="The results.jsonl of `nerkit bench loop`."),
    out: Path = OUT,
):
    """F1 against the sentences annotated, choosing by uncertainty against at random (`nerkit bench loop`)."""
    from nerkit.tools.reports.plot import plot_loop

    typer.echo(f"wrote {plot_loop(results, out)}")


@plot_app.command()
def grow(
    results: Path = typer.Argument(..., help="The results.jsonl of `nerkit bench grow`."),
    out: Path = OUT,
):
    """Test micro-F1 by step as types are added, one line per method (`nerkit bench grow`)."""
    from nerkit.tools.reports.plot import plot_grow

    typer.echo(f"wrote {plot_grow(results, out)}")


@plot_app.command()
def reliability(
    files: List[Path] = typer.Argument(..., help="Outputs of `nerkit eval --calibration --json`, or calibration "
                                        "records (one a line, before and after the temperature)."),
    out: Path = OUT,
):
    """How honest the entity scores are: the share of entities right against their score, per model."""
    from nerkit.tools.reports.plot import plot_reliability

    typer.echo(f"wrote {plot_reliability(files, out)}")
