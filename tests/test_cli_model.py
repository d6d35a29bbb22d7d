"""Tests for the model commands of the CLI: `nerkit train`, `nerkit eval` and `nerkit predict` (its
three formats, stdin, pipes, --output, blank lines, input order) and their exit code 2 on user errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from helpers import parse_jsonl, run_cli

from nerkit.data.tags import Span, tags_to_spans
from nerkit.inference.model_dir import MODEL_FILES

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent

TEXTS = [
    "张伟在北京工作。",
    "",
    "清华大学位于北京，李娜是那里的学生。",
    "no Chinese here 123",
    "刘洋去天元集团参观了。" * 30,  # longer than data.max_len (250): split and stitched
    "　ＡＢＣ😀张伟\t李娜",
    "",
    "新华社的记者王芳报道了这件事。",
]


@pytest.fixture
def texts_file(tmp_path) -> Path:
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------ train, eval


def test_train_then_eval_from_the_command_line(tmp_path, monkeypatch, capfd):
    config = {
        "data": {"train": str(FIXTURES / "tiny_train.bio"), "dev": str(FIXTURES / "tiny_dev.bio")},
        "embeddings": {"char_dim": 16, "bichar_dim": 8, "dropout": 0.0},
        "encoder": {"name": "bilstm", "hidden_size": 16},
        "train": {"epochs": 4, "batch_size": 8, "lr": 0.02, "seed": 2, "device": "cpu"},
        "output_dir": str(tmp_path / "not-used"),
    }
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    out = tmp_path / "model"
    code, stdout, stderr = run_cli(monkeypatch, capfd, "train", "--config", str(tmp_path / "tiny.yaml"),
                                   "--out", str(out), "--set", "train.epochs=3")
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary["epochs"] == 3 and 0 <= summary["dev_f1"] <= 100
    assert all((out / name).is_file() for name in MODEL_FILES)
    assert not (tmp_path / "not-used").exists()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3

    code, stdout, stderr = run_cli(monkeypatch, capfd, "eval", "--model", str(out), "--data",
                                   str(FIXTURES / "tiny_dev.bio"), "--json")
    assert code == 0, stderr
    figures = json.loads(stdout)
    assert set(figures) == {"precision", "recall", "f1", "per_type", "counts"}
    assert all(0 <= figures[k] <= 1 for k in ("precision", "recall", "f1"))
    assert set(figures["per_type"]) == {"LOC", "ORG", "PER"}
    for m in figures["per_type"].values():
        assert all(0 <= m[k] <= 1 for k in ("precision", "recall", "f1")) and m["support"] > 0
    # The dev figure that training reported is the one `nerkit eval` computes.
    assert round(100 * figures["f1"], 2) == summary["dev_f1"]

    code, stdout, _ = run_cli(monkeypatch, capfd, "eval", "--model", str(out), "--data", str(FIXTURES / "tiny_dev.bio"))
    assert code == 0 and stdout.splitlines()[-1].split()[0] == "overall"


def test_eval_checks_its_output_before_the_evaluation(tiny_model_dir, tmp_path, monkeypatch, capfd):
    """`nerkit eval --output`: a directory, a path in a missing directory, a directory it cannot
    write or the gold file itself is refused at once (exit 2, one line), before the model loads:
    it used to be a traceback after the whole evaluation, its result lost."""
    from nerkit.inference.pipeline import Pipeline

    gold = tmp_path / "gold.bio"
    gold.write_bytes((FIXTURES / "tiny_dev.bio").read_bytes())
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() == 0:  # root may write there all the same: the permission check is told so
        access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode: access(path, mode) and Path(path) != locked)
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "link.bio").symlink_to(gold)

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the output was checked")

    monkeypatch.setattr(Pipeline, "load", load)
    cases = [(tmp_path / "a_dir", "is a directory"), (tmp_path / "missing" / "out.txt", "does not exist"),
             (locked / "out.txt", "is not writable"), (gold, "is the input file"),
             (tmp_path / "link.bio", "is the input file")]
    try:
        for output, words in cases:
            code, stdout, stderr = run_cli(monkeypatch, capfd, "eval", "--model", str(tiny_model_dir), "--data",
                                           str(gold), "--output", str(output))
            assert code == 2 and stderr.startswith(f"nerkit: error: {output}: ") and words in stderr, stderr
            assert "Traceback" not in stderr and stdout == ""
    finally:
        locked.chmod(0o700)
    assert gold.read_bytes() == (FIXTURES / "tiny_dev.bio").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_dir", "gold.bio", "link.bio", "locked"]
    assert list(locked.iterdir()) == []


def test_eval_of_a_corpus_of_other_entity_types_says_so(tiny_model_dir, tmp_path, monkeypatch, capfd):
    """A model of LOC, ORG and PER on a corpus of GPE and NORP printed a table of zeros and exit 0:
    now an error naming both type sets (the API raises it too). Types that only one side has are a
    warning on stderr, and the scores are printed."""
    import nerkit
    from nerkit.errors import UserError

    other = tmp_path / "other.bio"
    other.write_text("在 O\n北 B-GPE\n京 I-GPE\n\n汉 B-NORP\n族 I-NORP\n", encoding="utf-8")
    code, stdout, stderr = run_cli(monkeypatch, capfd, "eval", "--model", str(tiny_model_dir), "--data", str(other))
    assert code == 2 and stdout == "" and "Traceback" not in stderr, stderr
    assert stderr == (f"nerkit: error: {other}: the gold file shares no entity type with the model (the file's types: "
                      f"GPE, NORP; the model's: LOC, ORG, PER); evaluate on a corpus labelled with the model's types "
                      f"(renamed, if the file spells them otherwise)\n")
    with pytest.raises(UserError, match="shares no entity type"):
        nerkit.load(tiny_model_dir).evaluate(other)

    partial = tmp_path / "partial.bio"
    partial.write_text("张 B-PER\n伟 I-PER\n在 O\n北 B-GPE\n京 I-GPE\n", encoding="utf-8")
    code, stdout, stderr = run_cli(monkeypatch, capfd, "eval", "--model", str(tiny_model_dir), "--data", str(partial),
                                   "--json")
    assert code == 0 and set(json.loads(stdout)) >= {"precision", "recall", "f1"}, stderr
    assert (f"{partial}: the entity types differ (the file's types: GPE, PER; the model's: LOC, ORG, PER): GPE can "
            "only be missed; predicted LOC, ORG can only be spurious") in stderr
    code, _, stderr = run_cli(monkeypatch, capfd, "eval", "--model", str(tiny_model_dir), "--data",
                              str(FIXTURES / "tiny_dev.bio"))
    assert code == 0 and "types differ" not in stderr


def test_train_refuses_a_non_empty_output_directory(tmp_path, monkeypatch, capfd, tiny_model_dir):
    code, _, stderr = run_cli(monkeypatch, capfd, "train", "--config", str(tiny_model_dir / "config.yaml"),
                              "--out", str(tiny_model_dir))
    assert code == 2 and "not empty" in stderr and "Traceback" not in stderr


# ---------------------------------------------------------------------------------------- predict


def parse_conll(text: str) -> list[list[tuple[str, str]]]:
    """One record per input line: its `char tag` lines, then a blank line (alone for an empty text)."""
    records, current = [], []
    for line in text.split("\n")[:-1]:
        if line == "":
            records.append(current)
            current = []
        else:
            char, tag = line.rsplit(" ", 1)
            current.append((char, tag))
    assert current == []
    return records


def spans_of(record: dict) -> list[Span]:
    return [Span(e["start"], e["end"], e["type"]) for e in record["entities"]]


def test_predict_jsonl_keeps_order_blank_lines_and_offsets(tiny_model_dir, texts_file, monkeypatch, capfd):
    code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", str(tiny_model_dir), str(texts_file),
                                   "--batch-size", "2")
    assert code == 0, stderr
    records = parse_jsonl(stdout)
    assert [r["text"] for r in records] == TEXTS
    assert records[1] == {"text": "", "entities": []} and records[6] == {"text": "", "entities": []}
    for record in records:
        for e in record["entities"]:
            assert record["text"][e["start"]:e["end"]] == e["text"]
    assert sum(len(r["entities"]) for r in records) >= 10  # the trained model finds entities
    assert len(records[4]["entities"]) >= 30


def test_predict_conll_and_inline_agree_with_jsonl(tiny_model_dir, texts_file, monkeypatch, capfd):
    model = str(tiny_model_dir)
    _, jsonl, _ = run_cli(monkeypatch, capfd, "predict", "--model", model, str(texts_file), "--format", "jsonl")
    code, conll, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, str(texts_file), "--format", "conll")
    assert code == 0, stderr
    code, inline, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, str(texts_file), "--format", "inline")
    assert code == 0, stderr
    records = parse_jsonl(jsonl)

    blocks = parse_conll(conll)
    assert len(blocks) == len(TEXTS)
    for record, block in zip(records, blocks):
        assert [char for char, _ in block] == list(record["text"])
        assert tags_to_spans([tag for _, tag in block]) == spans_of(record)

    lines = inline.split("\n")
    assert lines[-1] == "" and len(lines) - 1 == len(TEXTS)
    for record, line in zip(records, lines):
        expected, pos = [], 0
        for e in record["entities"]:
            expected.append(record["text"][pos:e["start"]] + f"[{e['text']}]{e['type']}")
            pos = e["end"]
        assert line == "".join(expected) + record["text"][pos:]
        assert re.sub(r"\[([^\]]*)\](?:LOC|ORG|PER)", r"\1", line) == record["text"]


def test_predict_reads_stdin_and_writes_output_files(tiny_model_dir, texts_file, tmp_path, monkeypatch, capfd):
    model = str(tiny_model_dir)
    _, from_file, _ = run_cli(monkeypatch, capfd, "predict", "--model", model, str(texts_file))
    code, from_stdin, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, "-",
                                       stdin=texts_file.read_bytes())
    assert code == 0, stderr
    assert from_stdin == from_file
    code, from_default, _ = run_cli(monkeypatch, capfd, "predict", "--model", model, stdin=texts_file.read_bytes())
    assert code == 0 and from_default == from_file  # the source defaults to stdin
    output = tmp_path / "out" / "pred.jsonl"
    output.parent.mkdir()
    code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, str(texts_file), "--output", str(output))
    assert code == 0, stderr
    assert stdout == ""
    assert output.read_text(encoding="utf-8") == from_file
    assert sorted(p.name for p in output.parent.iterdir()) == ["pred.jsonl"]  # no temporary file left


def test_predict_keeps_line_order_over_many_lines_and_odd_line_ends(tiny_model_dir, tmp_path, monkeypatch, capfd):
    lines = [("张伟在北京" * (i % 7)) + f"第{i}行" for i in range(60)]
    raw = "\r\n".join(lines[:30]).encode() + b"\n" + "\n".join(lines[30:]).encode()  # CRLF, then LF, no final newline
    path = tmp_path / "many.txt"
    path.write_bytes(raw)
    code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", str(tiny_model_dir), str(path),
                                   "--batch-size", "4")
    assert code == 0, stderr
    assert [r["text"] for r in parse_jsonl(stdout)] == lines


def test_predict_conll_with_spaces_and_tabs_reads_back(tiny_model_dir, tmp_path, monkeypatch, capfd):
    """The formats nerkit writes, it reads: predict --format conll -> data validate -> read_corpus,
    and -> data convert --to each scheme -> read_corpus, with the same texts and entities (exact
    offsets) as predict's JSON lines read back."""
    from nerkit.data.corpus import read_corpus

    texts = ["张伟 在 北京\t工作。", "  ", "\t李娜", "New York 的 王芳 ", "\u3000\x0b\x0c\x85\u2028张伟", "张\r伟 \t 李娜"]
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    model = str(tiny_model_dir)
    conll = tmp_path / "pred.bio"
    code, _, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, str(source), "--format", "conll",
                              "--output", str(conll))
    assert code == 0, stderr
    code, stdout, stderr = run_cli(monkeypatch, capfd, "data", "validate", str(conll))
    assert code == 0, stderr
    assert f"OK, {len(texts)} texts" in stdout
    predicted = tmp_path / "pred.jsonl"
    code, _, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, str(source), "--output", str(predicted))
    assert code == 0, stderr
    corpus = read_corpus(conll)
    assert [s.text for s in corpus.sentences] == texts
    expected = [s.spans() for s in read_corpus(predicted).sentences]
    assert [s.spans() for s in corpus.sentences] == expected
    assert any(" " in s.tokens and "\t" in s.tokens for s in corpus.sentences)
    for to in ("bio", "bioes", "bmes"):
        converted = tmp_path / f"converted.{to}"
        code, _, stderr = run_cli(monkeypatch, capfd, "data", "convert", str(conll), str(converted), "--to", to)
        assert code == 0, stderr
        again = read_corpus(converted)
        assert [s.text for s in again.sentences] == texts and [s.spans() for s in again.sentences] == expected
    assert sum(map(len, expected)) >= 2  # entities after spaces and tabs: their offsets are checked


