"""`nerkit data`: inspect, check and convert corpus files (nerkit.data)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Literal, Optional

import typer

from nerkit.cli.options import (
    MAX_LEN,
    WINDOW,
    Flat,
    Source,
    Target,
    echo_json,
    flag,
)
from nerkit.data.matching import AMBIGUITIES, DEFAULT_MIN_LENGTH, OUTPUTS, RESTS
from nerkit.tools.annotation.select import PoolFormat, SelectFormat, Strategy, Unit
from nerkit.tools.audit.suspects import SCORES

MatchOutput = Literal[OUTPUTS]  # what `nerkit data match --to` writes
MatchRest = Literal[RESTS]
MatchAmbiguous = Literal[AMBIGUITIES]
AuditScore = Literal[SCORES]  # how `nerkit data audit` ranks sentences

data_app = typer.Typer(no_args_is_help=True, help="Inspect, check and convert corpus files.")


@data_app.command("stats")
def data_stats(
    files: List[Path] = typer.Argument(..., help="Corpus files."),
    as_json: bool = flag("--json", help="Print JSON."),
    max_len: int = MAX_LEN,
):
    """Texts (sentences, or documents: a record or a block of lines each), characters, entities per
    type, lengths, the texts longer than --max-len, scheme, invalid transitions, nesting (entities
    that overlap another, inside one or crossing, depth, spans with two types), partial annotation
    (the characters nobody annotated: UNK tags, "unknown" regions), sha256. A file that cannot be
    read gets one error line; the others are still reported (exit 2)."""
    from nerkit.data.stats import files_stats, format_stats

    stats, failures = files_stats(files, max_len)
    if as_json:
        echo_json(stats)
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
    max_len: int = MAX_LEN,
):
    """Check a corpus strictly, list its errors (the first 20, and how many) and say whether its
    entities nest (a format of offsets holds nested ones; a CRF or a BIO file needs a flat
    projection); with --repair OUT, fix invalid transitions, split tokens of several characters,
    keep the longest of overlapping entities (the earliest of equal ones: --flat outer), and write
    the result. Says how many texts are longer than --max-len, and how many characters nobody
    annotated (partial annotation: UNK tags, "unknown" regions), which a repaired copy keeps."""
    from nerkit.data.corpus import read_corpus, scheme_label, write_corpus
    from nerkit.data.nesting import describe, nesting
    from nerkit.data.records import OVERLAP_RULE
    from nerkit.data.stats import MAX_LEN_NOTE, describe_partial, longer_than, partial_counts

    corpus = read_corpus(file, repair=repair is not None, max_errors=20,
                         repair_option="pass --repair OUT for a repaired copy")
    if repair is not None:
        write_corpus(repair, corpus.sentences, "jsonl" if repair.suffix in (".jsonl", ".json") else corpus.scheme, file)
        split = f", split {corpus.split_tokens} tokens of several characters" if corpus.split_tokens else ""
        if corpus.dropped_overlaps:
            split += f", dropped {corpus.dropped_overlaps} overlapping entities (--repair {OVERLAP_RULE})"
        typer.echo(f"{file}: repaired {corpus.repaired} tags ({corpus.invalid_transitions} invalid transitions){split}; "
                   f"wrote {repair}")
    else:
        found = nesting(s.spans() for s in corpus.sentences)
        nested = f"; {describe(found)}" if found.is_nested else ""  # a flat corpus's line is as it was
        longer = longer_than((len(s) for s in corpus.sentences), max_len)
        long = f"; {longer:,} longer than {max_len:,} characters (data.max_len), {MAX_LEN_NOTE}" if longer else ""
        partial, unknown = partial_counts(corpus.sentences)
        long += f"; partial: {describe_partial(partial, unknown, len(corpus.sentences))}" if partial else ""
        typer.echo(f"{file}: OK, {len(corpus.sentences)} texts, {scheme_label(corpus.labels)}, "
                   f"types {', '.join(corpus.types) or '-'}{nested}{long}")


@data_app.command("convert")
def data_convert(
    source: Path = typer.Argument(..., help="Input corpus (CoNLL or .jsonl; others with --from)."),
    target: Path = typer.Argument(..., help="Output file."),
    to: Target = typer.Option(..., "--to", help="Target tag scheme or format (text: the sentences alone, one a line, "
                              "for nerkit predict or lm adapt; doccano: its JSONL; label-studio: its JSON, a task "
                              "with one annotation per sentence)."),
    from_: Source = typer.Option("auto", "--from", help="Input format: auto (.jsonl and .json are JSON lines, "
                                 "a .json array of CBLUE's records is cblue, anything else CoNLL), CLUENER's JSON "
                                 "(cluener), CBLUE's CMeEE JSON (cblue: start_idx, end_idx inclusive), inline markup "
                                 "as `nerkit predict --format inline` writes it (inline: [北京]LOC, a sentence a line), "
                                 "doccano's JSONL export (doccano) or Label Studio's JSON export (label-studio)."),
    repair: bool = flag("--repair", help="Fix invalid transitions, split tokens of several characters and "
                        "keep the longest of overlapping entities (--flat outer) while reading."),
    flat: Optional[Flat] = typer.Option(None, "--flat", help="Project nested entities flat, as a "
                                        "character-per-line file needs: outer keeps the longest entity of each "
                                        "overlap, inner the shortest (default: keep them; bio, bioes and bmes "
                                        "refuse them)."),
):
    """Convert between tag schemes and formats."""
    from nerkit.data.corpus import read_corpus, write_corpus
    from nerkit.data.nesting import FLAT_RULES

    corpus = read_corpus(source, repair=repair, fmt=from_, texts_only=to == "text", flat=flat)
    write_corpus(target, corpus.sentences, to, source, corpus.format)
    option = f"--flat {flat}" if flat else "--repair"
    dropped = f", dropped {corpus.dropped_overlaps} overlapping entities ({option} {FLAT_RULES[corpus.flat]})" \
        if corpus.dropped_overlaps else ""
    typer.echo(f"{source} ({corpus.labels}) -> {target} ({to}), {len(corpus.sentences)} sentences{dropped}")


@data_app.command("select")
def data_select(
    model: Path = typer.Option(..., "--model", "-m", help="Model directory written by `nerkit train`."),
    pool: Path = typer.Option(..., "--pool", help="The texts to choose from: one a line, JSON lines with a "
                              "text key (.jsonl, .json), or a corpus (--pool-format corpus)."),
    n: int = typer.Option(..., "--n", "-n", min=1, help="How many texts to choose."),
    strategy: Strategy = typer.Option("uncertainty", "--strategy", help="uncertainty: the texts whose best "
                                      "tag sequence (a span head: whose spans) the model is least sure of, "
                                      "per character; random: a seeded draw, the baseline."),
    seed: int = typer.Option(0, "--seed", help="Random seed of --strategy random."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the tasks here instead of stdout."),
    fmt: SelectFormat = typer.Option("jsonl", "--format", "-f", help="The tasks' format: the annotation tool's "
                                     "to import them with their scored pre-annotations."),
    pool_format: PoolFormat = typer.Option("auto", "--pool-format", help="How to read --pool (auto: JSON lines "
                                           "for .jsonl or .json, else one text a line)."),
    exclude: List[Path] = typer.Option([], "--exclude", help="A corpus already annotated: its texts are never "
                                       "chosen (repeatable)."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Sentences per batch."),
    window: Optional[int] = WINDOW,
    unit: Unit = typer.Option("sentence", "--unit", help="What a task asks: sentence, a whole text; span, the "
                              "spans the model is least sure of (a CRF model; --n counts spans), each text's "
                              "written with its entities inside them and every region outside them \"unknown\": "
                              "corrected, it is partially annotated training data."),
):
    """Choose the texts of a pool to annotate next (active learning), least sure first, written as
    tasks with the model's scored pre-annotations."""
    from nerkit.tools.annotation.select import select_tasks

    summary = select_tasks(model, pool, n, strategy, seed, out, fmt, pool_format, exclude, batch_size, window, unit)
    if out is not None:
        spans = f"{summary['selected']:,} spans in " if unit == "span" else ""
        typer.echo(f"chose {spans}{summary['texts']:,} of {summary['pool']:,} texts ({summary['excluded']:,} already "
                   f"annotated) by {summary['strategy']}; wrote {out}")


