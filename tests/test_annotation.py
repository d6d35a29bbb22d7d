"""Tests for the annotation tools' files (nerkit/data/annotation.py): doccano's JSONL and Label Studio's
JSON read and written by `nerkit data convert`, and written as pre-annotations by `nerkit predict
--format doccano|label-studio`. Round trips keep every entity; what nerkit predicts, written for a
tool and read back, is what `--format jsonl` gives; offsets after a character outside the BMP are
each tool's (UTF-16 units for doccano, characters for Label Studio); a malformed record is one error
line naming its file and line (doccano) or task (Label Studio) and the fix; empty input gives valid
output, with one process or two."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import assert_one_error_line, read_error

from nerkit.data.annotation import FORMATS, LABEL_STUDIO_FROM_NAME, LABEL_STUDIO_TO_NAME
from nerkit.data.corpus import read_corpus
from nerkit.data.tags import Span
from nerkit.version import __version__

FIXTURES = Path(__file__).parent / "fixtures"


def entities(path: Path, fmt: str = "auto") -> list[tuple[str, list[Span]]]:
    return [(s.text, s.spans()) for s in read_corpus(path, fmt=fmt).sentences]




def ls_task(text: str, *annotations, **task) -> dict:
    """A Label Studio task of `text` whose annotations have these results (lists of (start, end, label))."""
    return {"data": {"text": text}, **task, "annotations": [
        {"result": [ls_result(text, *span) for span in spans]} for spans in annotations]}


def ls_result(text: str, start: int, end: int, label: str) -> dict:
    return {"id": f"r{start}", "from_name": "label", "to_name": "text", "type": "labels", "origin": "manual",
            "value": {"start": start, "end": end, "text": text[start:end], "labels": [label]}}


# ---------------------------------------------------------------- round trips through each tool's file


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("corpus", ["tiny_train.bio", "three_types.bmes"])
def test_bio_to_the_tool_and_back_keeps_every_entity(nerkit, tmp_path, fmt, corpus):
    source = FIXTURES / corpus
    tool_file, back = tmp_path / f"corpus.{fmt}", tmp_path / "back.bio"
    nerkit("data", "convert", str(source), str(tool_file), "--to", fmt)
    nerkit("data", "convert", str(tool_file), str(back), "--from", fmt, "--to", "bio")
    before = entities(source)
    assert entities(back) == before and sum(len(spans) for _, spans in before) > 3
    if fmt == "label-studio":
        tasks = json.loads(tool_file.read_text(encoding="utf-8"))
        assert len(tasks) == len(before) and "predictions" not in tasks[0]
        result = tasks[0]["annotations"][0]["result"][0]
        assert (result["from_name"], result["to_name"], result["type"]) == (LABEL_STUDIO_FROM_NAME, LABEL_STUDIO_TO_NAME,
                                                                            "labels")


ASTRAL = [  # characters outside the BMP before, inside and after entities
    {"text": "😀张三在𠀀京市", "entities": [{"start": 1, "end": 3, "type": "PER"}, {"start": 4, "end": 7, "type": "LOC"}]},
    {"text": "李四👨‍👩‍👧", "entities": [{"start": 0, "end": 2, "type": "PER"}]},
    {"text": "没有实体", "entities": []},
]


def test_doccano_offsets_count_utf16_units_and_label_studio_characters(nerkit, write_file, tmp_path):
    source = write_file("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ASTRAL), "astral.jsonl")
    for fmt in FORMATS:
        nerkit("data", "convert", str(source), str(tmp_path / fmt), "--to", fmt)
        nerkit("data", "convert", str(tmp_path / fmt), str(tmp_path / f"{fmt}.jsonl"), "--from", fmt, "--to", "jsonl")
        assert entities(tmp_path / f"{fmt}.jsonl") == entities(source)
    doccano = [json.loads(line) for line in (tmp_path / "doccano").read_text(encoding="utf-8").splitlines()]
    assert doccano[0]["label"] == [[2, 4, "PER"], [5, 9, "LOC"]]  # 😀 and 𠀀 count 2 each
    tasks = json.loads((tmp_path / "label-studio").read_text(encoding="utf-8"))
    assert [(r["value"]["start"], r["value"]["end"], r["value"]["text"]) for r in tasks[0]["annotations"][0]["result"]] \
        == [(1, 3, "张三"), (4, 7, "𠀀京市")]


# ---------------------------------------------------------------- pre-annotations: nerkit predict


TEXTS = "张伟在北京工作。\n\n😀李娜是清华大学的学生。\n新华社的记者王芳报道了这件事。\n刘洋去天元集团参观了。\n"


def test_predictions_for_each_tool_read_back_as_the_jsonl_predictions(nerkit, tiny_model_dir, write_file, tmp_path, capfd):
    texts = write_file(TEXTS, "texts.txt")
    predicted = [json.loads(line) for line in nerkit("predict", str(texts), "--model", str(tiny_model_dir)).stdout.splitlines()]
    expected = [(r["text"], [Span(e["start"], e["end"], e["type"]) for e in r["entities"]]) for r in predicted]
    assert sum(len(spans) for _, spans in expected) >= 4  # a model that finds entities
    assert expected[2][1]  # and some after the emoji, where doccano's offsets are not Python's
    for fmt in FORMATS:
        out = tmp_path / f"pre.{fmt}"
        nerkit("predict", str(texts), "--model", str(tiny_model_dir), "--format", fmt, "--output", str(out))
        back = tmp_path / f"back.{fmt}.jsonl"
        result = nerkit("data", "convert", str(out), str(back), "--from", fmt, "--to", "jsonl")
        assert entities(back) == expected
        if fmt == "doccano":  # the emoji before them counts 2 UTF-16 units
            records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
            assert records[2]["label"] == [[s.start + 1, s.end + 1, s.type] for s in expected[2][1]]
        if fmt == "label-studio":  # a file of pre-annotations, read from its predictions, and says so
            assert "no task has an annotation: read the predictions of 5 tasks" in result.stderr
            tasks = json.loads(out.read_text(encoding="utf-8"))
            (prediction,) = tasks[2]["predictions"]
            assert prediction["model_version"] == f"nerkit {__version__} {tiny_model_dir.name}"
            assert all(r["value"]["text"] == tasks[2]["data"]["text"][r["value"]["start"]:r["value"]["end"]]
                       for r in prediction["result"])


@pytest.mark.parametrize("fmt, expected", [("label-studio", "[\n]\n"), ("doccano", "")])
def test_empty_input_gives_valid_output(nerkit, tiny_model_dir, write_file, tmp_path, fmt, expected):
    out = tmp_path / "pre"
    nerkit("predict", str(write_file("", "empty.txt")), "--model", str(tiny_model_dir), "--format", fmt, "--output", str(out))
    assert out.read_text(encoding="utf-8") == expected
    if fmt == "label-studio":
        assert json.loads(expected) == []


def test_label_studio_predictions_stay_one_json_array_over_chunks_and_workers(tiny_model_dir, write_file, tmp_path):
    from nerkit.inference.pipeline import Pipeline
    from nerkit.inference.stream import predict_stream
    from nerkit.inference.workers import Workers

    texts = write_file(TEXTS * 3, "texts.txt")
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert predict_stream(Pipeline.load(tiny_model_dir), str(texts), str(one), "label-studio", chunk_chars=20) == 15
    with Workers(tiny_model_dir, 2, threads=2) as pool:
        assert predict_stream(pool, str(texts), str(two), "label-studio", chunk_chars=20) == 15
    assert two.read_bytes() == one.read_bytes()
    tasks = json.loads(one.read_text(encoding="utf-8"))
    assert [t["data"]["text"] for t in tasks] == TEXTS.splitlines() * 3


# ---------------------------------------------------------------- reading doccano


def test_doccano_exports_old_and_new_with_their_extra_keys(write_file):
    path = write_file(
        '{"id": 1, "text": "张三在北京", "label": [[3, 5, "LOC"], [0, 2, "PER"]], "Comments": [], "source": "web"}\n'
        '{"id": 2, "text": "李四", "labels": [[0, 2, "PER"], [0, 2, "PER"]], "meta": {}, "annotation_approver": null}\n'
        '{"id": 3, "text": "王五去上海", "entities": [{"id": 9, "label": "LOC", "start_offset": 3, "end_offset": 5}, '
        '{"id": 8, "label": "PER", "start_offset": 0, "end_offset": 2}], "relations": [], "Comments": []}\n'
        '\n{"text": "没有", "label": []}\n', "export.jsonl")
    corpus = read_corpus(path, fmt="doccano")
    assert [(s.text, s.spans(), s.line) for s in corpus.sentences] == [
        ("张三在北京", [Span(0, 2, "PER"), Span(3, 5, "LOC")], 1), ("李四", [Span(0, 2, "PER")], 2),
        ("王五去上海", [Span(0, 2, "PER"), Span(3, 5, "LOC")], 3), ("没有", [], 5)]
    assert corpus.format == "doccano" and corpus.types == ["LOC", "PER"]


DOCCANO_ERRORS = {
    "not JSON": ('{"text": "张三", "label": [', "not valid JSON"),
    "no label": ('{"id": 3, "text": "张三"}', 'no "label" list'),
    "both lists": ('{"text": "张三", "label": [], "entities": []}', "both 'label' and 'entities'"),
    "not a triple": ('{"text": "张三", "label": [[0, 2]]}', 'is not [start, end, "TYPE"]'),
    "a classification label": ('{"text": "张三", "label": ["positive"]}', 'is not [start, end, "TYPE"]'),
    "outside": ('{"text": "张三", "label": [[0, 3, "PER"]]}', "outside the text of 2 UTF-16 units"),
    "inside an emoji": ('{"text": "😀张三", "label": [[1, 4, "PER"]]}', "inside '😀' (U+1F600)"),
    "a label with a space": ('{"text": "张三", "label": [[0, 2, "Person name"]]}', "'Person name' cannot be an entity type"),
    "nerkit's entities": ('{"text": "张三", "entities": [{"start": 0, "end": 2, "type": "PER"}]}', "needs integer \"start_offset\""),
}


@pytest.mark.parametrize("case", DOCCANO_ERRORS)
def test_a_malformed_doccano_record_names_its_line_and_the_fix(case, nerkit, write_file, tmp_path):
    record, words = DOCCANO_ERRORS[case]
    path = write_file('{"text": "李四", "label": [[0, 2, "PER"]]}\n' + record + "\n", "export.jsonl")
    err = read_error(path, "doccano")
    assert err.where == f"{path}:2" and words in err.message and err.fix
    result = nerkit("data", "convert", str(path), str(tmp_path / "out.bio"), "--from", "doccano", "--to", "bio", check=False)
    assert_one_error_line(result, f"{path}:2", words)
    assert not (tmp_path / "out.bio").exists()


def test_doccano_errors_are_all_listed_by_validate_style_reading(write_file):
    from nerkit.errors import ManyErrors

    path = write_file('{"text": "张三", "label": [[0, 3, "PER"]]}\n{"text": "李四"}\n', "export.jsonl")
    with pytest.raises(ManyErrors) as info:
        read_corpus(path, fmt="doccano", max_errors=20)
    assert [e.where for e in info.value.errors] == [f"{path}:1", f"{path}:2"]


def test_other_formats_name_the_converter(write_file):
    doccano = write_file('{"text": "张三", "label": [[0, 2, "PER"]]}\n', "export.jsonl")
    assert "--from doccano" in read_error(doccano, "auto").fix
    label_studio = write_file(json.dumps([ls_task("张三", [(0, 2, "PER")])], indent=2), "export.json")
    err = read_error(label_studio, "auto")
    assert err.where == f"{label_studio}:1" and "--from label-studio" in err.fix
    compact = write_file(json.dumps([ls_task("张三", [(0, 2, "PER")])]), "compact.json")  # the array on one line
    assert "--from label-studio" in read_error(compact, "auto").fix
    assert "--from doccano or --from jsonl" in read_error(doccano, "label-studio").fix
    assert "without --from doccano" in read_error(FIXTURES / "three_types.jsonl", "doccano").fix


# ---------------------------------------------------------------- reading Label Studio


def write_tasks(write_file, tasks) -> Path:
    return write_file(json.dumps(tasks, ensure_ascii=False, indent=2), "export.json")


def test_label_studio_choices_of_annotation(write_file, caplog):
    """Cancelled annotations are not read; several are read from the ground truth, or when they agree;
    a task nobody annotated is left out (it is not a text without entities); results other than
    spans are not entities; Label Studio's own keys are allowed."""
    text = "张三在北京"
    tasks = [
        ls_task(text, [(0, 2, "PER")], id=11, project=1, meta={}, predictions=[{"model_version": "x", "result": []}]),
        ls_task(text, [(0, 2, "PER"), (3, 5, "LOC")], [(0, 2, "PER")]),  # disagree: the ground truth decides
        ls_task(text, [(3, 5, "LOC")], [(3, 5, "LOC")]),  # agree
        ls_task(text, [(0, 2, "ORG")], [(0, 2, "PER")]),  # the first is cancelled
        ls_task(text, [(0, 5, "LOC")]),  # all cancelled: skipped
        {"data": {"text": "没有标注"}, "annotations": [], "predictions": [5]},  # nobody annotated it
        ls_task(text, []),  # annotated: no entities
    ]
    tasks[1]["annotations"][1]["ground_truth"] = True
    tasks[3]["annotations"][0]["was_cancelled"] = True
    tasks[4]["annotations"][0]["was_cancelled"] = True
    tasks[0]["annotations"][0]["result"] += [
        {"from_name": "sentiment", "to_name": "text", "type": "choices", "value": {"choices": ["Positive"]}},
        {"from_id": "r0", "to_id": "r3", "type": "relation", "direction": "right"}]
    with caplog.at_level("WARNING", logger="nerkit"):
        corpus = read_corpus(write_tasks(write_file, tasks), fmt="label-studio")
    assert [(s.spans(), s.line) for s in corpus.sentences] == [
        ([Span(0, 2, "PER")], 1), ([Span(0, 2, "PER")], 2), ([Span(3, 5, "LOC")], 3), ([Span(0, 2, "PER")], 4), ([], 7)]
    assert "left out 1 task without an annotation" in caplog.text
    assert "left out 1 task whose annotations were all cancelled" in caplog.text


