"""`nerkit vectors`: train static vectors on your own text, export jieba's LAC character vectors, or
convert jieba's whole LAC-small model into a directory for `embeddings.lm.path`.

Each command parses its options, calls one function of `nerkit.pretrained.vectors`, and prints one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from nerkit.cli.options import flag

vectors_app = typer.Typer(no_args_is_help=True, help="Train or export static character, bigram and word vectors; "
                          "export jieba's LAC-small model.")


@vectors_app.command()
def train(
    text: List[Path] = typer.Option(..., "--text", "-t", help="A plain text file (one text per line) or a "
                                    "nerkit corpus (CoNLL or .jsonl); repeat for more files."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for char.vec, bichar.vec and word.vec: a new "
                             "or empty one, or one of earlier vectors with --force."),
    dim: int = typer.Option(50, "--dim", help="Dimension of the character and bigram vectors."),
    word_dim: int = typer.Option(0, "--word-dim", help="Dimension of the word vectors (0: the same as --dim)."),
    window: int = typer.Option(5, "--window", help="Context characters (or words) on each side."),
    min_count: int = typer.Option(5, "--min-count", help="Tokens seen fewer times get no vector."),
    epochs: int = typer.Option(5, "--epochs", help="Passes over the text."),
    seed: int = typer.Option(1, "--seed", help="Random seed (with --workers 1 the files are the same on every run)."),
    workers: int = typer.Option(1, "--workers", help="gensim threads; only 1 gives identical files on every run."),
    cbow: bool = flag("--cbow", help="CBOW instead of skip-gram (faster, weaker on rare tokens)."),
    kinds: str = typer.Option("char,bichar,word", "--kinds", help="Which of char, bichar, word to train."),
    normalize: bool = flag("--normalize", help="NFKC-fold characters, as data.normalize does."),
    exclude: List[Path] = typer.Option([], "--exclude", help="A dev or test corpus whose sentences the "
                                       "training text must not contain (repeatable)."),
    force: bool = flag("--force", help="Write into --out even if it holds earlier vectors (.vec files only)."),
):
    """Train word2vec character, character-bigram and jieba-word vectors on your text."""
    from nerkit.tools.resources.vectors import HeldOut, train_vectors

    held_out = HeldOut.from_files(exclude) if exclude else None
    report = train_vectors(text, out, dim=dim, word_dim=word_dim or None, window=window, min_count=min_count,
                           epochs=epochs, seed=seed, workers=workers, sg=not cbow,
                           kinds=[k.strip() for k in kinds.split(",") if k.strip()], normalize=normalize,
                           held_out=held_out, force=force)
    texts = sum(f["texts"] - f["rejected"] for f in report["files"])
    rejected = sum(f["rejected"] for f in report["files"])
    trained = ", ".join(f"{kind} {r['vectors']:,} x {r['dim']}" for kind, r in report["kinds"].items())
    typer.echo(f"trained on {texts:,} texts ({rejected:,} left out as held-out): {trained} in {out}")


@vectors_app.command("export-jieba")
def export_jieba(
    out: Path = typer.Option(..., "--out", "-o", help="The word2vec text file to write."),
):
    """Write the character embeddings of jieba's bundled LAC model (Baidu) as word2vec text."""
    from nerkit.tools.resources.vectors import export_jieba as export

    report = export(out)
    typer.echo(f"wrote {report['vectors']:,} character vectors of dimension {report['dim']} to {out} "
               f"(LAC table {report['table'][0]:,} x {report['table'][1]}; {len(report['skipped'])} pseudo-tokens "
               "and whitespace characters left out)")


@vectors_app.command("export-lac")
def export_lac(
    out: Path = typer.Option(..., "--out", "-o", help="The directory to write (e.g. lm/lac-small); "
                             "then set embeddings.lm.path to it."),
    force: bool = flag("--force", help="Replace --out if it holds an earlier LAC export (never anything else)."),
):
    """Convert jieba's bundled Baidu LAC-small model (character embeddings, bi-GRU layers, CRF) into
    a directory that embeddings.lm.path reads as a language model."""
    from nerkit.pretrained.lac_files import export_lac as export

    report = export(out, force=force)
    typer.echo(f"wrote LAC-small to {out}: {report['characters']:,} characters (embeddings "
               f"{report['embedding'][0]:,} x {report['embedding'][1]}), {report['tags']} tags, "
               f"{report['parameters']:,} parameters")