def test_predict_reads_a_json_lines_file_of_texts_and_keeps_their_keys(tiny_model_dir, tmp_path, monkeypatch, capfd):
    """CLUENER's unlabelled test.json (a .json file) and a .txt file with --field: each object's
    text is tagged as the same text on a line of plain text is, and its other keys are kept (in
    the data of a label-studio task); a blank line is none; a line without the field, or a text
    with a line break for conll, is one line naming the input line."""
    model = str(tiny_model_dir)
    texts = ["张伟在北京工作。", "清华大学位于北京，李娜 是那里的学生。"]
    plain = tmp_path / "texts.txt"
    plain.write_text("\n".join(texts) + "\n", encoding="utf-8")
    code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, str(plain))
    assert code == 0, stderr
    expected = parse_jsonl(stdout)
    assert sum(len(r["entities"]) for r in expected) >= 2
    cluener = tmp_path / "test.json"
    cluener.write_text("".join(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n\n"
                               for i, t in enumerate(texts)), encoding="utf-8")
    code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, str(cluener))
    assert code == 0, stderr
    assert parse_jsonl(stdout) == [{"id": i, **r} for i, r in enumerate(expected)]
    rows = tmp_path / "rows.txt"  # a dataset's rows, the text under another key
    rows.write_text("".join(json.dumps({"sentence": t, "meta": {"n": i}}, ensure_ascii=False) + "\n"
                            for i, t in enumerate(texts)), encoding="utf-8")
    code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, str(rows), "--field", "sentence",
                                   "--format", "label-studio")
    assert code == 0, stderr
    tasks = json.loads(stdout)
    assert [t["data"] for t in tasks] == [{"meta": {"n": i}, "text": t} for i, t in enumerate(texts)]
    assert [len(t["predictions"][0]["result"]) for t in tasks] == [len(r["entities"]) for r in expected]
    code, _, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, str(rows))  # a .txt: plain lines
    assert code == 0, stderr
    code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, str(rows), "--field", "sentense")
    assert code == 2 and stdout == "" and len(stderr.splitlines()) == 1
    assert stderr.startswith(f'nerkit: error: {rows}:1: the record has no "sentense" string (its keys: sentence, meta)')
    assert "did you mean 'sentence'" in stderr
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "张伟"}\n{"text": "张伟\\n李娜"}\n', encoding="utf-8")
    code, _, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, str(broken), "--format", "conll")
    assert code == 2 and stderr.startswith(f"nerkit: error: {broken}:2: the text holds a line break")


