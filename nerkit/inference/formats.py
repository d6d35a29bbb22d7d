"""The output formats of `nerkit predict` (jsonl, conll, inline, html, and the annotation tools'
pre-annotations: doccano, label-studio) and of `nerkit eval --output`: one function turns predicted
texts into records, used by the CLI, the workers, the Python API and `nerkit serve` (whose records
are `--format jsonl`'s, as JSON objects: `record`, `predict_records`). The annotation tools' records
are nerkit.data.annotation's, the same that `nerkit data convert --to` writes."""

from __future__ import annotations

import json
from pathlib import Path

from nerkit.data import annotation
from nerkit.data.corpus import conll_line, refuse_nested
from nerkit.data.nesting import nested, project
from nerkit.data.inline import inline_line
from nerkit.data.records import Sentence
from nerkit.data.tags import Span, spans_to_tags
from nerkit.inference.predictor import above
from nerkit.version import __version__

FORMATS = ("jsonl", "conll", "inline", "html", "doccano", "label-studio")


def format_record(text: str, spans: list[Span], fmt: str, scheme: str = "bio",
                  colors: dict[str, str] | None = None, model_version: str = "nerkit", keys: dict | None = None) -> str:
    """One record of output; `colors`: the entity types' colours for html (report.type_colors);
    `model_version`: what label-studio's predictions say made them (`model_version`). A
    label-studio record is an element of a JSON array: `output_frame` says what goes around it.
    `keys`: the other keys of the text's input object (`nerkit predict --field`), which the JSON
    formats keep (label-studio in the task's data); the others have no place for them."""
    keys = keys or {}
    if fmt == "doccano":
        return json.dumps({**keys, **annotation.doccano_record(text, spans)}, ensure_ascii=False) + "\n"
    if fmt == "label-studio":
        task = annotation.label_studio_prediction(text, spans, model_version)
        return annotation.task_json({**task, "data": {**keys, **task["data"]}})
    if fmt == "html":
        from nerkit.inference.html import prediction_record

        return prediction_record(text, spans, colors or {})
    if fmt == "jsonl":
        return json.dumps({**keys, **record(text, spans)}, ensure_ascii=False) + "\n"
    # inline and conll mark each character once: a span head's nested predictions are written as
    # their outer projection (data.flat: outer's rule); the other formats carry every span.
    spans = project(spans, "outer") if nested(spans) else spans
    if fmt == "inline":
        return inline_line(text, spans) + "\n"
    tags = spans_to_tags(len(text), spans, scheme)
    return "".join(conll_line(c, t) for c, t in zip(text, tags)) + "\n"


def record(text: str, spans: list[Span]) -> dict:
    """One text's record as `--format jsonl` writes it: the text and its entities, each
    `{"start", "end", "type", "text"}` with offsets into the text, end exclusive."""
    return {"text": text, "entities": [s.to_dict(text) for s in spans]}


def predict_records(pipe, texts: list[str], batch_size: int = 64, window: int | None = None,
                    min_score: float | None = None) -> list[dict]:
    """The `record` of each text, predicted as `nerkit predict` predicts (windows and stitching
    included; `min_score` as `predicted_spans` takes it): what `nerkit serve` answers."""
    spans = predicted_spans(pipe, texts, batch_size, window, min_score)
    return [record(t, s) for t, s in zip(texts, spans)]


def predicted_spans(pipe, texts: list[str], batch_size: int, window: int | None, min_score: float | None) -> list:
    """Each text's spans: unscored when `min_score` is None, else each with its score (the CRF's
    probability of exactly that entity) and only those scored `min_score` or more (0: all)."""
    spans = pipe.predict_tokens(texts, batch_size, window, min_score is not None)  # a string is its characters
    return [above(s, min_score) for s in spans]


def predict_chunk(pipe, texts: list[str], fmt: str, batch_size: int, window: int | None = None,
                  keys: list[dict] | None = None, min_score: float | None = None) -> bytes:
    """The encoded records of one chunk's texts (what a worker process returns, too); `window`:
    the prediction window (None: the model's); `keys`: each text's other keys (`format_record`);
    `min_score`: as `predicted_spans` takes it."""
    spans = predicted_spans(pipe, texts, batch_size, window, min_score)
    colors = None
    if fmt == "html":
        from nerkit.inference.html import type_colors

        colors = type_colors(pipe.types)
    version = model_version(pipe) if fmt == "label-studio" else ""
    records = output_frame(fmt)[1].join(format_record(t, s, fmt, pipe.scheme, colors, version, k)
                                        for t, s, k in zip(texts, spans, keys or [None] * len(texts)))
    return records.encode("utf-8")


def output_frame(fmt: str) -> tuple[str, str, str]:
    """What `nerkit predict --format fmt` writes before its records, between two of them (within a
    chunk, and between chunks), and after them: html's page, label-studio's JSON array."""
    if fmt == "html":
        from nerkit.inference.html import predictions_footer, predictions_header

        return predictions_header(), "", predictions_footer()
    if fmt == "label-studio":
        return annotation.JSON_ARRAY
    return "", "", ""


def model_version(pipe) -> str:
    """`nerkit VERSION MODEL_DIR_NAME`: what made a pre-annotation, as Label Studio shows it (the
    name alone for a pipeline that was not loaded from a directory)."""
    directory = getattr(pipe, "directory", None)  # a Pipeline's; a stand-in may have none
    return directory_version(directory) if directory is not None else f"nerkit {__version__}"


def directory_version(directory: str | Path) -> str:
    """`model_version` of the model in `directory`, without loading it."""
    return f"nerkit {__version__} {Path(directory).resolve().name}"


def eval_output(sentences: list[Sentence], predicted: list[list[Span]], scheme: str,
                source: str | Path = "the gold corpus") -> str:
    """`char gold predicted` lines with a blank line between sentences: conlleval's input. Nested
    gold (read from `source`) has no such lines: refused."""
    refuse_nested(sentences, source, "jsonl", "--output writes one gold tag per character",
                  "leave out --output: the scores count the nested entities exactly (--errors breaks them down)")
    lines = []
    for sent, spans in zip(sentences, predicted):
        gold = sent.tags
        pred = spans_to_tags(len(sent), spans, scheme)
        lines.extend(conll_line(c, g, p) for c, g, p in zip(sent.tokens, gold, pred))
        lines.append("\n")
    return "".join(lines)
