"""Tests for the `nerkit data` commands and the CLI's error handling, run as a user runs them: a
subprocess, checked for exit code, stdout and stderr (a user error is one line, no traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import run_nerkit as nerkit

from nerkit.data.corpus import read_corpus
from nerkit.data.tags import Span

pytestmark = pytest.mark.slow  # every test here runs `python -m nerkit`

FIXTURES = Path(__file__).parent / "fixtures"
THREE_TYPES_SPANS = [[Span(0, 2, "PER"), Span(3, 5, "LOC")], [Span(0, 4, "ORG"), Span(5, 6, "PER")]]


def assert_user_error(result: subprocess.CompletedProcess, where, words: str) -> None:
    """Exit code 2 and exactly one line on stderr: `nerkit: error: WHERE: ...` (no WHERE when
    None), no traceback."""
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("nerkit: error: " + (f"{where}: " if where else "")), result.stderr
    assert words in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert result.stdout == ""


# ---------------------------------------------------------------- stats


def test_stats_json():
    names = ["three_types.bio", "three_types.bmes", "three_types.jsonl"]
    result = nerkit("data", "stats", "--json", *(FIXTURES / n for n in names))
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert [Path(s["file"]).name for s in stats] == names
    assert [s["scheme"] for s in stats] == ["bio", "bmes", "spans"]  # JSON lines have no tag scheme
    for s in stats:
        assert (s["sentences"], s["characters"], s["entities_total"]) == (2, 13, 4)
        assert s["entities"] == {"LOC": 1, "ORG": 1, "PER": 2}
        assert s["length"]["max"] == 7
        assert len(s["sha256"]) == 64 and s["known_as"] is None


def test_stats_text():
    result = nerkit("data", "stats", FIXTURES / "invalid_transitions.bio")
    assert result.returncode == 0, result.stderr
    assert "texts         2" in result.stdout
    assert "invalid transitions  2" in result.stdout


def test_stats_of_a_missing_file(tmp_path):
    assert_user_error(nerkit("data", "stats", tmp_path / "absent.bio"), tmp_path / "absent.bio", "no such file")


def test_stats_of_several_files_reports_every_good_one_and_every_bad_one(write_file, tmp_path):
    """A bad file no longer hides the others: their stats, then one error line per bad file, exit 2."""
    bad = write_file("张 O\n三\n", "bad.bio")
    missing = tmp_path / "missing.bio"
    files = [FIXTURES / "three_types.bio", bad, FIXTURES / "three_types.jsonl", missing]
    result = nerkit("data", "stats", *files)
    assert result.returncode == 2
    assert result.stdout.count("texts         2") == 2
    assert f"{FIXTURES / 'three_types.bio'}\n" in result.stdout and f"{FIXTURES / 'three_types.jsonl'}\n" in result.stdout
    assert result.stderr.splitlines() == [
        f"nerkit: error: {bad}:2: expected 2 columns `char TAG`, found 1 ('三'); add the tag after a space or tab "
        "(O outside entities)",
        f"nerkit: error: {missing}: no such file; check the path (and NERKIT_DATA)",
    ]
    result = nerkit("data", "stats", "--json", *files)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 2
    assert [Path(s["file"]).name for s in json.loads(result.stdout)] == ["three_types.bio", "three_types.jsonl"]


def test_stats_of_real_data_smallest_file(data_root):
    path = data_root / "peopledaily" / "example.dev"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    result = nerkit("data", "stats", "--json", path)
    assert result.returncode == 0, result.stderr
    [stats] = json.loads(result.stdout)
    assert stats["sentences"] == 2_318
    assert stats["entities"] == {"LOC": 1_951, "ORG": 984, "PER": 884}
    assert stats["sha256"] == "7d8e6fcd1745e6adcb99d90307d84c3a0f9f8ff5ee6fe62ca27646cb765fc38a"
    assert "People's Daily" in stats["known_as"]


# ---------------------------------------------------------------- validate


@pytest.mark.parametrize("name, summary", [
    ("three_types.bio", "OK, 2 texts, BIO, types LOC, ORG, PER"),
    ("three_types.bmes", "OK, 2 texts, BMES, types LOC, ORG, PER"),
    ("three_types.jsonl", "OK, 2 texts, spans (JSON lines), types LOC, ORG, PER"),
])
def test_validate_ok(name, summary):
    result = nerkit("data", "validate", FIXTURES / name)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{FIXTURES / name}: {summary}"
    assert result.stderr == ""


@pytest.mark.parametrize("content, line, words", [
    (b"\xe5\xbc\xa0 O\n\xd5\xc5 O\n", 2, "are not UTF-8"),  # GBK on line 2
    ("张 O\n三\n".encode(), 2, "found 1"),
    ("张 O\n三 b-per\n".encode(), 2, "did you mean B-PER?"),
    ("张 O\n三 I-PER\n".encode(), 2, "invalid transition"),
    ("北 B-LOC\n京 M-LOC\n市 E-LOC\n\n张 I-PER\n".encode(), 5, "mix I-"),
])
def test_validate_error_is_one_line_with_file_and_line(write_file, content, line, words):
    path = write_file(content)
    assert_user_error(nerkit("data", "validate", path), f"{path}:{line}", words)


def test_validate_lists_every_error_in_line_order(write_file):
    path = write_file("张 B-PER\n三 I-PER\n\n在 O\n京 I-LOC\n\n李\n四 b-per\n\n王 O\n五 I-PER\n\n张 I-ORG\n")
    result = nerkit("data", "validate", path)
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert [line.split(": ")[2] for line in lines] == [f"{path}:{n}" for n in (5, 7, 8, 11, 13)] + [str(path)]
    assert "I-LOC after O continues no entity" in lines[0] and "found 1" in lines[1] and "did you mean B-PER?" in lines[2]
    assert all(line.startswith("nerkit: error: ") for line in lines)
    assert lines[-1] == f"nerkit: error: {path}: 5 errors"


def test_validate_lists_the_first_twenty_errors_and_counts_all_as_stats_does(write_file):
    path = write_file("在 O\n京 I-LOC\n\n" * 25)
    result = nerkit("data", "validate", path)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 21
    assert lines[0].startswith(f"nerkit: error: {path}:2: invalid transition") and lines[19].startswith(f"nerkit: error: {path}:59: ")
    assert lines[-1] == f"nerkit: error: {path}: 25 errors, the first 20 listed"
    assert "invalid transitions  25" in nerkit("data", "stats", path).stdout


def test_validate_empty_file(write_file):
    path = write_file(b"")
    assert_user_error(nerkit("data", "validate", path), path, "empty")


@pytest.mark.parametrize("position", ["first", "last"])
def test_debug_shows_the_traceback(write_file, position):
    path = write_file("张 O\n三\n")
    args = ["data", "validate", path]
    result = nerkit(*(["--debug", *args] if position == "first" else [*args, "--debug"]))
    assert result.returncode not in (0, 2)
    assert "Traceback" in result.stderr
    assert "CorpusError" in result.stderr and f"{path}:2" in result.stderr


def test_validate_repair_writes_a_file_that_validates(tmp_path):
    source, out = FIXTURES / "invalid_transitions.bio", tmp_path / "fixed.bio"
    result = nerkit("data", "validate", source, "--repair", out)
    assert result.returncode == 0, result.stderr
    assert "repaired 2 tags (2 invalid transitions)" in result.stdout
    strict = nerkit("data", "validate", out)
    assert strict.returncode == 0, strict.stderr
    assert [s.spans() for s in read_corpus(out).sentences] == [
        [Span(1, 3, "LOC")], [Span(0, 1, "PER"), Span(1, 2, "ORG")],
    ]


def test_validate_says_a_corpus_is_nested_and_repair_keeps_the_longest_saying_so(write_file, tmp_path):
    """Issue 41: --repair had no rule for overlaps; issue 45: they are nested data, which validate
    describes instead of refusing, and --repair still keeps the longest (--flat outer)."""
    record = ('{"text": "中华人民共和国", "entities": [{"start": 0, "end": 7, "type": "LOC"}, '
              '{"start": 0, "end": 2, "type": "LOC"}, {"start": 5, "end": 7, "type": "LOC"}]}\n')
    path = write_file(record * 2, "two.jsonl")
    result = nerkit("data", "validate", path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (f"{path}: OK, 2 texts, spans (JSON lines), types LOC; nested: 6 of 6 entities "
                             "(100.0%) overlap another in 2 sentences (4 inside another, 0 crossing one), depth 2, "
                             "0 spans with two types\n")
    out = tmp_path / "fixed.jsonl"
    result = nerkit("data", "validate", path, "--repair", out)
    assert result.returncode == 0, result.stderr
    assert ("dropped 4 overlapping entities (--repair keeps the longest entity of each overlap, the earliest of equal "
            "ones, as spaCy's filter_spans does); wrote") in result.stdout
    assert [s.spans() for s in read_corpus(out).sentences] == [[Span(0, 7, "LOC")]] * 2
    assert nerkit("data", "validate", out).stdout.endswith("types LOC\n")


ISSUE_33 = "张 B-PER\n三 I-PER\n在 O\nab O\n北 B-LOC\n京 I-LOC\n"  # `ab`: a token of two characters


def test_a_token_of_several_characters_is_refused_by_validate_and_train_and_split_by_repair(write_file, tmp_path):
    """It once validated as OK and crashed training with LAC-small (a TypeError, exit 1): now every
    path refuses it with FILE:LINE, and each path's repair splits it into its characters."""
    path = write_file(ISSUE_33, "t.bio")
    assert_user_error(nerkit("data", "validate", path), f"{path}:4", "the token 'ab' is longer than one character")
    config = write_file(f"data: {{train: {path}, dev: {path}}}\nembeddings: {{char_dim: 16, bichar_dim: 0}}\n"
                        "encoder: {name: bilstm, hidden_size: 16}\ntrain: {epochs: 1}\n", "c.yaml")
    result = nerkit("train", "--config", config, "--out", tmp_path / "o")
    assert_user_error(result, f"{path}:4", "the token 'ab' is longer than one character")
    assert "--set data.repair=true" in result.stderr and not (tmp_path / "o").exists()
    repaired = nerkit("data", "validate", path, "--repair", tmp_path / "fixed.bio")
    assert repaired.returncode == 0 and "split 1 tokens of several characters" in repaired.stdout, repaired.stderr
    converted = nerkit("data", "convert", path, tmp_path / "fixed.jsonl", "--to", "jsonl", "--repair")
    assert converted.returncode == 0, converted.stderr
    for out in (tmp_path / "fixed.bio", tmp_path / "fixed.jsonl"):
        [sentence] = read_corpus(out).sentences
        assert sentence.tokens == list("张三在ab北京") and sentence.spans() == [Span(0, 2, "PER"), Span(5, 7, "LOC")]


