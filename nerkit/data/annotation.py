"""Annotation tools' files: doccano's JSONL and Label Studio's JSON, read into sentences and written
from them (`nerkit data convert --from/--to doccano|label-studio`, dispatched by nerkit.data.corpus),
and the records of `nerkit predict --format doccano|label-studio` (pre-annotations to import).

Offsets are kept as each tool counts them. Label Studio counts characters as Python does (code
points); doccano counts UTF-16 code units, as the browser does, so a character outside the BMP (an
emoji, a CJK Extension B character such as 𠀀) counts 2 there: nerkit converts both ways.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from nerkit.data.records import (
    UNKNOWN_KEY,
    Corpus,
    Overlaps,
    Sentence,
    _decode,
    _json_record,
    _Problems,
    _read_bytes,
    _read_records,
    _shown,
    _span_corpus,
    _text_of,
    check_unknown,
    record_unknown,
    span_sentence,
)
from nerkit.data.tags import SCORE_DIGITS, Span
from nerkit.errors import CorpusError

log = logging.getLogger(__name__)

FORMATS = ("doccano", "label-studio")


# How an error about a file in another format says to convert it.
CONVERT_HINT = "convert it with `nerkit data convert IN OUT --from {fmt} --to jsonl`"


_TYPE = re.compile(r"\S+")  # an entity type becomes a tag (`B-TYPE`): no spaces


def _check_type(label, where: str, tool: str) -> str:
    if not isinstance(label, str) or not _TYPE.fullmatch(label):
        fix = f"rename the label in {tool}" + (f", e.g. to {label.replace(' ', '_')!r}" if isinstance(label, str) else "")
        raise CorpusError(f"the label {label!r} cannot be an entity type: it must be a string without spaces "
                          "(a type becomes a tag, B-TYPE)", where=where, fix=fix)
    return label


class _Units:
    """UTF-16 code units and characters (code points) of one text: where each character starts in
    UTF-16 units. For a text without characters outside the BMP the two are the same numbers."""

    def __init__(self, text: str):
        self.text = text
        self.starts = None  # character index -> UTF-16 offset, for texts with astral characters
        if text and max(text) > "\uffff":
            self.starts = [0]
            for char in text:
                self.starts.append(self.starts[-1] + (2 if char > "\uffff" else 1))
            self.index = {unit: i for i, unit in enumerate(self.starts)}

    @property
    def length(self) -> int:
        return self.starts[-1] if self.starts else len(self.text)

    def of(self, index: int) -> int:
        """The UTF-16 offset of character `index`."""
        return self.starts[index] if self.starts else index

    def char(self, unit: int) -> int | None:
        """The character index at UTF-16 offset `unit`; None inside a character of two units."""
        return self.index.get(unit) if self.starts else unit


# ---------------------------------------------------------------------------------------------
# doccano: JSONL, one text a line


DOCCANO_FORMAT = ('each line is {"text": "...", "label": [[start, end, "TYPE"], ...]} (end exclusive), or doccano\'s '
                  'newer {"text": "...", "entities": [{"start_offset": 0, "end_offset": 2, "label": "TYPE"}]}')


_DOCCANO_UNITS = ("doccano's offsets count UTF-16 code units from 0, end exclusive (an emoji or another character "
                  "outside the BMP counts 2)")


_DOCCANO_UNKNOWN = ('"unknown" lists the regions nobody annotated as [start, end] pairs in the offsets of the labels: '
                    '{"text": "...", "label": [...], "unknown": [[5, 9]]}; ' + _DOCCANO_UNITS)


def read_doccano(path: str | Path, max_errors: int = 1, overlaps: Overlaps | None = None) -> Corpus:
    """doccano's sequence-labelling JSONL: each line `{"text", "label": [[start, end, TYPE], ...]}`
    (`"labels"` in exports of doccano 1.2 and before), or `{"text", "entities": [{"start_offset",
    "end_offset", "label"}]}` (projects with relations); other keys ("id", "Comments", metadata)
    are allowed and dropped, but for "unknown", the regions nobody annotated (records.UNKNOWN_KEY;
    doccano keeps it as the text's metadata). Offsets are UTF-16 code units, end exclusive."""
    return _read_records(path, max_errors, _parse_doccano, "doccano", overlaps)


def _parse_doccano(line: str, number: int, where: str, overlaps: Overlaps) -> Sentence:
    record = _json_record(line, where, DOCCANO_FORMAT)
    text = _text_of(record, where, DOCCANO_FORMAT)
    keys = [key for key in ("label", "labels", "entities") if key in record]
    if not keys:
        raise CorpusError('the record has no "label" list of entities', where=where,
                          fix=f'write "label": [] for a text without entities; {DOCCANO_FORMAT}')
    if len(keys) > 1:
        raise CorpusError(f"the record has both {keys[0]!r} and {keys[1]!r}: only one can list its entities",
                          where=where, fix="keep one of them")
    key = keys[0]
    if not isinstance(record[key], list):
        raise CorpusError(f"{key!r} is {type(record[key]).__name__}, not a list", where=where, fix=DOCCANO_FORMAT)
    units = _Units(text)
    spans = set()
    for item in record[key]:
        start, end, label = _doccano_entity(item, key, where)
        shown = f"[{start}, {end}, {label!r}]"
        if not 0 <= start < end <= units.length:
            raise CorpusError(f"the entity {shown} is outside the text of {units.length} UTF-16 units", where=where,
                              fix=_DOCCANO_UNITS)
        first, last = units.char(start), units.char(end)
        if first is None or last is None:
            inside = start if first is None else end
            char = text[units.char(inside - 1)]
            raise CorpusError(f"the entity {shown} starts or ends at {inside}, inside {char!r} (U+{ord(char):X}), which "
                              "doccano counts as 2 UTF-16 units", where=where,
                              fix=f"{_DOCCANO_UNITS}; a project set to count grapheme clusters as one character "
                                  "counts otherwise: turn that off, or correct the offsets")
        spans.add(Span(first, last, _check_type(label, where, "doccano")))  # an entity listed twice is one
    spans = sorted(spans, key=lambda s: (s.start, s.end, s.type))
    unknown = None
    if UNKNOWN_KEY in record:  # in the labels' units, as whoever wrote the file counted them
        unknown = record_unknown(record[UNKNOWN_KEY], units.length, where, _DOCCANO_UNKNOWN, units.char, "UTF-16 units")
    check_unknown(spans, unknown, text, where)
    return span_sentence(text, overlaps.check(spans), number, unknown=unknown)


def _doccano_entity(item, key: str, where: str) -> tuple[int, int, object]:
    """(start, end, label) of one entity of `key` ("label", "labels" or "entities"), in UTF-16 units."""
    shown = _shown(json.dumps(item, ensure_ascii=False))
    if key == "entities":
        if isinstance(item, dict) and all(type(item.get(k)) is int for k in ("start_offset", "end_offset")) \
                and "label" in item:
            return item["start_offset"], item["end_offset"], item["label"]
        fix = ("this looks like nerkit's JSON lines: read the file without --from doccano"
               if isinstance(item, dict) and {"start", "end", "type"} <= item.keys() else DOCCANO_FORMAT)
        raise CorpusError(f'the entity {shown} needs integer "start_offset" and "end_offset" and a "label"',
                          where=where, fix=fix)
    if isinstance(item, list) and len(item) == 3 and type(item[0]) is int and type(item[1]) is int:
        return item[0], item[1], item[2]
    fix = ("a label without offsets is a text-classification project's: export a sequence-labelling project"
           if isinstance(item, str) else DOCCANO_FORMAT)
    raise CorpusError(f"the entity {shown} is not [start, end, \"TYPE\"] with integer offsets", where=where, fix=fix)


def doccano_record(text: str, spans: list[Span], unknown: list[tuple[int, int]] | None = None) -> dict:
    """One text as doccano imports it for sequence labelling, offsets in UTF-16 code units. Scored
    spans (predictions) add `scores`, one per label, and a partial sentence's `unknown` regions
    its UNKNOWN_KEY: doccano keeps a record's other keys as its metadata, since a label has no
    place for either."""
    units = _Units(text)
    record = {"text": text, "label": [[units.of(s.start), units.of(s.end), s.type] for s in spans]}
    if any(s.score is not None for s in spans):
        record["scores"] = [s.to_dict().get("score") for s in spans]
    if unknown:
        record[UNKNOWN_KEY] = [[units.of(start), units.of(end)] for start, end in unknown]
    return record


def format_doccano(sentences: list[Sentence]) -> str:
    return "".join(json.dumps(doccano_record(s.text, s.spans(), s.unknown), ensure_ascii=False) + "\n"
                   for s in sentences)


# ---------------------------------------------------------------------------------------------
# Label Studio: a JSON array of tasks


# The names in Label Studio's Named Entity Recognition template, `<Labels name="label" toName="text">`
# over `<Text name="text" value="$text"/>`: what nerkit writes as each result's from_name and
# to_name, and the key of the task's data that holds its text (read and written). A project whose
# labelling config names them otherwise must be given these names to import nerkit's files; reading
# accepts results of any from_name and to_name.
LABEL_STUDIO_FROM_NAME = "label"
LABEL_STUDIO_TO_NAME = "text"
LABEL_STUDIO_DATA_KEY = "text"


LABEL_STUDIO_FORMAT = ('a JSON array of tasks, each {"data": {"text": "..."}, "annotations": [{"result": [{"type": '
                       '"labels", "value": {"start": 0, "end": 2, "text": "...", "labels": ["TYPE"]}}]}]}')


_LABEL_STUDIO_UNKNOWN = ('data.unknown lists the regions nobody annotated as [start, end] pairs in characters, end '
                         'exclusive: {"data": {"text": "...", "unknown": [[5, 9]]}, "annotations": [...]}')


# A JSON array written a task at a time: its start, what goes between two tasks, its end. Each
# task is a line of its own ("\n" and its JSON), so that `[`, `,` and `]` can be written around
# tasks as they come (`nerkit predict` streams them), and an empty array is `[\n]`.
JSON_ARRAY = ("[", ",", "\n]\n")


def task_json(task: dict) -> str:
    """One task as an element of JSON_ARRAY."""
    return "\n" + json.dumps(task, ensure_ascii=False)


def task_where(path: str | Path, index: int, task=None) -> str:
    """Where a task is: its index in the array (from 0, as `jq '.[N]'` counts), and Label Studio's id."""
    task_id = task.get("id") if isinstance(task, dict) else None
    return f"{path}: task {index}" + (f" (id {task_id})" if isinstance(task_id, (int, str)) else "")


def read_label_studio(path: str | Path, max_errors: int = 1, overlaps: Overlaps | None = None) -> Corpus:
    """Label Studio's JSON export: a task's entities are its annotation's results of type "labels"
    (a <Text> tag's spans; relations, choices and other results are not entities), offsets in
    characters, end exclusive, and the task's text is data.text. A cancelled (skipped) annotation
    is not read; a task with several others is read from the one marked ground truth, or from any
    when all agree, and is an error when they disagree. A task nobody annotated is left out, unless
    no task in the file has an annotation: then it is a file of pre-annotations (as `nerkit
    predict --format label-studio` writes), read from its predictions by the same rules."""
    path, data = _read_bytes(path)
    try:
        tasks = json.loads(_decode(path, data))
    except json.JSONDecodeError as e:
        lines = e.lineno > 1 and data.lstrip()[:1] == b"{"  # an object a line: JSON lines
        fix = "a doccano or JSON-lines file? use --from doccano or --from jsonl" if lines else LABEL_STUDIO_FORMAT
        raise CorpusError(f"not valid JSON ({e.msg} at column {e.colno})", where=f"{path}:{e.lineno}", fix=fix) from None
    if isinstance(tasks, dict) and "data" in tasks:
        tasks = [tasks]  # one task alone, as Label Studio also imports
    if not isinstance(tasks, list):
        fix = "a doccano or JSON-lines file? use --from doccano or --from jsonl" if isinstance(tasks, dict) \
            and "text" in tasks else LABEL_STUDIO_FORMAT
        raise CorpusError("the file holds one JSON value that is not an array of tasks", where=str(path), fix=fix)
    annotated = any(isinstance(t, dict) and t.get("annotations") for t in tasks)
    key = "annotations" if annotated else "predictions"
    problems, overlaps = _Problems(path, max_errors), overlaps or Overlaps()
    sentences, left_out = [], {"none": 0, "cancelled": 0}
    for index, task in enumerate(tasks):
        try:
            sentence = _parse_task(task, index, key, task_where(path, index, task), overlaps)
        except CorpusError as e:
            problems.add(e, index)
            continue
        if isinstance(sentence, Sentence):
            sentences.append(sentence)
        else:
            left_out[sentence] += 1
    problems.raise_any()
    _report(path, len(tasks), len(sentences), left_out, key)
    return overlaps.noted(_span_corpus(path, sentences, "label-studio"))


def _report(path: Path, tasks: int, read: int, left_out: dict[str, int], key: str) -> None:
    """Say what was not read as annotations, or why nothing was."""
    if tasks and not read:
        raise CorpusError(f"none of its {_tasks(tasks)} has an annotation (or a prediction) that was not cancelled",
                          where=str(path), fix="export the project after annotating it")
    if key == "predictions" and read:
        log.warning(f"{path}: no task has an annotation: read the predictions of {_tasks(read)} (pre-annotations, "
                    "not reviewed by anyone)")
    if left_out["none"]:
        log.warning(f"{path}: left out {_tasks(left_out['none'])} without an annotation")
    if left_out["cancelled"]:
        log.warning(f"{path}: left out {_tasks(left_out['cancelled'])} whose annotations were all cancelled (skipped)")


def _tasks(count: int) -> str:
    return f"{count} task" + ("" if count == 1 else "s")


def _parse_task(task, index: int, key: str, where: str, overlaps: Overlaps) -> Sentence | str:
    """The task's sentence, or why it is left out ("none", "cancelled")."""
    if not isinstance(task, dict):
        raise CorpusError(f"the task is a JSON {type(task).__name__}, not an object", where=where, fix=LABEL_STUDIO_FORMAT)
    data = task.get("data")
    if not isinstance(data, dict) or not isinstance(data.get(LABEL_STUDIO_DATA_KEY), str):
        raise CorpusError(f'the task has no "data": {{"{LABEL_STUDIO_DATA_KEY}": "..."}} string', where=where,
                          fix=f'nerkit reads the text of data.{LABEL_STUDIO_DATA_KEY}, as the NER template names it '
                              f'(<Text name="text" value="${LABEL_STUDIO_DATA_KEY}"/>): rename the key in the tasks')
    text = data[LABEL_STUDIO_DATA_KEY]
    items = task.get(key) or []
    if not isinstance(items, list):
        raise CorpusError(f'"{key}" is {type(items).__name__}, not a list', where=where, fix=LABEL_STUDIO_FORMAT)
    # An export may list a prediction by its id alone; a cancelled annotation is a skipped task.
    live = [item for item in items if not isinstance(item, (int, str))
            and not (isinstance(item, dict) and item.get("was_cancelled") is True)]
    if not live:
        return "cancelled" if items and key == "annotations" else "none"
    unknown = None
    if UNKNOWN_KEY in data:  # data's fields go through Label Studio's import and export as they are
        unknown = record_unknown(data[UNKNOWN_KEY], len(text), where, _LABEL_STUDIO_UNKNOWN)
    readings = [(item, _result_spans(item, text, where, key, overlaps, unknown)) for item in live]
    return span_sentence(text, _agreed(readings, key, where), index + 1, unknown=unknown)


def _agreed(readings: list[tuple[dict, list[Span]]], key: str, where: str) -> list[Span]:
    """The spans of a task's one annotation (or prediction), of the one marked ground truth, or of
    all when they agree."""
    truth = [spans for item, spans in readings if item.get("ground_truth") is True]
    if len(truth) == 1:
        return truth[0]
    if len({tuple(spans) for _, spans in readings}) == 1:
        return readings[0][1]
    ids = ", ".join(str(item.get("id", "?")) for item, _ in readings)
    what = key[:-1]
    fix = ("mark one as ground truth in Label Studio (or delete the others) and export again" if key == "annotations"
           else "keep one prediction per task")
    if len(truth) > 1:
        fix = "mark only one of them as ground truth in Label Studio and export again"
    raise CorpusError(f"its {len(readings)} {key} (ids {ids}) disagree, and nerkit reads one {what} per task",
                      where=where, fix=fix)


def _result_spans(item, text: str, where: str, key: str, overlaps: Overlaps,
                  unknown: list[tuple[int, int]] | None = None) -> list[Span]:
    """The entities of one annotation or prediction: its results of type "labels", none of them
    in the task's `unknown` regions."""
    if not isinstance(item, dict) or not isinstance(item.get("result"), list):
        raise CorpusError(f'an item of "{key}" has no "result" list', where=where, fix=LABEL_STUDIO_FORMAT)
    spans = set()
    for result in item["result"]:
        if not isinstance(result, dict):
            raise CorpusError(f"a result is a JSON {type(result).__name__}, not an object", where=where,
                              fix=LABEL_STUDIO_FORMAT)
        kind = result.get("type")
        if kind == "labels":
            spans.update(_result_span(result.get("value"), text, where))
        elif isinstance(kind, str) and kind.endswith("labels"):
            raise CorpusError(f"a result of type {kind!r}: nerkit reads the spans of a <Text> tag (type \"labels\")",
                              where=where, fix="label the text with <Labels> on a <Text> tag, as the NER template does")
        # Relations, choices, text areas and the like say nothing about where entities are.
    spans = sorted(spans, key=lambda s: (s.start, s.end, s.type))
    check_unknown(spans, unknown, text, where)
    return overlaps.check(spans)


def _result_span(value, text: str, where: str) -> list[Span]:
    """A result's entities: its span once for each of its labels (a span may carry two types, as
    a <Labels choice="multiple"> gives them)."""
    if not isinstance(value, dict) or not all(type(value.get(k)) is int for k in ("start", "end")):
        raise CorpusError(f"the result's value {_shown(json.dumps(value, ensure_ascii=False))} needs integer start "
                          "and end (character offsets; a <HyperText> tag's are XPaths)", where=where,
                          fix=LABEL_STUDIO_FORMAT)
    labels = value.get("labels")
    if not isinstance(labels, list) or not labels:
        raise CorpusError(f"the result at {value['start']}:{value['end']} has labels {labels!r}, not a list of "
                          "labels", where=where, fix="give each span a label")
    label, *others = [_check_type(label, where, "Label Studio's labelling config") for label in labels]
    span = _result_offsets(value, text, where, label)
    return [span, *(Span(span.start, span.end, other) for other in others)]


def _result_offsets(value: dict, text: str, where: str, label: str) -> Span:
    """The span of a result's offsets, with its (first) label."""
    start, end = value["start"], value["end"]
    seen = value.get("text")
    inside = 0 <= start < end <= len(text)
    if inside and (not isinstance(seen, str) or _same(seen, text[start:end])):
        return Span(start, end, label)
    if isinstance(seen, str):
        # Label Studio before its emoji fix (2022) counted UTF-16 units, as the browser does: such
        # an export is read as it was meant when the result's text says so.
        units = _Units(text)
        first, last = units.char(start), units.char(end)
        if units.starts and first is not None and last is not None and first < last and _same(seen, text[first:last]):
            return Span(first, last, label)
    if not inside:
        raise CorpusError(f"the result {label} at {start}:{end} is outside the text of {len(text)} characters",
                          where=where, fix="offsets count characters from 0, end exclusive")
    raise CorpusError(f"the result's text {seen!r} is not the text at {start}:{end} ({text[start:end]!r})",
                      where=where, fix="offsets count characters from 0, end exclusive; was the task's text "
                                       "changed after it was annotated?")


def _same(seen: str, actual: str) -> bool:
    """Whether a result's text is the text at its offsets. Label Studio may save it with runs of
    whitespace collapsed (a <Text> tag without `white-space: pre-wrap`); its offsets are right."""
    return seen == actual or seen.split() == actual.split()


def label_studio_result(text: str, spans: list[Span], from_name: str = LABEL_STUDIO_FROM_NAME,
                        to_name: str = LABEL_STUDIO_TO_NAME) -> list[dict]:
    """A task's spans as Label Studio's results (no region ids: Label Studio makes them), named as a
    labelling config's <Labels> (`from_name`) and <Text> (`to_name`) are; a scored span's result
    carries its `score`, which Label Studio shows on the region."""
    results = []
    for s in spans:
        result = {"from_name": from_name, "to_name": to_name, "type": "labels",
                  "value": {"start": s.start, "end": s.end, "text": text[s.start:s.end], "labels": [s.type]}}
        if s.score is not None:
            result["score"] = s.to_dict()["score"]
        results.append(result)
    return results


def prediction_score(spans: list[Span]) -> float | None:
    """A prediction's own score, by which Label Studio sorts and filters tasks: its least sure
    entity's (the one a reviewer should look at first); None without scored entities."""
    scores = [s.score for s in spans if s.score is not None]
    return round(min(scores), SCORE_DIGITS) if scores else None


def label_studio_task(text: str, spans: list[Span], unknown: list[tuple[int, int]] | None = None) -> dict:
    """A text and its entities as a task with one annotation (a corpus imported for review); a
    partial sentence's `unknown` regions go in its data, which Label Studio keeps as it is."""
    data = {LABEL_STUDIO_DATA_KEY: text}
    if unknown:
        data[UNKNOWN_KEY] = [[start, end] for start, end in unknown]
    return {"data": data, "annotations": [{"result": label_studio_result(text, spans)}]}


def model_prediction(text: str, spans: list[Span], model_version: str, from_name: str = LABEL_STUDIO_FROM_NAME,
                     to_name: str = LABEL_STUDIO_TO_NAME) -> dict:
    """A model's entities as one Label Studio prediction: its regions (`label_studio_result`) and,
    when its entities are scored, its own score (`prediction_score`)."""
    prediction = {"model_version": model_version, "result": label_studio_result(text, spans, from_name, to_name)}
    score = prediction_score(spans)
    if score is not None:
        prediction["score"] = score
    return prediction


def label_studio_prediction(text: str, spans: list[Span], model_version: str) -> dict:
    """A text and a model's entities as a task with one prediction (a pre-annotation)."""
    return {"data": {LABEL_STUDIO_DATA_KEY: text}, "predictions": [model_prediction(text, spans, model_version)]}


def format_label_studio(sentences: list[Sentence]) -> str:
    start, separator, end = JSON_ARRAY
    return start + separator.join(task_json(label_studio_task(s.text, s.spans(), s.unknown)) for s in sentences) + end


READERS = {"doccano": read_doccano, "label-studio": read_label_studio}


WRITERS = {"doccano": format_doccano, "label-studio": format_label_studio}
