"""`nerkit shards`: what follows `nerkit predict --shard I/N` (nerkit.inference.shards): `join` checks
every shard of one input against the others and against its manifest and writes them as one output,
the output `nerkit predict` writes for the whole input."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

shards_app = typer.Typer(no_args_is_help=True, help="Join the shards of `nerkit predict --shard I/N`.")


@shards_app.command()
def join(
    parts: List[str] = typer.Argument(..., help="Every shard's output (or its .shard.json manifest), in any "
                                      "order: parts/*.jsonl."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write here (atomically) instead of stdout."),
):
    """Join the shards of one input into what `nerkit predict` writes for all of it; refused, in one
    line, when a shard is missing, given twice, predicted with another model, input or options, or
    changed since its manifest was written."""
    from nerkit.inference.shards import join_shards

    join_shards(parts, str(output) if output else None)