def test_validate_names_a_record_without_entities_and_the_format_it_looks_like(write_file):
    """CLUENER's native `label` (or a misspelt `entites`) once validated as OK with no entities."""
    path = write_file('{"text": "张三", "entities": []}\n{"text": "李四在北京", "label": {"name": {"李四": [[0, 1]]}}}\n',
                      "cluener.jsonl")
    assert_user_error(nerkit("data", "validate", path), f"{path}:2",
                      'the record has no "entities" key; this looks like CLUENER\'s format')


def test_stats_and_validate_count_the_texts_longer_than_max_len(write_file):
    """Issue 55: a 9,000-character article was a "sentence", and nothing said that training cuts it
    into pieces. Both say texts, and count those longer than data.max_len (its default, or --max-len)."""
    path = write_file("".join(json.dumps({"text": "张三在北京。" * n, "entities": [{"start": 0, "end": 2, "type": "PER"}]},
                                         ensure_ascii=False) + "\n" for n in (1, 30, 2000)), "long.jsonl")
    stats = nerkit("data", "stats", path)
    assert stats.returncode == 0, stats.stderr
    assert "  texts         3\n" in stats.stdout
    assert ("  over max_len  1 of 3 texts longer than 250 characters (data.max_len), which training cuts into pieces, "
            "never inside an entity\n") in stats.stdout
    [as_json] = json.loads(nerkit("data", "stats", "--json", "--max-len", "100", path).stdout)
    assert (as_json["sentences"], as_json["max_len"], as_json["longer_than_max_len"]) == (3, 100, 2)
    validated = nerkit("data", "validate", path, "--max-len", "100")
    assert validated.stdout == (f"{path}: OK, 3 texts, spans (JSON lines), types PER; 2 longer than 100 characters "
                                "(data.max_len), which training cuts into pieces, never inside an entity\n")
    assert nerkit("data", "validate", path, "--max-len", "0").stdout == f"{path}: OK, 3 texts, spans (JSON lines), types PER\n"