def test_predict_warns_once_that_a_gold_corpus_s_entities_are_replaced(tiny_model_dir, tmp_path, monkeypatch, capfd):
    """Issue 55: given a gold JSON-lines corpus, predict wrote its predictions over the records'
    `entities` without a word; the log says so once, and how to score the model against them."""
    gold = tmp_path / "gold.jsonl"
    records = [{"text": "张伟在北京工作。", "entities": [{"start": 0, "end": 2, "type": "PER"}]},
               {"text": "李娜是学生。", "entities": []}]
    gold.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", str(tiny_model_dir), str(gold))
    assert code == 0, stderr
    assert [r["text"] for r in parse_jsonl(stdout)] == [r["text"] for r in records]
    warned = [line for line in stderr.splitlines() if '"entities"' in line]
    assert warned == [f'{gold}:1: the input holds "entities", which predict does not read: the output\'s are the '
                      "model's predictions, in their place in --format jsonl; to score the model against the input's, "
                      f"run `nerkit eval --model MODEL --data {gold}`"]
    texts = tmp_path / "texts.jsonl"  # texts alone: nothing to say
    texts.write_text("".join(json.dumps({"text": r["text"]}, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    code, _, stderr = run_cli(monkeypatch, capfd, "predict", "--model", str(tiny_model_dir), str(texts))
    assert code == 0 and '"entities"' not in stderr, stderr


class StubPipe:
    """Stands in for a Pipeline: tags nothing, and raises `error` on its `fail_on`-th chunk (if any)."""

    scheme = "bio"

    def __init__(self, error: type[BaseException] | None = None, fail_on: int = 2):
        self.error, self.fail_on, self.calls = error, fail_on, 0

    def predict_tokens(self, tokens, batch_size, window=None, scores=False):
        self.calls += 1
        if self.error and self.calls == self.fail_on:
            raise self.error("stopped")
        return [[] for _ in tokens]


NOT_TEXT = {
    "GBK on line 2": "张伟在北京。\n".encode() + "李娜在上海。\n".encode("gbk"),
    "a PNG": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\n",
    "UTF-16 with its BOM": "张伟在北京。\n".encode("utf-16"),
    "UTF-16 without a BOM": "张伟 in Beijing\n".encode("utf-16-le"),  # valid UTF-8 bytes, with NULs
}


@pytest.mark.parametrize("case", NOT_TEXT)
def test_predict_refuses_what_is_not_utf8_text_as_data_stats_does(tiny_model_dir, tmp_path, monkeypatch, capfd, case):
    path = tmp_path / "texts.txt"
    path.write_bytes(NOT_TEXT[case])
    code, stdout, predicted = run_cli(monkeypatch, capfd, "predict", "--model", str(tiny_model_dir), str(path))
    assert code == 2 and stdout == "" and "Traceback" not in predicted, predicted
    code, _, stats = run_cli(monkeypatch, capfd, "data", "stats", str(path))
    assert code == 2
    assert predicted == stats  # the same check, the same message: FILE:LINE, what, and the fix
    assert re.match(rf"nerkit: error: {re.escape(str(path))}:\d+: (bytes at offset \d+ are not UTF-8|the line "
                    "contains a NUL byte)", predicted), predicted


def test_predict_names_the_line_of_stdin_that_is_not_utf8(tiny_model_dir, monkeypatch, capfd):
    code, _, stderr = run_cli(monkeypatch, capfd, "predict", "--model", str(tiny_model_dir),
                              stdin=NOT_TEXT["GBK on line 2"])
    assert code == 2
    assert stderr.startswith("nerkit: error: <stdin>:2: bytes at offset 19 are not UTF-8") and "iconv" in stderr


@pytest.mark.parametrize("existing", [False, True])
def test_a_bad_line_after_written_chunks_leaves_no_output(tmp_path, existing):
    """Records of the lines before the bad one were already written (in chunks): none of them may
    be left at --output."""
    from nerkit.errors import CorpusError
    from nerkit.inference.stream import predict_stream

    source = tmp_path / "in.txt"
    source.write_bytes("张伟在北京。\n".encode() * 40 + "李娜".encode("gbk") + b"\n")
    output = tmp_path / "out" / "pred.jsonl"
    output.parent.mkdir()
    if existing:
        output.write_text("old\n")
    pipe = StubPipe()
    with pytest.raises(CorpusError) as info:
        predict_stream(pipe, str(source), str(output), chunk_chars=30)
    assert pipe.calls > 1  # chunks went out before the bad line was read
    assert info.value.where == f"{source}:41"
    assert [p.name for p in output.parent.iterdir()] == (["pred.jsonl"] if existing else [])
    if existing:
        assert output.read_text() == "old\n"


@pytest.mark.parametrize("fmt", ["jsonl", "conll", "inline"])
def test_predict_drops_a_leading_bom_and_offsets_index_the_printed_text(tiny_model_dir, tmp_path, monkeypatch, capfd, fmt):
    """The BOM marks the encoding, it is not text: it is not in the first record, and no entity
    starts with it. A U+FEFF inside a line is a character like any other."""
    texts = ["张伟在北京工作。", "李娜\ufeff王芳", "新华社的记者王芳报道了这件事。"]
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(texts).encode() + b"\n")
    code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", str(tiny_model_dir), str(path), "--format", fmt)
    assert code == 0, stderr
    if fmt == "jsonl":
        records = parse_jsonl(stdout)
        assert [r["text"] for r in records] == texts
        for record in records:
            for e in record["entities"]:
                assert record["text"][e["start"]:e["end"]] == e["text"]
        assert {"start": 0, "end": 2, "type": "PER", "text": "张伟"} in \
            [{k: v for k, v in e.items() if k != "score"} for e in records[0]["entities"]]
    elif fmt == "conll":
        assert ["".join(c for c, _ in block) for block in parse_conll(stdout)] == texts
    else:
        untagged = [re.sub(r"\[([^\]]*)\](?:LOC|ORG|PER)", r"\1", line) for line in stdout.splitlines()]
        assert untagged == texts and stdout.startswith("[张伟]PER")


# ------------------------------------------------------------------------------------ user errors


def test_exit_code_2_for_user_errors(tiny_model_dir, texts_file, tmp_path, monkeypatch, capfd):
    cases = [
        (["predict", "--model", str(tmp_path / "absent"), str(texts_file)], "model directory not found"),
        (["predict", "--model", str(tiny_model_dir), str(texts_file), "--format", "xml"], "Invalid value for '--format'"),
        (["predict", "--model", str(tiny_model_dir), str(tmp_path / "absent.txt")], "input file not found"),
        (["eval", "--model", str(tmp_path / "absent"), "--data", str(FIXTURES / "tiny_dev.bio")], "model directory not found"),
        (["eval", "--model", str(tiny_model_dir), "--data", str(tmp_path / "absent.bio")], "no such file"),
    ]
    for args, message in cases:
        code, stdout, stderr = run_cli(monkeypatch, capfd, *args)
        assert code == 2, (args, stderr)
        assert stderr.startswith("nerkit: error:") and message in stderr, stderr
        assert "Traceback" not in stderr and stdout == ""


@pytest.mark.slow
def test_a_user_error_in_a_real_process_prints_one_line_and_no_traceback(tmp_path, texts_file):
    result = subprocess.run([sys.executable, "-m", "nerkit", "predict", "--model", str(tmp_path / "absent"), str(texts_file)],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "model directory not found" in result.stderr
    assert result.stdout == ""


def test_threads_option_sets_torch_threads_and_keeps_predictions(tiny_model_dir, texts_file, monkeypatch, capfd):
    import torch

    model = str(tiny_model_dir)
    before = torch.get_num_threads()
    try:
        _, default, _ = run_cli(monkeypatch, capfd, "predict", "--model", model, str(texts_file))
        code, one, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, str(texts_file), "--threads", "3")
        assert code == 0, stderr
        assert torch.get_num_threads() == 3
        assert one == default
    finally:
        torch.set_num_threads(before)
    code, _, stderr = run_cli(monkeypatch, capfd, "eval", "--model", model, "--data", str(texts_file), "--threads", "-1")
    assert code == 2 and "Invalid value for '--threads'" in stderr and "Traceback" not in stderr


def test_eval_and_the_api_read_a_gold_file_as_the_model_read_its_training_data(tmp_path, tiny_config,
                                                                                monkeypatch, capfd):
    """One evaluation path: for a model trained with data.repair, `nerkit eval` and
    `model.evaluate(path)` both repair the file's invalid transitions (and say so on stderr), and
    agree; `--no-repair` asks for the strict reading, which refuses the file."""
    import nerkit
    from nerkit.training.loop import train

    invalid = FIXTURES / "invalid_transitions.bio"
    out = tmp_path / "model"
    train(tiny_config("data.repair=true", f"data.dev={invalid}", "train.epochs=2"), out=out, progress_bar=False)
    api = nerkit.load(out).evaluate(invalid)
    code, stdout, stderr = run_cli(monkeypatch, capfd, "eval", "--model", str(out), "--data", str(invalid), "--json")
    assert code == 0, stderr
    assert json.loads(stdout) == api
    assert f"{invalid}: repaired" in stderr
    code, _, stderr = run_cli(monkeypatch, capfd, "eval", "--model", str(out), "--data", str(invalid), "--no-repair")
    assert code == 2 and "invalid" in stderr.lower() and "Traceback" not in stderr


# ------------------------------------------------------------------------------------------- hints


def command_options() -> set[str]:
    """Every long option of every nerkit command (and of `nerkit vectors`)."""
    import typer.main

    from nerkit.cli.app import app
    from nerkit.cli.vectors import vectors_app

    def collect(command, found: set[str]) -> set[str]:
        for param in command.params:
            found.update(o for o in param.opts + param.secondary_opts if o.startswith("--"))
        for sub in getattr(command, "commands", {}).values():
            collect(sub, found)
        return found

    return collect(typer.main.get_command(app), set()) | collect(typer.main.get_command(vectors_app), set())


# Options that nerkit's texts name but that belong to nerkit's entry point or to other programs.
NOT_NERKIT_OPTIONS = {"--debug", "--help", "--force-reinstall", "--porcelain", "--untracked-files",  # main; pip; git
                      "--standalone",  # torchrun
                      "--no-browser", "--internal-host", "--data-dir", "--username", "--password",  # label-studio start
                      "--user-token", "--enable-legacy-api-token"}


def test_every_option_a_message_names_exists():
    """Every `--option` in nerkit's strings (messages, fixes, help) is an option of some command."""
    import ast

    named = {}
    for path in (REPO / "nerkit").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for option in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", node.value):
                    named.setdefault(option, path.name)
    unknown = {o: where for o, where in named.items() if o not in command_options() | NOT_NERKIT_OPTIONS}
    assert not unknown
    assert "--repair" in named and "--set" in named


def all_commands():
    """(words, click command) of every nerkit command and group, and of `nerkit vectors`."""
    import typer.main

    from nerkit.cli.app import app
    from nerkit.cli.vectors import vectors_app

    def walk(command, words):
        yield words, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, words + [name])

    yield from walk(typer.main.get_command(app), [])
    yield from walk(typer.main.get_command(vectors_app), ["<vectors>"])


def test_every_option_has_help_and_flags_show_as_flags():
    """Every option and argument says what it is for in --help (some had nothing), and a boolean
    flag is shown as a flag, not as an option taking `<bool>` (typer's own --help keeps it)."""
    from typer.testing import CliRunner

    from nerkit.cli.app import app
    from nerkit.cli.vectors import vectors_app

    seen = 0
    for words, command in all_commands():
        for param in command.params:
            assert (getattr(param, "help", None) or "").strip(), (words, param.name)
            seen += 1
        runner_app, args = (vectors_app, words[1:]) if words[:1] == ["<vectors>"] else (app, words)
        result = CliRunner().invoke(runner_app, [*args, "--help"], env={"COLUMNS": "200"}, prog_name="nerkit")
        assert result.exit_code == 0, result.output
        shown = [line for line in result.output.splitlines() if "<bool>" in line]
        assert all("--help" in line or "completion" in line for line in shown), (words, shown)
    assert seen > 50


def test_boolean_flags_are_made_by_the_one_flag_helper():
    """Issue 56: a plain --help flag is `nerkit.cli.options.flag`, never typer.Option(False, ...,
    metavar="") written again in a command (ten were)."""
    from pathlib import Path

    import nerkit.cli

    for path in sorted(Path(nerkit.cli.__file__).parent.glob("*.py")):
        if path.name != "options.py":
            assert 'metavar=""' not in path.read_text(encoding="utf-8"), path.name


def test_the_cli_sets_no_threads_itself():
    """Issue 56: --threads is passed to the function a command calls, which applies it (the CLI
    parses, calls one function, prints); calibrate, report and lm adapt set torch's threads in cli/."""
    from pathlib import Path

    import nerkit.cli

    for path in sorted(Path(nerkit.cli.__file__).parent.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert "set_threads" not in text and "set_num_threads" not in text, path.name


def test_the_lists_of_commands_wrap_only_where_a_line_is_full():
    """A group's list of commands at 80 columns breaks a summary only where the next word would
    not fit (issue 41: typer kept the docstrings' own line breaks there, e.g. "in one graph that" /
    "gives tag ids"), and shows each summary whole."""
    import inspect

    from typer.testing import CliRunner

    from nerkit.cli.app import app

    for group in ([], ["data"], ["vectors"], ["plot"], ["lm"]):
        output = CliRunner().invoke(app, [*group, "--help"], env={"COLUMNS": "80"}, prog_name="nerkit").output
        panel = output[output.index("─ Commands ─"):].splitlines()[1:]
        rows = [line[2:-1] for line in panel if line.startswith("│ ")]
        column = len(rows[0]) - len(rows[0].split(maxsplit=1)[1])  # where the summaries start
        width = len(rows[0]) - column
        summaries: dict[str, list[str]] = {}
        name = ""  # a row without a name continues the summary of the command above it
        for row in rows:
            name = row[:column].strip() or name
            summaries.setdefault(name, []).append(row[column:].rstrip())
        for name, lines in summaries.items():
            for line, following in zip(lines, lines[1:]):
                assert len(line) + 1 + len(following.split()[0]) > width - 2, (group, name, lines)
        commands = {c.name or c.callback.__name__: c for c in
                    (app.registered_commands if not group else next(
                        g.typer_instance for g in app.registered_groups if g.name == group[0]).registered_commands)}
        for name, command in commands.items():
            first = " ".join(inspect.cleandoc(command.callback.__doc__).split("\n\n")[0].split())
            assert " ".join(" ".join(summaries[name]).split()) == first, (group, name)


def test_an_invalid_transition_names_how_each_command_repairs(tmp_path, tiny_model_dir, monkeypatch, capfd):
    """The fix of an invalid tag transition names an option of the command that read the file:
    `nerkit train` has no --repair (the config's data.repair, or --set data.repair=true), eval and
    convert have --repair, and validate writes a repaired copy with --repair OUT."""
    invalid = str(FIXTURES / "invalid_transitions.bio")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"data": {"train": invalid, "dev": invalid}}), encoding="utf-8")
    runs = {
        "train": (["train", "--config", str(config), "--out", str(tmp_path / "m")],
                  "set data.repair: true (--set data.repair=true)"),
        "eval": (["eval", "--model", str(tiny_model_dir), "--data", invalid], "pass --repair (repair=True in Python)"),
        "validate": (["data", "validate", invalid], "pass --repair OUT for a repaired copy"),
        "convert": (["data", "convert", invalid, str(tmp_path / "o.bio"), "--to", "bio"], "pass --repair"),
    }
    for command, (args, hint) in runs.items():
        code, _, stderr = run_cli(monkeypatch, capfd, *args)
        lines = [line for line in stderr.splitlines() if "invalid transition" in line]
        assert code == 2 and lines, (command, stderr)
        assert all(f"read it as conlleval does: {hint}" in line for line in lines), (command, stderr)
    assert "--repair" not in run_cli(monkeypatch, capfd, *runs["train"][0])[2].replace("data.repair", "")