def test_label_studio_text_checks_allow_collapsed_whitespace_and_old_utf16_offsets(write_file):
    text = "😀张三在北京  大学"
    collapsed = ls_result(text, 4, 10, "ORG")
    collapsed["value"]["text"] = "北京 大学"  # Label Studio may save it so: the offsets are right
    old = ls_result(text, 2, 4, "PER")  # Label Studio before 2022 counted UTF-16 units: 张三 at 2:4
    old["value"]["text"] = "张三"
    no_text = ls_result(text, 0, 1, "EMOJI")
    del no_text["value"]["text"]
    task = {"data": {"text": text}, "annotations": [{"result": [collapsed, old, no_text]}]}
    (sentence,) = read_corpus(write_tasks(write_file, [task]), fmt="label-studio").sentences
    assert sentence.spans() == [Span(0, 1, "EMOJI"), Span(1, 3, "PER"), Span(4, 10, "ORG")]


def test_a_single_task_and_an_empty_array(write_file):
    one = write_file(json.dumps(ls_task("张三", [(0, 2, "PER")]), ensure_ascii=False), "task.json")
    assert entities(one, "label-studio") == [("张三", [Span(0, 2, "PER")])]
    assert read_error(write_file("[]", "empty.json"), "label-studio").message == "the file has no sentences"