# ---------------------------------------------------------------- convert


@pytest.mark.parametrize("source", ["three_types.bio", "three_types.bmes", "three_types.jsonl"])
@pytest.mark.parametrize("to, marker", [("bio", "I-ORG"), ("bioes", "S-PER"), ("bmes", "M-ORG"), ("jsonl", '"entities"')])
def test_convert(tmp_path, source, to, marker):
    out = tmp_path / ("out.jsonl" if to == "jsonl" else f"out.{to}")
    result = nerkit("data", "convert", FIXTURES / source, out, "--to", to)
    assert result.returncode == 0, result.stderr
    assert f"-> {out} ({to}), 2 sentences" in result.stdout
    assert marker in out.read_text(encoding="utf-8")
    corpus = read_corpus(out)
    assert corpus.scheme == ("bioes" if to == "jsonl" else to)
    assert [s.text for s in corpus.sentences] == ["张三在北京。", "中国银行见李。"]
    assert [s.spans() for s in corpus.sentences] == THREE_TYPES_SPANS


def test_convert_to_text_writes_the_sentences_alone(write_file, tmp_path):
    """`--to text`: one sentence a line, spaces kept, labels dropped (for predict and lm adapt --text);
    a token that would break a line is named with its input line."""
    source = write_file('{"text": "张三在北京。", "entities": []}\n{"text": "New York 见", "entities": [{"start": 0, '
                        '"end": 8, "type": "LOC"}]}\n', "en.jsonl")
    out = tmp_path / "out.txt"
    assert nerkit("data", "convert", source, out, "--to", "text").returncode == 0
    assert out.read_text(encoding="utf-8") == "张三在北京。\nNew York 见\n"
    broken = write_file('{"text": "张三", "entities": []}\n{"text": "甲\u2028乙", "entities": []}\n', "broken.jsonl")
    assert_user_error(nerkit("data", "convert", broken, tmp_path / "b.txt", "--to", "text"), f"{broken}:2",
                      "breaks the line")
    assert not (tmp_path / "b.txt").exists()