# ------------------------------------------------------------- predict: inputs, outputs and pipes


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("existing", [False, True])
def test_a_failed_predict_leaves_no_temporary_file_and_the_old_output(tmp_path, error, existing):
    from nerkit.inference.stream import predict_stream

    source = tmp_path / "in.txt"
    source.write_text("张伟在北京。\n" * 20, encoding="utf-8")
    output = tmp_path / "out" / "pred.jsonl"
    output.parent.mkdir()
    if existing:
        output.write_text("old\n")
    with pytest.raises(error):  # the first chunk is written, the second fails
        predict_stream(StubPipe(error), str(source), str(output), chunk_chars=30)
    assert [p.name for p in output.parent.iterdir()] == (["pred.jsonl"] if existing else [])
    if existing:
        assert output.read_text() == "old\n"


def test_predict_checks_its_output_before_loading_the_model(tiny_model_dir, texts_file, tmp_path, monkeypatch, capfd):
    from nerkit.inference.pipeline import Pipeline

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the output was checked")

    monkeypatch.setattr(Pipeline, "load", load)
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_dir").mkdir()
    cases = [(tmp_path / "missing" / "out.jsonl", "does not exist"),
             (tmp_path / "a_file" / "out.jsonl", "is not a directory"),
             (tmp_path / "a_dir", "is a directory")]
    for output, words in cases:
        code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", str(tiny_model_dir), str(texts_file),
                                       "--output", str(output))
        assert code == 2, stderr
        assert stderr.startswith(f"nerkit: error: {output}: ") and words in stderr, stderr
        assert "Traceback" not in stderr and stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_dir", "a_file", "texts.txt"]