def ls_errors() -> dict[str, tuple[object, str]]:
    """case -> (the second task, words of its error)."""
    text = "张三丰在北京"
    hypertext = ls_task(text, [(0, 2, "PER")])
    hypertext["annotations"][0]["result"][0]["value"].update(start="/p[1]/text()[1]", end="/p[1]/text()[1]")
    no_label = ls_task(text, [(0, 2, "PER")])
    no_label["annotations"][0]["result"][0]["value"]["labels"] = []  # two labels are a span with two types
    moved = ls_task(text, [(0, 2, "PER")])
    moved["annotations"][0]["result"][0]["value"]["text"] = "三丰"
    no_result = ls_task(text, [])
    del no_result["annotations"][0]["result"]
    paragraphs = ls_task(text, [(0, 2, "PER")])
    paragraphs["annotations"][0]["result"][0]["type"] = "hypertextlabels"
    return {
        "no data.text": ({"data": {"sentence": text}, "annotations": []}, 'no "data": {"text": "..."} string'),
        "not an object": ([text], "the task is a JSON list, not an object"),
        "HyperText offsets": (hypertext, "needs integer start and end"),
        "no label on a span": (no_label, "has labels [], not a list of labels"),
        "the text is not at the offsets": (moved, "the result's text '三丰' is not the text at 0:2 ('张三')"),
        "outside the text": (ls_task(text, [(4, 9, "LOC")]), "LOC at 4:9 is outside the text of 6 characters"),
        "a label with a space": (ls_task(text, [(0, 3, "Person name")]), "'Person name' cannot be an entity type"),
        "disagreeing annotations": (ls_task(text, [(0, 3, "PER")], [(0, 2, "PER")], id=42),
                                    "its 2 annotations (ids ?, ?) disagree"),
        "no result": (no_result, 'an item of "annotations" has no "result" list'),
        "spans of another tag": (paragraphs, "a result of type 'hypertextlabels'"),
    }