@data_app.command("match")
def data_match(
    dicts: List[str] = typer.Option(..., "--dict", "-d", metavar="FILE[:TYPE]", help="A dictionary (repeatable): "
                                    "a word list, a word a line (`word`, `word<TAB>TYPE`, or `word<TAB>count` as "
                                    "`nerkit lexicon build` writes it), its words' type after the file's name "
                                    "where a line has none; or a labelled corpus (.jsonl, .json, or a "
                                    "character-per-line file), whose entities are the words, with their types."),
    text: Path = typer.Option(..., "--text", "-t", help="The text to mark: one sentence a line, or a labelled "
                              "corpus, whose sentences are kept and labels ignored."),
    out: Path = typer.Option(..., "--out", "-o", help="The marked corpus to write."),
    to: Optional[MatchOutput] = typer.Option(None, "--to", help="Write JSON lines (unknown regions as "
                                             "\"unknown\") or CoNLL in a tag scheme (unknown characters tagged "
                                             "UNK) (default: jsonl for a .jsonl or .json --out, else bio)."),
    rest: MatchRest = typer.Option("unknown", "--rest", help="What the characters outside every match are: "
                                   "unknown (a partial label), or o (the naive reading: every one O)."),
    maps: List[str] = typer.Option([], "--map", metavar="OLD=NEW", help="Rename a dictionary's type, e.g. "
                                   "--map NR=PER (repeatable)."),
    only_mapped: bool = flag("--only-mapped", help="Drop the entries whose type no --map names (default: kept "
                             "under their own type)."),
    ambiguous: MatchAmbiguous = typer.Option("unknown", "--ambiguous", help="A string given two types: "
                                             "unknown (matched but left unmarked) or majority (the type given "
                                             "it most often, a word list's line once and a corpus's entity once "
                                             "a place; a tie stays unknown)."),
    min_length: int = typer.Option(DEFAULT_MIN_LENGTH, "--min-length", min=1, help="Shortest dictionary string "
                                   "matched, in characters (single characters, mostly abbreviations such as 中 "
                                   "and 美, are an entity in few of their places: 1 keeps them)."),
):
    """Mark every dictionary string found in a text as an entity and leave the rest unknown: a
    dictionary as the only supervision. The longest string at the leftmost place wins; a string
    given two types is left unknown and counted."""
    from nerkit.data.matching import match_corpus

    summary = match_corpus(dicts, text, out, to, rest, maps, only_mapped, ambiguous, min_length)
    typer.echo(f"{summary.line()}; wrote {out}")