def test_predict_refuses_an_output_directory_it_cannot_write(tiny_model_dir, texts_file, tmp_path, monkeypatch, capfd):
    """chmod 0o500; root may write there all the same, so for root the permission check is told so."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() == 0:
        access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode: access(path, mode) and Path(path) != locked)
    try:
        code, _, stderr = run_cli(monkeypatch, capfd, "predict", "--model", str(tiny_model_dir), str(texts_file),
                                  "--output", str(locked / "out.jsonl"))
    finally:
        locked.chmod(0o700)
    assert code == 2 and "is not writable" in stderr and "Traceback" not in stderr, stderr


def test_predict_refuses_to_write_over_its_input(tiny_model_dir, texts_file, tmp_path, monkeypatch, capfd):
    before = texts_file.read_bytes()
    (tmp_path / "link.txt").symlink_to(texts_file)
    for output in (texts_file, tmp_path / "link.txt"):
        code, _, stderr = run_cli(monkeypatch, capfd, "predict", "--model", str(tiny_model_dir), str(texts_file),
                                  "--output", str(output))
        assert code == 2 and stderr.startswith(f"nerkit: error: {output}: is the input file"), stderr
    assert texts_file.read_bytes() == before


def test_predict_reads_pipes_and_fd_paths_and_names_a_directory(tiny_model_dir, texts_file, tmp_path, monkeypatch, capfd):
    """A named pipe, and /dev/fd/N as bash's <(...) gives; a directory has its own message."""
    model = str(tiny_model_dir)
    _, expected, _ = run_cli(monkeypatch, capfd, "predict", "--model", model, str(texts_file))
    data = texts_file.read_bytes()

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_bytes, args=(data,))
    writer.start()
    try:
        code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, str(fifo))
    finally:
        if writer.is_alive():  # the pipe was never opened for reading: open it so the writer can end
            reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            writer.join(30)
            os.close(reader)
    assert code == 0, stderr
    assert stdout == expected

    read_end, write_end = os.pipe()

    def feed():
        with os.fdopen(write_end, "wb") as f:
            f.write(data)

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, f"/dev/fd/{read_end}")
    finally:
        writer.join()
        os.close(read_end)
    assert code == 0, stderr
    assert stdout == expected

    code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, str(tmp_path))
    assert code == 2 and stderr.startswith(f"nerkit: error: {tmp_path}: is a directory"), stderr