@pytest.mark.parametrize("case", list(ls_errors()))
def test_a_malformed_label_studio_task_names_its_index_and_the_fix(case, nerkit, write_file, tmp_path):
    task, words = ls_errors()[case]
    path = write_tasks(write_file, [ls_task("李四", [(0, 2, "PER")]), task])
    where = f"{path}: task 1" + (" (id 42)" if case == "disagreeing annotations" else "")
    err = read_error(path, "label-studio")
    assert err.where == where and words in err.message and err.fix
    result = nerkit("data", "convert", str(path), str(tmp_path / "out.bio"), "--from", "label-studio", "--to", "bio",
                    check=False)
    assert_one_error_line(result, where, words)


@pytest.mark.parametrize("content, where, words", [
    ('[{"data": {"text": "张三"},\n "annotations": []', ":2", "not valid JSON"),
    ('{"text": "张三", "label": []}', "", "not an array of tasks"),
    (json.dumps([{"data": {"text": "张三"}, "annotations": [{"result": [], "was_cancelled": True}]}]), "",
     "none of its 1 task has an annotation"),
])
def test_a_label_studio_file_that_is_not_tasks(nerkit, write_file, content, where, words):
    path = write_file(content, "export.json")
    err = read_error(path, "label-studio")
    assert err.where == f"{path}{where}" and words in err.message and err.fix


def test_a_token_conll_cannot_hold_is_named_by_its_task(nerkit, write_file, tmp_path):
    path = write_tasks(write_file, [ls_task("李四", [(0, 2, "PER")]), ls_task("NBA\n2K", [(0, 6, "GAME")])])
    result = nerkit("data", "convert", str(path), str(tmp_path / "out.bio"), "--from", "label-studio", "--to", "bio",
                    check=False)
    assert_one_error_line(result, f"{path}: task 1", "the token '\\n' cannot be written")