@data_app.command("audit")
def data_audit(
    config: Path = typer.Option(..., "--config", "-c", help="The config whose data.train is audited, and which "
                                "trains the fold models (its limits, threads and dev set; --set to change them)."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for the fold models and the report."),
    folds: int = typer.Option(5, "--folds", "-k", help="Models trained, each on all folds but one and "
                              "judging the one it never saw."),
    set_: List[str] = typer.Option([], "--set", help="Override a config value: --set train.epochs=5 (repeatable)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the fold assignment (written to OUT/folds.json)."),
    score: AuditScore = typer.Option("entity", "--score", help="How sentences are ranked: entity, the character "
                                     "whose labelled class the model doubts most against that class's mean "
                                     "confidence (confident learning's per-class threshold, in log-odds); path, "
                                     "log P(the model's best labelling) - log P(the labels)."),
    threshold: float = typer.Option(0.5, "--threshold", help="The evidence (the model's probability that the labels "
                                    "are wrong there) that makes a suspect."),
    missing_threshold: Optional[float] = typer.Option(None, "--missing-threshold", help="The same for an entity the "
                                                      "labels miss (default: --threshold); lower it to find more "
                                                      "omissions, which fold models learn to leave out too."),
    top: int = typer.Option(200, "--top", min=1, help="Sentences shown on OUT/suspects.html."),
    resume: bool = flag("--resume", help="Go on with the audit in --out: finished fold models are kept, an "
                        "interrupted one continues from its checkpoint, the folds are those of OUT/folds.json."),
    force: bool = flag("--force", help="Replace an earlier audit in --out."),
):
    """Find label errors in a training corpus: K models trained on K-1 folds each judge the sentences
    they never saw, and every sentence is ranked by how much its fold model disputes its labels,
    with its suspects (an entity missing, unsupported, of the wrong type or with wrong boundaries),
    written as JSON lines, Label Studio and doccano tasks and an HTML page, worst first."""
    from nerkit.tools.audit.run import AuditOptions, audit

    result = audit(config, set_, out, AuditOptions(folds, seed, score, threshold, missing_threshold, top),
                   resume=resume, force=force)
    flagged = sum(bool(j.suspects) for j in result.judged)
    typer.echo(f"judged {len(result.judged):,} sentences with {folds} fold models; {flagged:,} have suspects, "
               f"ranked by {score} in {out}/suspects.jsonl (also label-studio.json, doccano.jsonl, suspects.html)")


@data_app.command("corrupt")
def data_corrupt(
    source: Path = typer.Argument(..., help="The corpus to plant errors in."),
    target: Path = typer.Argument(..., help="The corrupted corpus (JSON lines for .jsonl or .json, else CoNLL in "
                                  "the source's scheme)."),
    truth: Path = typer.Option(..., "--truth", help="JSON lines of every change: sentence, kind, the entity before "
                               "and after."),
    retype: float = typer.Option(0.03, "--retype", min=0, max=1, help="Share of entities given another type."),
    boundary: float = typer.Option(0.03, "--boundary", min=0, max=1, help="Share of entities with one end moved "
                                   "by one or two characters."),
    delete: float = typer.Option(0.03, "--delete", min=0, max=1, help="Share of entities deleted (omissions)."),
    spurious: float = typer.Option(0.01, "--spurious", min=0, max=1, help="Spurious entities added, as a share of "
                                   "the entities."),
    seed: int = typer.Option(1, "--seed", help="Seed of the draws: the same seed plants the same errors."),
    limit: int = typer.Option(0, "--limit", min=0, help="Only the first N sentences (0: all)."),
):
    """Plant known label errors in a corpus (the audit's noise protocol): entities retyped, with a
    boundary moved, deleted, and spurious ones added, seeded, with every change written to --truth."""
    from nerkit.tools.audit.noise import NoiseRates, corrupt_file

    changes = corrupt_file(source, target, truth, NoiseRates(retype, boundary, delete, spurious), seed, limit)
    kinds = ", ".join(f"{kind} {count:,}" for kind, count in changes.items())
    typer.echo(f"{source} -> {target}: {kinds}; wrote {truth}")