@pytest.mark.slow
def test_predict_reads_dev_stdin(tiny_model_dir, texts_file):
    result = subprocess.run([sys.executable, "-m", "nerkit", "predict", "--model", str(tiny_model_dir), "/dev/stdin"],
                            input=texts_file.read_bytes(), capture_output=True, cwd=REPO, timeout=120,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr.decode()
    assert [r["text"] for r in parse_jsonl(result.stdout.decode())] == TEXTS


@pytest.mark.slow
def test_predict_into_a_pipe_closed_early_ends_quietly(tiny_model_dir, tmp_path):
    """`nerkit predict FILE | head -1`: the reader has what it wanted; exit 0 and nothing on stderr."""
    source = tmp_path / "many.txt"
    source.write_text("张伟在北京的清华大学工作。\n" * 5000, encoding="utf-8")  # some 600 kB of output
    with subprocess.Popen([sys.executable, "-m", "nerkit", "predict", "--model", str(tiny_model_dir), str(source)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "error"}) as process:
        first = process.stdout.readline()
        process.stdout.close()
        stderr = process.stderr.read()
        assert process.wait(timeout=120) == 0, stderr.decode()
    assert stderr == b""
    assert json.loads(first)["text"] == "张伟在北京的清华大学工作。"


@pytest.mark.parametrize("size", ["0", "-3"])
def test_predict_batch_size_must_be_positive(tiny_model_dir, texts_file, monkeypatch, capfd, size):
    code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", str(tiny_model_dir), str(texts_file),
                                   "--batch-size", size)
    assert code == 2, stderr
    assert "--batch-size" in stderr and "Traceback" not in stderr and stdout == ""


