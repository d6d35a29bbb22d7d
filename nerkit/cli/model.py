"""The commands that use a trained model: `nerkit eval` (scores on a gold corpus), `nerkit predict`
(tag a text file) and `nerkit report` (an HTML page of the errors)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from nerkit.cli.options import (
    DEVICE,
    DOCUMENT,
    RUNTIME,
    THREADS,
    WINDOW,
    Device,
    Format,
    Runtime,
    flag,
)
from nerkit.inference.evaluate import ENTITY_BOUNDS, MIN_CALIBRATION_ENTITIES, SENTENCE_BOUNDS, length_buckets


def _buckets(bounds: tuple[int, ...]) -> str:
    return ", ".join(label for label, _, _ in length_buckets(bounds))


def evaluate(
    model: Path = typer.Option(..., "--model", "-m", help="Model directory."),
    data: Path = typer.Option(..., "--data", "-d", help="Gold corpus (CoNLL or .jsonl)."),
    output: Optional[Path] = typer.Option(None, "--output", help="Write `char gold predicted` lines here."),
    as_json: bool = flag("--json", help="Print the metrics as JSON."),
    batch_size: int = typer.Option(128, "--batch-size", min=1, help="Sentences per batch."),
    repair: Optional[bool] = flag("--repair/--no-repair", default=None, help="Read invalid tag transitions as "
                                  "conlleval does (default: as the model's training data was read)."),
    device: Device = DEVICE,
    runtime: Runtime = RUNTIME,
    threads: int = THREADS,
    show_errors: bool = flag("--errors", help="Also break the errors down by type: wrong type, "
                             "wrong boundary, both, missed, spurious."),
    window: Optional[int] = WINDOW,
    document: bool = DOCUMENT,
    show_calibration: bool = flag("--calibration", help="Also score each entity (the CRF's probability) and say "
                                  "how honest the scores are: a reliability table, the expected calibration "
                                  "error, and precision, recall and F1 by minimum score."),
    show_by_length: bool = flag("--by-length", help="Also score the sentences by length in characters "
                                f"({_buckets(SENTENCE_BOUNDS)}) and the entities by length ({_buckets(ENTITY_BOUNDS)})."),
):
    """Entity-level precision, recall and F1 of a model on a gold corpus."""
    from nerkit.files import atomic_write_text, check_output
    from nerkit.inference.evaluate import format_by_length, format_calibration, format_errors, format_table
    from nerkit.inference.formats import eval_output
    from nerkit.inference.loading import load_pipeline, require_runtime

    require_runtime(model, runtime)
    if output:
        check_output(output, data)  # before the evaluation: a wrong path costs no wait
    pipe = load_pipeline(model, device, threads)  # an ONNX export (`nerkit export`) runs without torch
    result = pipe.predict_and_score(data, batch_size, repair=repair, with_errors=show_errors, window=window,
                                    document=document, with_calibration=show_calibration, with_by_length=show_by_length)
    if output:
        atomic_write_text(output, eval_output(result.sentences, result.predicted, result.scheme, data))
    metrics = result.metrics
    if as_json:
        typer.echo(json.dumps(metrics))
    else:
        typer.echo(format_table(metrics))
        if show_errors:
            typer.echo("\n" + format_errors(metrics["errors"], metrics.get("errors_by_nesting")))
        if show_calibration:
            typer.echo("\n" + format_calibration(metrics["calibration"]))
        if show_by_length:
            typer.echo("\n" + format_by_length(metrics["by_length"]))


def predict(
    source: str = typer.Argument("-", help="Text file, one text per line, or JSON lines (.jsonl, .json, "
                                 "or with --field); - reads stdin."),
    model: Path = typer.Option(..., "--model", "-m", help="Model directory."),
    fmt: Format = typer.Option("jsonl", "--format", "-f", help="Output format (doccano, label-studio: "
                               "pre-annotations to import into those tools)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write here instead of stdout."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Sentences per batch."),
    device: Device = DEVICE,
    runtime: Runtime = RUNTIME,
    threads: int = typer.Option(0, "--threads", min=0, help="torch threads (an ONNX export: batches read "
                                "at once) in all, shared out among the workers (0 = one per core)."),
    workers: int = typer.Option(1, "--workers", min=1, help="Processes that predict at once, each "
                                "holding a copy of the model (1 = this process)."),
    window: Optional[int] = WINDOW,
    document: bool = DOCUMENT,
    field: Optional[str] = typer.Option(None, "--field", help="Read the input as JSON lines and tag the "
                                        "string at this key of each object (default for a .jsonl or .json "
                                        "file: text); the other keys are kept in the output records."),
    scores: Optional[bool] = flag("--scores/--no-scores", default=None, help="Give each entity its score: the "
                                  "probability the model gives exactly that span with exactly that type (default: "
                                  "for doccano and label-studio, whose tools sort the review by them)."),
    min_score: Optional[float] = typer.Option(None, "--min-score", min=0.0, max=1.0, help="Leave out the "
                                              "entities scored below this (implies --scores)."),
    shard: Optional[str] = typer.Option(None, "--shard", metavar="I/N", help="Predict only shard I of N of the "
                                        "input file (whole chunks of lines, the same on every machine) into "
                                        "--output, with a manifest beside it; `nerkit shards join` joins them."),
):
    """Tag every line of a text file (or stdin, a pipe, /dev/stdin), or the texts of a JSON-lines file."""
    from nerkit.inference.loading import require_runtime
    from nerkit.inference.shards import predict_shard
    from nerkit.inference.stream import predict_file

    require_runtime(model, runtime)
    if shard is not None:
        predict_shard(model, source, str(output) if output else None, shard, fmt, batch_size, device, threads,
                      workers, window, field, scoring(fmt, scores, min_score), document)
        return
    predict_file(model, source, str(output) if output else None, fmt, batch_size, device, threads, workers, window,
                 document, field, scoring(fmt, scores, min_score))


def scoring(fmt: str, scores: bool | None, min_score: float | None) -> float | None:
    """`predict_file`'s `min_score` from the options: a --min-score scores; else --scores or
    --no-scores as given; else scores for the annotation tools' formats only (they cost the fastest
    models about a fifth of their speed: docs/confidence.md)."""
    if min_score is not None:
        return min_score
    if scores is None:
        scores = fmt in SCORED_FORMATS
    return 0.0 if scores else None


SCORED_FORMATS = ("doccano", "label-studio")


def calibrate(
    model: Path = typer.Option(..., "--model", "-m", help="Model directory written by `nerkit train`."),
    data: Optional[Path] = typer.Option(None, "--data", "-d", help="A gold dev corpus (never the test set); "
                                        "default: the dev split the model was selected on, as its config.yaml "
                                        "gives it (data.dev, or the seeded share of data.train)."),
    batch_size: int = typer.Option(128, "--batch-size", min=1, help="Sentences per batch."),
    window: Optional[int] = WINDOW,
    min_entities: int = typer.Option(MIN_CALIBRATION_ENTITIES, "--min-entities", min=1, help="Refuse a file with fewer gold "
                                     "entities than this, or on which the model predicts fewer: a fit on a few "
                                     "says more about them than about the model."),
    threads: int = THREADS,
):
    """Fit the temperature that makes the entity scores honest on a dev set and keep it in the model
    directory: scores change, tags and F1 do not. A span-head model (model.head: span) gets instead
    the threshold of best dev F1, from 0.05 to 0.95 by 0.05, and a map of its span scores fitted on
    the spans it then predicts (Platt's), both of which predictions then use. Refused, the model
    directory untouched: a file without entities, too few entities, a fit at the edge of the range."""
    from nerkit.tools.annotation.calibrate import calibrate as fit

    result = fit(model, data, batch_size, window, min_entities, threads=threads)
    typer.echo(json.dumps(result))


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
    from nerkit.tools.reports.report import write_report

    metrics = write_report(model, data, out, batch_size, repair=repair, device=device, threads=threads)
    typer.echo(f"wrote {out} (F1 {100 * metrics['f1']:.2f})")
