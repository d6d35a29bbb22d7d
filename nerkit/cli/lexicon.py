"""`nerkit lexicon`: mine a domain's words from its own text for FLAT's lattice (`build`), and judge a
lexicon against a labelled corpus before training on it (`coverage`).

Each command parses its options, calls one function of `nerkit.tools.resources.lexicon`, and prints."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from nerkit.cli.options import echo_json, flag
from nerkit.features.lexicon_mining import (
    DEFAULT_MAX_LEN,
    DEFAULT_MIN_COHESION,
    DEFAULT_MIN_COUNT,
    DEFAULT_MIN_FREEDOM,
)

lexicon_app = typer.Typer(no_args_is_help=True, help="Build a lexicon from a domain's own text; measure how a "
                          "lexicon covers a corpus's entities.")


CONFIG_SET = typer.Option([], "--set", help="Override a value of --config: --set data.split_seed=7 (repeatable).")


@lexicon_app.command()
def build(
    out: Path = typer.Option(..., "--out", "-o", help="The word list to write, `word<TAB>count` per line "
                             "(lexicon.source reads it)."),
    text: List[Path] = typer.Option([], "--text", "-t", help="A plain UTF-8 text file, one text per line "
                                    "(`nerkit data convert --to text` makes one from a corpus); repeat for more."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="A training config: mine the text of its "
                                          "training split as training takes it (data.limit, then the dev "
                                          "carve-out; never dev or test text), with its data.normalize."),
    set_: List[str] = CONFIG_SET,
    max_len: int = typer.Option(DEFAULT_MAX_LEN, "--max-len", min=2, help="Longest word, in characters."),
    min_count: int = typer.Option(DEFAULT_MIN_COUNT, "--min-count", min=1, help="Fewest occurrences of a word."),
    min_cohesion: float = typer.Option(DEFAULT_MIN_COHESION, "--min-cohesion", help="Least pointwise mutual "
                                       "information (nats) of a word's weakest split into two parts."),
    min_freedom: float = typer.Option(DEFAULT_MIN_FREEDOM, "--min-freedom", help="Least entropy (nats) of the "
                                      "characters on a word's left, and on its right."),
    merge_jieba: bool = flag("--merge-jieba", help="Add jieba's dictionary words (after the mined ones)."),
    normalize: Optional[bool] = flag("--normalize/--no-normalize", default=None, help="NFKC-fold characters, as "
                                     "data.normalize does (default: --config's data.normalize, else on)."),
    force: bool = flag("--force", help="Replace --out if it exists."),
):
    """Discover the words of a domain in raw text (--text) or in a config's training split
    (--config) by cohesion and freedom (Matrix67's method) and write them as a word list for FLAT's
    lattice."""
    from nerkit.tools.resources.lexicon import build_lexicon

    report = build_lexicon(text, out, config=config, sets=set_, max_len=max_len, min_count=min_count,
                           min_cohesion=min_cohesion, min_freedom=min_freedom, merge_jieba=merge_jieba,
                           normalize=normalize, force=force)
    jieba = f" and {report['jieba']:,} of jieba's" if merge_jieba else ""
    carved = f"its {report['dev_left_out']:,} dev sentences left out" if report["dev_left_out"] else "dev is its own file"
    split = f"; {report['training_sentences']:,} training sentences of {config}, {carved}" if config else ""
    typer.echo(f"wrote {report['words']:,} words ({report['mined']:,} mined from {report['characters']:,} "
               f"characters{jieba}{split}) to {out} in {report['seconds']:.1f}s")


@lexicon_app.command()
def coverage(
    words: Optional[str] = typer.Argument(None, help="The lexicon: a word list, a word2vec file, or jieba "
                                          "(with --config: default its lexicon.source)."),
    data: Optional[Path] = typer.Option(None, "--data", "-d", help="A labelled corpus (any format `nerkit data` "
                                        "reads)."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="Instead of --data: a training config, "
                                          "scored on its dev split (carved as training carves it) and its test "
                                          "split, with its lexicon section's filters and data.normalize."),
    set_: List[str] = CONFIG_SET,
    normalize: bool = flag("--normalize/--no-normalize", default=True, help="NFKC-fold the corpus's "
                                   "characters before matching, as data.normalize does (--data only)."),
    repair: bool = flag("--repair", help="Read a corpus with overlapping entities, keeping the longest of each."),
    as_json: bool = flag("--json", help="Print JSON."),
):
    """How many gold entities the lexicon holds (overall and per type), and how many of its matches
    in the corpus's text (all of them, as FLAT's lattice takes them) are an entity or fall on its
    boundaries. `nerkit bench` records the --config report of every run with a lexicon."""
    from nerkit.tools.resources.lexicon import coverage_report, format_report

    report = coverage_report(words, data, config, set_, normalize=normalize, repair=repair)
    if as_json:
        echo_json(report)
    else:
        typer.echo(format_report(report))