def test_convert_jsonl_to_jsonl_keeps_each_record_s_other_keys(write_file, tmp_path):
    """Issue 55: `{"text", "entities", "doc": 12}` was "unknown key 'doc'" on every line; a corpus's ids
    and metadata now come through, and validate reads the file."""
    records = [{"doc": 12, "text": "张三在北京", "entities": [{"start": 0, "end": 2, "type": "PER"}]},
               {"text": "李四", "entities": [], "meta": {"page": 3}}]
    source = write_file("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "ids.jsonl")
    assert nerkit("data", "validate", source).returncode == 0
    result = nerkit("data", "convert", source, tmp_path / "out.jsonl", "--to", "jsonl")
    assert result.returncode == 0, result.stderr
    written = (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in written] == [records[0], {"meta": {"page": 3}, "text": "李四", "entities": []}]


def test_convert_to_an_unknown_format(tmp_path):
    out = tmp_path / "out.txt"
    assert_user_error(nerkit("data", "convert", FIXTURES / "three_types.bio", out, "--to", "iob"), None,
                      "'iob' is not one of 'bio', 'bioes', 'bmes', 'jsonl', 'text'")
    assert not out.exists()


@pytest.mark.parametrize("to", ["bio", "bioes", "bmes"])
def test_convert_writes_spaces_one_character_per_line_and_reads_them_back(write_file, tmp_path, to):
    """A text with spaces and tabs, to a tag scheme and back to JSON lines: the same texts and
    offsets (a space token is written `  O`, as `nerkit predict --format conll` writes it); a NUL
    is still refused, naming its input line."""
    source = write_file('{"text": "张三", "entities": []}\n{"text": "New York 的\\t王 芳 ", "entities": [{"start": 0, '
                        '"end": 8, "type": "LOC"}, {"start": 10, "end": 14, "type": "PER"}]}\n', "en.jsonl")
    out, back = tmp_path / f"en.{to}", tmp_path / "back.jsonl"
    assert nerkit("data", "convert", source, out, "--to", to).returncode == 0
    assert "\n  O\n" in out.read_text(encoding="utf-8")
    assert nerkit("data", "validate", out).returncode == 0
    assert nerkit("data", "convert", out, back, "--to", "jsonl").returncode == 0
    expected = [(s.text, s.spans()) for s in read_corpus(source).sentences]
    assert [(s.text, s.spans()) for s in read_corpus(back).sentences] == expected
    assert expected[1] == ("New York 的\t王 芳 ", [Span(0, 8, "LOC"), Span(10, 14, "PER")])
    binary = write_file('{"text": "张三", "entities": []}\n{"text": "纽\\u0000约", "entities": []}\n', "nul.jsonl")
    assert_user_error(nerkit("data", "convert", binary, tmp_path / "nul.bio", "--to", "bio"), f"{binary}:2",
                      "cannot be written one character per line")


def test_convert_to_jsonl_names_the_input_line_of_a_long_token(write_file, tmp_path):
    source = write_file("张 O\n\n在 O\nNew B-LOC\nYork I-LOC\n", "words.bio")
    out = tmp_path / "out.jsonl"
    assert_user_error(nerkit("data", "convert", source, out, "--to", "jsonl"), f"{source}:4",
                      "the token 'New' is longer than one character")
    assert not out.exists()


def test_convert_and_repair_refuse_to_replace_their_input(tmp_path):
    """The output may not be the input, however it is spelt: the same path, another spelling, a
    symbolic or a hard link."""
    source = tmp_path / "in.bio"
    source.write_bytes((FIXTURES / "three_types.bio").read_bytes())
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.bio").symlink_to(source)
    os.link(source, tmp_path / "hard.bio")
    targets = [source, tmp_path / "sub" / ".." / "in.bio", tmp_path / "link.bio", tmp_path / "hard.bio"]
    for target in targets:
        assert_user_error(nerkit("data", "convert", source, target, "--to", "bioes"), target, "is the input file")
        assert_user_error(nerkit("data", "validate", source, "--repair", target), target, "is the input file")
    relative = nerkit("data", "convert", "in.bio", source, "--to", "bioes", cwd=tmp_path)
    assert_user_error(relative, source, "is the input file")
    assert source.read_bytes() == (FIXTURES / "three_types.bio").read_bytes()
    assert (tmp_path / "link.bio").is_symlink()


CLUENER_RECORDS = [
    {"text": "浙商银行企业信贷部叶老桂博士则从另一个角度对五道门槛进行了解读。",
     "label": {"name": {"叶老桂": [[9, 11]]}, "company": {"浙商银行": [[0, 3]]}}},
    {"id": 1, "text": "生生不息CSOL生化狂潮让你填弹狂扫", "label": {"game": {"CSOL生化狂潮": [[4, 11]]}}},
    {"text": "彭小军认为，国内银行现在走的是台湾的发卡模式，", "label": {"address": {"台湾": [[15, 16]]}, "name": {"彭小军": [[0, 2]]}}},
    {"text": "没有实体。", "label": {}},
]


def test_convert_from_cluener_to_bio_and_jsonl_keeps_every_entity(write_file, tmp_path):
    source = write_file("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in CLUENER_RECORDS), "train.json")
    expected = [sorted((start, end + 1, typ) for typ, mentions in r["label"].items()
                       for places in mentions.values() for start, end in places) for r in CLUENER_RECORDS]
    for to, name in (("bio", "out.bio"), ("bmes", "out.bmes"), ("jsonl", "out.jsonl")):
        result = nerkit("data", "convert", source, tmp_path / name, "--from", "cluener", "--to", to)
        assert result.returncode == 0, result.stderr
        assert f"-> {tmp_path / name} ({to}), 4 sentences" in result.stdout
        back = read_corpus(tmp_path / name)
        assert [s.text for s in back.sentences] == [r["text"] for r in CLUENER_RECORDS]
        assert [sorted((e.start, e.end, e.type) for e in s.spans()) for s in back.sentences] == expected
    plain = nerkit("data", "convert", source, tmp_path / "x.jsonl", "--to", "jsonl")  # not nerkit's JSON lines
    assert_user_error(plain, f"{source}:1", 'the record has no "entities" key')
    assert "--from cluener" in plain.stderr


def test_convert_from_cluener_names_the_record_of_a_token_conll_cannot_hold(write_file, tmp_path):
    source = write_file('{"text": "张三", "label": {}}\n{"text": "NBA\\n2K", "label": {"game": {"NBA\\n2K": [[0, 5]]}}}\n',
                        "dev.txt")
    assert_user_error(nerkit("data", "convert", source, tmp_path / "out.bio", "--from", "cluener", "--to", "bio"),
                      f"{source}:2", "the token '\\n' cannot be written")


def test_convert_to_text_needs_no_labels(write_file, tmp_path):
    """CLUENER's unlabelled test.json (and JSON lines without entities) to text, the texts alone;
    to any other format a record without labels stays an error, which says how to tag the file."""
    texts = ["四川敦煌学”。近年来，丹棱县等地一些", "NBA 2K 的 玩家"]
    for fmt, source in (("cluener", write_file("".join(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n"
                                                        for i, t in enumerate(texts)), "test.json")),
                        ("jsonl", write_file("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts),
                                             "texts.jsonl"))):
        out = tmp_path / f"{fmt}.txt"
        result = nerkit("data", "convert", source, out, "--from", fmt, "--to", "text")
        assert result.returncode == 0, result.stderr
        assert out.read_text(encoding="utf-8") == "".join(t + "\n" for t in texts)
        labelled = nerkit("data", "convert", source, tmp_path / f"{fmt}.bio", "--from", fmt, "--to", "bio")
        assert_user_error(labelled, f"{source}:1", "no \"label\" key" if fmt == "cluener" else "no \"entities\" key")
        assert "nerkit predict" in labelled.stderr


def test_convert_with_repair(tmp_path):
    out = tmp_path / "fixed.bmes"
    result = nerkit("data", "convert", FIXTURES / "invalid_transitions.bio", out, "--to", "bmes", "--repair")
    assert result.returncode == 0, result.stderr
    assert out.read_text(encoding="utf-8").startswith("在 O\n京 B-LOC\n城 E-LOC\n。 O\n\n张 S-PER\n三 S-ORG\n")


# ---------------------------------------------------------------- train: config errors and --dry-run


def test_train_dry_run_prints_the_resolved_config(tmp_path, monkeypatch):
    monkeypatch.setenv("NERKIT_DATA", str(tmp_path))
    (tmp_path / "x.bio").write_bytes((FIXTURES / "three_types.bio").read_bytes())
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  train: ${NERKIT_DATA}/x.bio\nencoder:\n  name: bilstm\n  hidden_size: 64\n"
                      "train:\n  lr: 1e-3\n", encoding="utf-8")
    result = nerkit("train", "--config", config, "--dry-run", "--set", "train.lr=0.0123",
                    "--set", "encoder.name=transformer", "--out", tmp_path / "model")
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["train"]["lr"] == 0.0123
    assert resolved["encoder"]["name"] == "transformer" and "hidden_size" not in resolved["encoder"]
    assert resolved["data"]["train"] == f"{tmp_path}/x.bio"
    assert resolved["output_dir"] == str(tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_train_dry_run_checks_the_data_files_and_the_output_directory(tmp_path):
    """--dry-run prints the resolved config, then checks what the run would find: each data file
    exists and is a file, and --out is usable (exit 2 and one error line when not)."""
    train_file = tmp_path / "train.bio"
    train_file.write_bytes((FIXTURES / "three_types.bio").read_bytes())
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "config.yaml").write_text("x")  # an earlier run's, which --force may replace
    config = tmp_path / "c.yaml"
    config.write_text(f"data:\n  train: {train_file}\n  dev: {tmp_path / 'dev.bio'}\n", encoding="utf-8")
    cases = [([], tmp_path / "dev.bio", "data.dev: no such file"),
             (["--set", f"data.dev={tmp_path}"], tmp_path, "data.dev: not a file"),
             (["--set", "data.dev=null", "--out", str(tmp_path / "used")], tmp_path / "used", "--out is a directory that is not empty")]
    for args, where, words in cases:
        result = nerkit("train", "--config", config, "--dry-run", *args)
        assert yaml.safe_load(result.stdout)["data"]["train"] == str(train_file)  # printed all the same
        assert result.returncode == 2 and result.stderr.startswith(f"nerkit: error: {where}: {words}"), result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    result = nerkit("train", "--config", config, "--dry-run", "--set", "data.dev=null", "--out", tmp_path / "used",
                    "--force")
    assert result.returncode == 0, result.stderr


def test_train_dry_run_checks_every_path_the_config_names_and_where_relative_ones_are_read(tmp_path):
    """Issue 33: --dry-run once checked the data files alone, and a real run read (and repaired) the
    data before it failed on a missing language model or vector file."""
    (tmp_path / "train.bio").write_text(ISSUE_33, encoding="utf-8")  # a corpus error, found only by reading
    (tmp_path / "c.yaml").write_text("data: {train: train.bio}\nencoder: {name: bilstm, hidden_size: 8}\n",
                                     encoding="utf-8")
    relative = f" in {tmp_path} (relative paths are read from the current directory, not the config file's)"
    cases = [
        ("embeddings.lm.path=lm/absent", "lm/absent", f"embeddings.lm.path: no directory lm/absent in {tmp_path}, "
                                                       "and no Hugging Face model lm/absent in the local cache"),
        ("embeddings.lm.path=train.bio", "train.bio", "embeddings.lm.path: not a directory"),
        ("embeddings.char_vectors=vectors/c.vec", "vectors/c.vec", "embeddings.char_vectors: vector file not found" + relative),
        ("embeddings.bichar_vectors=b.vec", "b.vec", "embeddings.bichar_vectors: vector file not found" + relative),
        ("data.dev=dev.bio", "dev.bio", "data.dev: no such file" + relative),
        (f"embeddings.char_vectors={tmp_path}/c.vec", f"{tmp_path}/c.vec", "embeddings.char_vectors: vector file not found;"),
    ]
    for override, where, words in cases:
        for dry_run in (["--dry-run"], []):
            result = nerkit("train", "--config", "c.yaml", "--set", override, "--out", "out", *dry_run, cwd=tmp_path)
            assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
            assert result.stderr.startswith(f"nerkit: error: {where}: {words}"), result.stderr
    flat = ["--set", "encoder.name=flat", "--set", "encoder.n_heads=2", "--set", "encoder.head_dim=4"]
    result = nerkit("train", "--config", "c.yaml", *flat, "--set", "lexicon.source=words.txt", "--dry-run", cwd=tmp_path)
    assert result.stderr.startswith("nerkit: error: words.txt: lexicon.source: lexicon file not found in"), result.stderr
    result = nerkit("train", "--config", "c.yaml", *flat, "--set", "embeddings.word_vectors=w.vec", "--dry-run", cwd=tmp_path)
    assert result.stderr.startswith("nerkit: error: w.vec: embeddings.word_vectors: vector file not found"), result.stderr


def test_train_dry_run_checks_the_format_of_the_lexicon_and_the_vector_files(tmp_path):
    """Issue 41: binary junk as a lexicon or a vector file passed --dry-run, and the real run failed
    on it after reading the corpora. Each file's first lines are read as the run reads them."""
    import random

    import numpy as np

    (tmp_path / "train.bio").write_bytes((FIXTURES / "three_types.bio").read_bytes())
    (tmp_path / "c.yaml").write_text("data: {train: train.bio}\nencoder: {name: flat, n_heads: 2, head_dim: 4}\n"
                                     "embeddings: {char_dim: null, bichar_dim: 0, word_dim: null}\n",
                                     encoding="utf-8")
    (tmp_path / "junk.bin").write_bytes(random.Random(41).randbytes(8192))
    words = ["张三", "北京", "中国", "张", "三", "在", "京", "城"]
    (tmp_path / "w2v.bin").write_bytes(b"8 4\n" + b"".join(w.encode() + b" " + np.ones(4, "<f4").tobytes()
                                                             for w in words))
    good = ["--set", "lexicon.source=w2v.bin", "--set", "embeddings.char_vectors=w2v.bin",
            "--set", "embeddings.word_vectors=w2v.bin"]
    result = nerkit("train", "--config", "c.yaml", *good, "--dry-run", "--out", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for key in ("lexicon.source", "embeddings.char_vectors", "embeddings.word_vectors"):
        result = nerkit("train", "--config", "c.yaml", *good, "--set", f"{key}=junk.bin", "--dry-run", "--out", "out",
                        cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"nerkit: error: junk.bin:1: {key}: "), result.stderr
        assert "read 2 sentences" not in result.stderr and "train:" not in result.stderr  # before the corpora


def test_train_dry_run_reads_the_corpora_and_warns_of_a_long_warmup_as_the_run_does(tmp_path):
    (tmp_path / "bad.bio").write_text(ISSUE_33, encoding="utf-8")
    train_file = FIXTURES / "three_types.bio"  # 2 sentences: with batch_size 1 and 3 epochs, 6 steps
    config = tmp_path / "c.yaml"
    config.write_text(f"data: {{train: {train_file}, dev: {train_file}}}\n"
                      "train: {epochs: 3, batch_size: 1, warmup: 5}\n", encoding="utf-8")
    result = nerkit("train", "--config", config, "--dry-run", "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "train: 2 sentences, 2 batches an epoch, 6 steps in all" in result.stderr
    assert "train.warmup = 5 is 83% of the 6 steps that 3 epochs of 2 batches make" in result.stderr
    assert not (tmp_path / "out").exists()
    quiet = nerkit("train", "--config", config, "--dry-run", "--set", "train.warmup=0.1", "--out", tmp_path / "out")
    assert quiet.returncode == 0 and "warmup" not in quiet.stderr, quiet.stderr
    bad = nerkit("train", "--config", config, "--dry-run", "--set", f"data.dev={tmp_path / 'bad.bio'}")
    assert bad.returncode == 2 and f"{tmp_path / 'bad.bio'}:4: the token 'ab'" in bad.stderr, bad.stderr


def test_train_with_a_missing_config(tmp_path):
    assert_user_error(nerkit("train", "--config", "missing.yaml", cwd=tmp_path), "missing.yaml", "not found")


def test_train_with_an_unknown_config_key(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("train:\n  lrr: 0.1\n", encoding="utf-8")
    assert_user_error(nerkit("train", "--config", config, "--dry-run"), config, "did you mean 'lr'?")


def test_every_entry_point_runs_the_cli():
    # `python -m nerkit.cli.app` once exited 0 without doing anything
    for module in ("nerkit", "nerkit.cli.app"):
        result = subprocess.run([sys.executable, "-m", module, "data", "stats", "/nonexistent.bio"],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and "/nonexistent.bio" in result.stderr, (module, result.stderr)
