"""`nerkit lm`: language models for the features: `adapt` continues a local encoder's masked-language-
model training on your own unlabelled text (nerkit.tools.resources.lm_adapt) and writes a directory for
`embeddings.lm.path` (with --dry-run it only reports the text's lines that overlap the evaluation
sets). The command parses its options, calls one function, and prints."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from nerkit.cli.options import flag

lm_app = typer.Typer(no_args_is_help=True, help="Adapt a pretrained language model to your own text.")


@lm_app.command()
def adapt(
    lm: Path = typer.Option(..., "--lm", help="A Hugging Face encoder: its directory, or its hub name in the "
                                              "local cache (as embeddings.lm.path takes)."),
    text: List[Path] = typer.Option(..., "--text", "-t", help="Unlabelled text, one passage a line; repeatable."),
    exclude: List[Path] = typer.Option([], "--exclude", "-x", help="Take out every line that overlaps this "
                                       "labelled corpus (or a config's dev and test sets); repeatable."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for the adapted model (a Hugging Face directory)."),
    steps: int = typer.Option(1000, "--steps", min=1, help="Optimiser steps in all (a --resume may raise it)."),
    batch_size: int = typer.Option(16, "--batch-size", min=1, help="Lines per step."),
    lr: float = typer.Option(5e-5, "--lr", min=0.0, help="Peak learning rate (AdamW, decaying linearly to 0)."),
    whole_word: bool = flag("--whole-word", help="Mask jieba's words whole."),
    max_len: int = typer.Option(128, "--max-len", min=8, help="Tokens per line; longer lines are cut."),
    held_out: float = typer.Option(0.05, "--held-out", min=0.0, max=0.5, help="Share of the lines held out for "
                                   "the perplexity."),
    time_budget: str = typer.Option("0", "--time-budget", help="Stop after this long (90s, 20m, 1.5h; 0: no limit), "
                                    "with a checkpoint to --resume from."),
    checkpoint_every: int = typer.Option(200, "--checkpoint-every", min=1, help="Steps between checkpoints."),
    seed: int = typer.Option(0, "--seed", help="Random seed of the held-out split, the batches and the masks."),
    resume: bool = flag("--resume", help="Continue the run in --out from its checkpoint."),
    force: bool = flag("--force", help="Start over in --out if it holds an earlier "
                                       "adaptation (never anything else)."),
    threads: int = typer.Option(0, "--threads", min=0, help="torch threads (0 = the cores free when nerkit starts)."),
    bf16: bool = flag("--bf16", help="Train under bf16 autocast (faster on CPUs with "
                                     "AVX512-BF16; the perplexity is measured in float32)."),
    dry_run: bool = flag("--dry-run", help="Only say how many lines of the text overlap each --exclude set "
                                           "and would be taken out, and how many would train; load no model, "
                                           "write nothing."),
):
    """Continue masked-language-model training of an encoder on your text (domain adaptation)."""
    from nerkit.typed_yaml import parse_duration
    from nerkit.tools.resources.lm_adapt import AdaptOptions
    from nerkit.tools.resources.lm_adapt import adapt as run

    options = AdaptOptions(steps=steps, batch_size=batch_size, lr=lr, whole_word=whole_word, max_len=max_len,
                           held_out=held_out, time_budget=parse_duration(time_budget, "--time-budget"),
                           checkpoint_every=checkpoint_every, seed=seed, bf16=bf16)
    if dry_run:
        from nerkit.tools.resources.lm_adapt import dry_run as report
        from nerkit.tools.resources.lm_adapt import format_dry_run

        typer.echo(format_dry_run(report(lm, text, exclude, options)))
        return
    result = run(lm, text, out, options, resume=resume, exclude=exclude, force=force, threads=threads)
    typer.echo(f"held-out perplexity {result['perplexity_before']:.2f} -> {result['perplexity_after']:.2f} after "
               f"{result['steps']:,} steps ({result['stopped']}); wrote {out}")
