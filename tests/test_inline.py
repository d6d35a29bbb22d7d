"""Tests for inline markup (nerkit.data.inline): the one rule that `nerkit predict --format inline`
writes and `nerkit data convert --from inline` reads, round-tripped through both commands, and the
demo corpus's source (data/sample/source.txt) read back as its train, dev and test files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nerkit.data.corpus import read_corpus
from nerkit.data.inline import inline_line, parse_inline, read_inline
from nerkit.data.tags import Span
from nerkit.errors import CorpusError

REPO = Path(__file__).resolve().parent.parent

TEXTS = [
    "张伟在北京工作。",
    "清华大学位于北京，李娜是那里的学生。",
    "no Chinese here 123",
    "刘洋去天元集团参观了。" * 30,  # longer than the model's window: stitched
    "　ＡＢＣ😀张伟\t李娜",
    "参见[注]与[1]：新华社的记者王芳报道了这件事。",  # brackets that are no entity stay text
]


def test_parse_reads_what_the_writer_writes():
    text = "[注]张伟在北京大学读书，住在上海。"
    spans = [Span(3, 5, "PER"), Span(6, 10, "ORG"), Span(15, 17, "GPE.NAM")]
    line = inline_line(text, spans)
    assert line == "[注][张伟]PER在[北京大学]ORG读书，住在[上海]GPE.NAM。"
    assert parse_inline(line) == (text, spans)
    assert parse_inline("[张三]在[]LOC，[北京]LOC2008年") == ("[张三]在[]LOC，北京2008年", [Span(11, 13, "LOC")])


def test_read_inline_counts_lines_and_refuses_a_nul(write_file):
    corpus = read_inline(write_file("\ufeff[张三]PER来了\r\n\n  \n在[北京]LOC\n", "a.txt"))
    assert [(s.text, s.spans(), s.line) for s in corpus.sentences] == [
        ("张三来了", [Span(0, 2, "PER")], 1), ("在北京", [Span(1, 3, "LOC")], 4)]
    assert corpus.types == ["LOC", "PER"] and corpus.format == "inline"
    with pytest.raises(CorpusError, match="NUL") as info:
        read_corpus(write_file("[张三]PER\n北\x00京\n", "b.txt"), fmt="inline")
    assert info.value.where.endswith("b.txt:2")


def test_predict_inline_then_convert_from_inline_gives_the_same_entities(tiny_model_dir, tmp_path, nerkit):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    model = str(tiny_model_dir)
    expected = [json.loads(line) for line in nerkit("predict", "--model", model, str(texts)).stdout.splitlines()]
    assert sum(len(r["entities"]) for r in expected) >= 10  # the round trip has entities to keep
    inline = tmp_path / "predicted.txt"
    nerkit("predict", "--model", model, str(texts), "--format", "inline", "--output", str(inline))
    converted = tmp_path / "converted.jsonl"
    nerkit("data", "convert", str(inline), str(converted), "--from", "inline", "--to", "jsonl")
    got = [json.loads(line) for line in converted.read_text(encoding="utf-8").splitlines()]
    assert [r["text"] for r in got] == TEXTS
    assert [[(e["start"], e["end"], e["type"]) for e in r["entities"]] for r in got] == \
        [[(e["start"], e["end"], e["type"]) for e in r["entities"]] for r in expected]


def test_the_demo_source_reads_back_as_the_demo_splits(tmp_path, nerkit):
    """data/sample/source.txt (its comment lines aside) holds exactly the sentences and entities of
    train.bio, dev.bio and test.bio, which scripts/make_sample.py (until 52f93a2) cut from it."""
    sample = REPO / "data" / "sample"
    lines = [line for line in (sample / "source.txt").read_text(encoding="utf-8").splitlines()
             if not line.startswith("#")]
    source = tmp_path / "source.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    nerkit("data", "convert", str(source), str(tmp_path / "all.bio"), "--from", "inline", "--to", "bio")
    read = sorted((s.text, tuple(s.spans())) for s in read_corpus(tmp_path / "all.bio").sentences)
    splits = sorted((s.text, tuple(s.spans())) for name in ("train", "dev", "test")
                    for s in read_corpus(sample / f"{name}.bio").sentences)
    assert read == splits and len(read) == 433