@pytest.mark.slow
def test_progress_is_written_as_lines_when_stderr_is_not_a_terminal(tmp_path, tiny_model_dir, monkeypatch, capfd,
                                                                     tiny_config):
    """Under `nohup ... > log` (stderr a file) a bar is never drawn, and a long run still says how far
    it is: a progress line every NERKIT_PROGRESS_SECONDS (here 0: at every update), for training and
    for `predict`; without a bar's carriage returns."""
    from nerkit.config import config_to_yaml

    source = tmp_path / "many.txt"
    source.write_text("张伟在北京的清华大学工作。\n" * 3000, encoding="utf-8")  # several chunks
    with (tmp_path / "log").open("wb") as log:
        result = subprocess.run([sys.executable, "-m", "nerkit", "predict", "--model", str(tiny_model_dir),
                                 str(source), "--output", str(tmp_path / "out.jsonl")],
                                stderr=log, stdout=subprocess.DEVNULL, cwd=REPO, timeout=120,
                                env={**os.environ, "OMP_NUM_THREADS": "1", "NERKIT_PROGRESS_SECONDS": "0"})
    stderr = (tmp_path / "log").read_text(encoding="utf-8")
    assert result.returncode == 0, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("predict: ")]
    assert len(lines) >= 2 and "\r" not in stderr, stderr
    assert "%)" in lines[-1] and "/s" in lines[-1] and "lines 3,000" in lines[-1] and "eta" in lines[0], lines

    monkeypatch.setenv("NERKIT_PROGRESS_SECONDS", "0")
    config = tmp_path / "tiny.yaml"
    config.write_text(config_to_yaml(tiny_config("train.epochs=1")), encoding="utf-8")
    code, _, stderr = run_cli(monkeypatch, capfd, "train", "--config", str(config), "--out", str(tmp_path / "m"))
    assert code == 0 and "\r" not in stderr, stderr
    assert any(line.startswith("epoch 1: ") and "batches (" in line and "loss " in line
               for line in stderr.splitlines()), stderr
    monkeypatch.setenv("NERKIT_PROGRESS_SECONDS", "soon")
    code, _, stderr = run_cli(monkeypatch, capfd, "train", "--config", str(config), "--out", str(tmp_path / "n"))
    assert code == 2 and "NERKIT_PROGRESS_SECONDS" in stderr, stderr


def test_version_and_how_much_the_commands_say(tmp_path, monkeypatch, capfd, tiny_config):
    """`--version`; diagnostics (here training's progress lines) go to stderr through logging,
    silenced by --quiet, while the result stays on stdout."""
    from nerkit import __version__
    from nerkit.config import config_to_yaml

    code, stdout, _ = run_cli(monkeypatch, capfd, "--version")
    assert code == 0 and stdout.strip() == f"nerkit {__version__}"
    config = tmp_path / "tiny.yaml"
    config.write_text(config_to_yaml(tiny_config("train.epochs=1")), encoding="utf-8")
    code, stdout, stderr = run_cli(monkeypatch, capfd, "train", "--config", str(config), "--out", str(tmp_path / "a"))
    assert code == 0 and "epoch 1/1" in stderr and json.loads(stdout)["epochs"] == 1
    code, stdout, stderr = run_cli(monkeypatch, capfd, "--quiet", "train", "--config", str(config),
                                   "--out", str(tmp_path / "b"))
    assert code == 0 and stderr == "" and json.loads(stdout)["epochs"] == 1
