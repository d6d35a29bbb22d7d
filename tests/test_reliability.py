"""Hostile input, end to end through the command line: a catalogue of malformed corpora for
`nerkit data validate` (and `nerkit train`), bad configs, arbitrary Unicode (accepted) and invalid
UTF-8 or NUL bytes (refused, naming the line) for `nerkit predict`, streaming in bounded memory, and model directories that try to make the loader
read outside them.

Commands run as real `python -m nerkit` processes where start-up is part of the point (and through
the CLI's entry point in this process where it is not): the answer to a bad input is either exit 2
with one short line `nerkit: error: FILE[:LINE]: ...` and no traceback, or a deliberate acceptance.
(Interrupted training is in test_resume.py.)
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import run_cli, run_nerkit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_report import Section

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "configs" / "demo.yaml"
SAMPLE = REPO / "data" / "sample"
# One torch thread: on shared cores a second one spins and makes a tiny model many times slower.
ENV = {**os.environ, "PYTHONWARNINGS": "error", "OMP_NUM_THREADS": "1"}
TINY = [f"data.train={SAMPLE / 'train.bio'}", f"data.dev={SAMPLE / 'dev.bio'}", "data.test=null",
        "embeddings.char_dim=8", "embeddings.bichar_dim=8", "encoder.hidden_size=8", "train.threads=1",
        "train.device=cpu"]

REPORT = Section("hostile", "Hostile input (tests/test_reliability.py)", """
Corpora, `nerkit train` and `nerkit predict` run as real `python -m nerkit` processes; config errors
and the CLI model-directory check go through the CLI's entry point inside the test process, and the
property test calls `predict_stream` (what `nerkit predict` runs) directly. "error" means exit code
2 with one short line `nerkit: error: FILE:LINE: message; fix` (or `FILE:` for a whole-file
problem) and no traceback; "accepted" means exit 0, on purpose.
""")
REPORT.table("Corpus catalogue: `nerkit data validate FILE`", ["input", "outcome", "message (stderr or stdout)"])
REPORT.table("Corpora given to `nerkit train`", ["input", "outcome", "message"])
REPORT.table("Configs: `nerkit train --set ...`", ["override", "exit", "message"])
REPORT.table("Prediction on arbitrary text", ["what", "cases", "result"])
REPORT.table("Model directories", ["attack", "result"])


@pytest.fixture(scope="module", autouse=True)
def report():
    yield REPORT
    REPORT.write_if_asked()


def nerkit(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_nerkit(*args, timeout=timeout, env=ENV, text=False)


def nerkit_here(monkeypatch, capfd, *args) -> subprocess.CompletedProcess:
    """`nerkit ARGS` in this process (no start-up cost): exit code and output as a process gives them."""
    result = run_cli(monkeypatch, capfd, *args)
    return subprocess.CompletedProcess(args, result.returncode, result.stdout.encode(), result.stderr.encode())


def sets(overrides: list[str]) -> list[str]:
    return [a for s in overrides for a in ("--set", s)]


def text_of(stream: bytes) -> str:
    return stream.decode("utf-8", errors="replace")


def check_user_error(result: subprocess.CompletedProcess, where: str, words: str) -> str:
    """Exit 2, one short line starting `nerkit: error: WHERE: `, containing `words`, no traceback."""
    err = text_of(result.stderr)
    assert result.returncode == 2, err[-2000:]
    assert "Traceback" not in err
    assert err.startswith(f"nerkit: error: {where}: "), err[:500]
    assert words in err, err[:500]
    assert err.count("\n") == 1 and len(err) < 600, f"the message should be one short line: {err[:300]!r}..."
    return err.strip()


# ------------------------------------------------------------------------- the corpus catalogue

DIRECTORY, MISSING = "<a directory>", "<no such path>"
OK = "accepted"
FILE = "the whole file"
LONG_SENTENCE = "".join(("张伟" if i % 50 == 0 else "在") for i in range(5000))
LONG_TAGS = ["B-PER" if i % 50 == 0 else "I-PER" if i % 50 == 1 else "O" for i in range(5000)]
RANDOM_BYTES = random.Random(7).randbytes(4096)


def conll(tokens, tags) -> str:
    return "".join(f"{t} {g}\n" for t, g in zip(tokens, tags))


def jsonl(*records) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def bad_utf8_line(data: bytes) -> int:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return data[: e.start].count(b"\n") + 1
    raise AssertionError("the bytes are valid UTF-8")


PER = {"start": 0, "end": 2, "type": "PER"}
# (file name, content, outcome: OK | FILE | line number, words in the message)
CATALOGUE = [
    # encodings and bytes
    ("truncated_mid_character.bio", "张 B-PER\n三 I-PER\n".encode()[:-8], 2, "not UTF-8"),
    ("gbk.bio", "张 B-PER\n三 I-PER\n".encode("gbk"), 1, "iconv -f GBK"),
    ("utf16_with_bom.bio", "张 B-PER\n三 I-PER\n".encode("utf-16"), 1, "not UTF-8"),
    ("utf16le_without_bom.bio", "O O\n".encode("utf-16-le"), 1, "NUL byte"),
    ("nul_bytes.bio", b"\xe5\xbc\xa0 B-PER\n\x00\x00 O\n", 2, "NUL byte"),
    ("random_bytes.bio", RANDOM_BYTES, bad_utf8_line(RANDOM_BYTES), "not UTF-8"),
    ("overlong_utf8.bio", b"\xc0\xaf O\n", 1, "not UTF-8"),
    ("utf8_encoded_surrogate.bio", b"\xed\xa0\x80 O\n", 1, "not UTF-8"),
    ("bom.bio", "\ufeff张 B-PER\n三 I-PER\n", OK, "OK, 1 texts, BIO, types PER"),
    ("crlf.bio", "张 B-PER\r\n三 I-PER\r\n\r\n在 O\r\n", OK, "OK, 2 texts"),
    ("no_final_newline.bio", "张 B-PER\n三 I-PER\n\n在 O", OK, "OK, 2 texts"),
    # empty and not-a-file
    ("empty.bio", b"", FILE, "the file is empty"),
    ("only_blank_lines.bio", "\n \n\t\n\r\n\n", FILE, "the file is empty"),
    ("bom_and_blank_lines.bio", "\ufeff\n\n", FILE, "no sentences"),
    ("a_directory.bio", DIRECTORY, FILE, "is a directory"),
    ("missing.bio", MISSING, FILE, "no such file"),
    # columns and separators
    ("tabs_and_spaces_mixed.bio", "张\t B-PER\n三 \tI-PER\n", OK, "OK, 1 texts"),
    ("three_columns.bio", "张 NR B-PER\n三 NR I-PER\n", OK, "OK, 1 texts, BIO, types PER"),
    ("three_then_two_columns.bio", "张 NR B-PER\n三 I-PER\n", 2, "expected 3 columns"),
    ("one_column.bio", "张 B-PER\n三\n", 2, "found 1"),
    ("empty_tag.bio", "张 B-PER\n三 \n", 2, "found 1"),
    ("leading_separator.bio", "张 B-PER\n\tI-PER\n", 2, "empty token"),
    ("ten_mb_line.bio", "字" * 3_500_000, 1, "(3,500,000 characters)"),
    ("ten_mb_token.bio", "字" * 3_500_000 + " O\n", 1, "(3,500,000 characters) is longer than one character;"),
    # tags
    ("lowercase_tags.bio", "张 b-per\n三 i-per\n", 1, "did you mean B-PER?"),
    ("unknown_prefix.bio", "张 X-PER\n", 1, "unknown tag 'X-PER'"),
    ("prefix_without_type.bio", "张 B-\n", 1, "unknown tag 'B-'"),
    ("i_after_o.bio", "在 O\n京 I-LOC\n", 2, "I-LOC after O continues no entity"),
    ("type_switch.bio", "张 B-PER\n三 I-LOC\n", 2, "changes the type"),
    ("bmes_lone_m.bmes", "北 B-LOC\n京 M-LOC\n市 E-LOC\n\n在 O\n人 M-PER\n在 O\n", 6, "M-PER after O"),
    ("bioes_unclosed.bioes", "李 S-PER\n张 B-PER\n在 O\n", 3, "is not closed"),
    ("mixed_i_and_m.bio", "张 B-PER\n三 I-PER\n\n北 B-LOC\n京 M-LOC\n市 E-LOC\n", 5, "mix I-"),
    # characters that other readers treat as line breaks are tokens here (lines end only at \n)
    ("control_characters_as_tokens.bio", "\x0b B-PER\n\x1c I-PER\n\x0c O\n\x1d O\n\x1e O\n\x85 O\n\u2028 O\n\u2029 O\n",
     OK, "OK, 1 texts, BIO, types PER"),
    ("long_sentence_5000_chars.bio", conll(LONG_SENTENCE, LONG_TAGS), OK, "OK, 1 texts, BIO, types PER"),
    # JSON lines
    ("bad_json.jsonl", '{"text": "张三", "entities": [}\n', 1, "not valid JSON"),
    ("json_array_not_object.jsonl", '["张三"]\n', 1, 'no "text" string'),
    # nested data since issue 45: validate says what it is
    ("overlapping_entities.jsonl", jsonl({"text": "张三丰", "entities": [PER, {"start": 1, "end": 3, "type": "PER"}]}),
     OK, "OK, 1 texts, spans (JSON lines), types PER; nested: 2 of 2 entities"),
    ("offsets_out_of_range.jsonl", jsonl({"text": "张三", "entities": [{"start": 1, "end": 9, "type": "PER"}]}),
     1, "outside the text of 2 characters"),
    ("negative_offset.jsonl", jsonl({"text": "张三", "entities": [{"start": -1, "end": 1, "type": "PER"}]}),
     1, "outside the text"),
    ("entities_not_a_list.jsonl", jsonl({"text": "张三", "entities": 5}), 1, '"entities" is int, not a list'),
    ("entities_null.jsonl", jsonl({"text": "张三", "entities": None}), 1, "not a list"),
    ("float_offsets.jsonl", jsonl({"text": "张三", "entities": [{"start": 0.5, "end": 2, "type": "PER"}]}),
     1, "needs integer start"),
    ("string_offsets.jsonl", jsonl({"text": "张三", "entities": [{"start": "0", "end": "2", "type": "PER"}]}),
     1, "needs integer start"),
    ("empty_type.jsonl", jsonl({"text": "张三", "entities": [{"start": 0, "end": 2, "type": ""}]}),
     1, "a type without spaces"),
    ("type_with_space.jsonl", jsonl({"text": "张三", "entities": [{"start": 0, "end": 2, "type": "PER X"}]}),
     1, "a type without spaces"),
    ("bom_and_crlf.jsonl", "\ufeff" + jsonl({"text": "张三", "entities": [PER]}).replace("\n", "\r\n"), OK,
     "OK, 1 texts, spans (JSON lines), types PER"),
    ("u2028_inside_text.jsonl", '{"text": "张三\u2028李四", "entities": [{"start": 3, "end": 5, "type": "PER"}]}\n',
     OK, "OK, 1 texts, spans (JSON lines), types PER"),
    ("cluener_label.jsonl", jsonl({"text": "张三", "label": {"name": {"张三": [[0, 1]]}}}), 1, "looks like CLUENER's format"),
    ("misspelt_entities.jsonl", jsonl({"text": "张三", "entites": [PER]}), 1, "rename 'entites' to 'entities'"),
    ("extra_keys.jsonl", jsonl({"id": 7, "text": "张三", "entities": [PER], "meta": {"page": 3}}), OK,
     "OK, 1 texts, spans (JSON lines), types PER"),
    ("no_entities_key.jsonl", jsonl({"text": "张三", "entities": [PER]}, {"text": "李四"}), 2, 'no "entities" key'),
    ("empty_text.jsonl", jsonl({"text": "", "entities": []}, {"text": "张三", "entities": [PER]}), OK, "OK, 2 texts"),
]
if Path("/dev/zero").exists():  # a device never ends: refused before reading
    CATALOGUE.append(("/dev/zero", "/dev/zero", FILE, "is a device, not a corpus file"))
if Path("/proc/self/mem").exists():  # opens, then every read fails with EIO
    CATALOGUE.append(("/proc/self/mem", "/proc/self/mem", FILE, "cannot read the file (Input/output error)"))
assert len({name for name, *_ in CATALOGUE}) == len(CATALOGUE), "catalogue names must be unique (they key results)"


def materialise(tmp: Path, name: str, content) -> Path:
    if name.startswith("/"):
        return Path(content)
    path = tmp / name
    if content is DIRECTORY:
        path.mkdir()
    elif content is not MISSING:
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


@pytest.fixture(scope="module")
def validated(tmp_path_factory) -> dict:
    """`nerkit data validate` on every catalogue entry, several processes at a time."""
    tmp = tmp_path_factory.mktemp("catalogue")
    paths = {name: materialise(tmp, name, content) for name, content, _, _ in CATALOGUE}
    with ThreadPoolExecutor(4) as pool:
        results = pool.map(lambda name: nerkit("data", "validate", paths[name]), paths)
    return {name: (paths[name], result) for name, result in zip(paths, results)}


def check_validate_errors(result: subprocess.CompletedProcess, path: Path, where: str, words: str) -> str:
    """`nerkit data validate` lists every error of a file: one is one short line (check_user_error);
    several are a line each, the first at WHERE with `words`, then a line counting them."""
    lines = text_of(result.stderr).splitlines()
    if len(lines) <= 1:
        return check_user_error(result, where, words)
    assert result.returncode == 2 and "Traceback" not in text_of(result.stderr)
    assert lines[0].startswith(f"nerkit: error: {where}: ") and words in lines[0], lines[0][:500]
    assert all(line.startswith(f"nerkit: error: {path}:") and len(line) < 600 for line in lines[:-1])
    assert lines[-1] == f"nerkit: error: {path}: {len(lines) - 1} errors"
    return f"{lines[0]} (and {len(lines) - 2} more, then: {lines[-1].removeprefix('nerkit: error: ')})"


@pytest.mark.slow
@pytest.mark.parametrize("name, content, outcome, words", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_validate_catalogue(validated, name, content, outcome, words):
    path, result = validated[name]
    if outcome == OK:
        assert result.returncode == 0, text_of(result.stderr)[-2000:]
        assert text_of(result.stdout).startswith(f"{path}: {words}"), text_of(result.stdout)[:300]
        REPORT.row("Corpus catalogue: `nerkit data validate FILE`", name, "accepted", text_of(result.stdout).strip())
        return
    where = f"{path}" if outcome == FILE else f"{path}:{outcome}"
    message = check_validate_errors(result, path, where, words)
    REPORT.row("Corpus catalogue: `nerkit data validate FILE`", name,
               "error (file)" if outcome == FILE else f"error at line {outcome}", message)


def test_separators_other_than_newline_stay_inside_their_line(tmp_path):
    """Lines end only at \\n (a \\r before it is dropped): \\x0b, \\x0c, \\x1c-\\x1e, \\x85, U+2028 and
    U+2029, which str.splitlines() would treat as line breaks, are ordinary tokens."""
    from nerkit.data.corpus import read_corpus

    name, content, *_ = next(c for c in CATALOGUE if c[0] == "control_characters_as_tokens.bio")
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    [sentence] = read_corpus(path).sentences
    assert sentence.tokens == ["\x0b", "\x1c", "\x0c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
    assert sentence.tags == ["B-PER", "I-PER"] + ["O"] * 6


@pytest.mark.slow
def test_train_names_the_line_of_a_hostile_corpus(tmp_path):
    bad = tmp_path / "empty_type.jsonl"
    bad.write_text(jsonl({"text": "张三", "entities": [PER]}, {"text": "李四", "entities": [{"start": 0, "end": 2, "type": " "}]}),
                   encoding="utf-8")
    result = nerkit("train", "--config", DEMO, "--out", tmp_path / "run", *sets(TINY + [f"data.train={bad}"]))
    message = check_user_error(result, f"{bad}:2", "a type without spaces")
    REPORT.row("Corpora given to `nerkit train`", "a JSON-lines entity whose type is a space", "error at line 2", message)


@pytest.mark.slow
def test_train_accepts_a_long_sentence_of_control_characters(tmp_path):
    corpus = tmp_path / "long.bio"
    controls = "\x0b\x1c\x1d\x1e\x85\u2028\u2029\x0c"
    corpus.write_text(conll(LONG_SENTENCE, LONG_TAGS) + "\n" + conll(controls, ["B-LOC", "I-LOC"] + ["O"] * 6),
                      encoding="utf-8")
    result = nerkit("train", "--config", DEMO, "--out", tmp_path / "run",
                    *sets(TINY + [f"data.train={corpus}", "train.epochs=1", "train.batch_size=8"]))
    assert result.returncode == 0, text_of(result.stderr)[-2000:]
    summary = json.loads(result.stdout)
    assert summary["epochs"] == 1
    vocab = json.loads((tmp_path / "run" / "vocab.json").read_text(encoding="utf-8"))
    assert all(c.isspace() for c in controls)  # each is whitespace: the model reads it as the one space
    assert " " in vocab["chars"] and not set(controls) & set(vocab["chars"])
    assert "split into" in text_of(result.stderr)  # the 5,000-character sentence was cut at data.max_len
    REPORT.row("Corpora given to `nerkit train`", "a 5,000-character sentence and control characters as tokens",
               "accepted", "trained; the sentence split at data.max_len, every control character (all whitespace) "
               "read as the one space token")


# -------------------------------------------------------------------------------------- configs

CONFIG_ERRORS = [
    # (override, where the message points: the --set that gave the value, words)
    ("train.epochz=3", "--set train.epochz=3", "unknown key train.epochz; did you mean 'epochs'?"),
    ("train.lr=fast", "--set train.lr=fast", "train.lr: 'fast' is not a valid float"),
    ("encoder.name=lstmm", "--set encoder.name=lstmm: encoder.name", "unknown encoder 'lstmm'"),
    ("encoder.hidden_size=-5", "--set encoder.hidden_size=-5", "encoder.hidden_size = -5 must be at least 1"),
    ("encoder.hidden_size=0", "--set encoder.hidden_size=0", "encoder.hidden_size = 0 must be at least 1"),
    ("encoder.num_layers=0", "--set encoder.num_layers=0", "encoder.num_layers = 0 must be at least 1"),
    ("train.eval_batch_size=0", "--set train.eval_batch_size=0", "train.eval_batch_size = 0 must be at least 1"),
    ("train.lr=.nan", "--set train.lr=.nan", "train.lr = nan must be a finite number"),
    ("encoder.dropout=1.5", "--set encoder.dropout=1.5", "encoder.dropout = 1.5 must be in [0, 1)"),
]


@pytest.mark.slow
@pytest.mark.parametrize("override, where, words", CONFIG_ERRORS, ids=[c[0] for c in CONFIG_ERRORS])
def test_config_error_from_the_command_line(monkeypatch, capfd, tmp_path, override, where, words):
    """In this process: a process each would only add start-up time (`nerkit train` with a bad
    corpus above runs as a real process)."""
    result = nerkit_here(monkeypatch, capfd, "train", "--config", DEMO, "--out", tmp_path / "run", "--set", override)
    message = check_user_error(result, where, words)
    assert not (tmp_path / "run").exists()
    REPORT.row("Configs: `nerkit train --set ...`", override, 2, message)


@pytest.mark.slow
def test_missing_training_file_names_the_file(monkeypatch, capfd, tmp_path):
    missing = tmp_path / "nowhere" / "train.bio"
    result = nerkit_here(monkeypatch, capfd, "train", "--config", DEMO, "--out", tmp_path / "run",
                         "--set", f"data.train={missing}")
    message = check_user_error(result, missing, "no such file")
    REPORT.row("Configs: `nerkit train --set ...`", "data.train=<a path that does not exist>", 2, message)


# ----------------------------------------------------------------------- prediction on anything


@pytest.fixture(scope="module")
def trained_model(tmp_path_factory) -> Path:
    """A tiny model after 10 steps (it tags few entities); data.max_len 50 makes long lines split."""
    from nerkit.config import load_config
    from nerkit.training.loop import train

    out = tmp_path_factory.mktemp("trained_model") / "model"
    train(load_config(DEMO, TINY + ["train.max_steps=10", "train.epochs=1", "data.max_len=50"]), out=out)
    return out


@pytest.fixture(scope="module")
def entity_model(trained_model, tmp_path_factory) -> Path:
    """The tiny model nudged to tag entities often, so that offsets get checked many times."""
    import torch

    from nerkit.inference.pipeline import Pipeline

    pipe = Pipeline.load(trained_model)
    with torch.no_grad():
        for i, tag in enumerate(pipe.tags):
            pipe.model.head.emission.bias[i] += 0.0 if tag == "O" else 4.0
    return pipe.save(tmp_path_factory.mktemp("entity_model") / "model")


def raw_lines(data: bytes) -> list[bytes]:
    """The lines `nerkit predict` reads in these bytes: split at \\n only, a final \\r dropped."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def first_bad_line(data: bytes) -> int | None:
    """The 1-based line `nerkit predict` must refuse (not UTF-8, or a NUL byte), or None."""
    for number, line in enumerate(data.split(b"\n"), 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            return number
        if b"\x00" in line:
            return number
    return None


def expected_lines(data: bytes) -> list[str]:
    """The texts of the records `nerkit predict` must give for these (valid) bytes; a leading BOM
    is not part of the first text."""
    texts = [line.decode("utf-8") for line in raw_lines(data)]
    if texts and texts[0].startswith("\ufeff"):
        texts[0] = texts[0][1:]
    return texts


def read_records(path: Path) -> list[dict]:
    text = path.read_bytes().decode("utf-8")
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.split("\n")[:-1]]


def check_records(records: list[dict], texts: list[str], types: set[str]) -> int:
    """One record per input line, in order, and every entity's offsets index its text; returns the
    number of entities seen."""
    assert len(records) == len(texts)
    seen = 0
    for record, text in zip(records, texts):
        assert record["text"] == text
        end = 0
        for ent in record["entities"]:
            assert end <= ent["start"] < ent["end"] <= len(text), ent  # in order, disjoint, inside
            assert text[ent["start"]:ent["end"]] == ent["text"]
            assert ent["type"] in types
            end = ent["end"]
            seen += 1
    return seen


FUZZ = {"examples": 0, "lines": 0, "entities": 0, "refused": 0}
# Lines as text from every Unicode category (no surrogates: they cannot be encoded), or as raw
# bytes, which may be invalid UTF-8 or hold NUL, \n and \r (refused with the line's number).
LINE = st.one_of(st.text(max_size=40), st.binary(max_size=40),
                 st.text(st.characters(categories=["Mn", "Me", "Cf", "Co", "Zl", "Zp", "Cc", "So"]), max_size=20))


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory) -> Path:
    yield tmp_path_factory.mktemp("fuzz")
    if FUZZ["examples"]:  # what the property test saw, for the report
        REPORT.row("Prediction on arbitrary text", "hypothesis: random Unicode text and random bytes through "
                   "predict_stream", f"{FUZZ['examples'] + FUZZ['refused']} inputs, {FUZZ['lines']} lines of text",
                   f"text: no failure, {FUZZ['entities']} entities, all offsets index their text; "
                   f"{FUZZ['refused']} inputs not UTF-8 text: an error naming the first such line, output untouched")


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(LINE, max_size=6), final_newline=st.booleans())
def test_predict_stream_accepts_any_text_refuses_other_bytes_and_offsets_index_the_text(entity_model_pipe, fuzz_dir,
                                                                                        lines, final_newline):
    """The code path of `nerkit predict` (predict_stream) on arbitrary bytes, in this process: text
    gives one record per line whose offsets index it; anything else an error naming the first line
    that is not UTF-8 text, leaving the output file as it was."""
    from nerkit.errors import CorpusError
    from nerkit.inference.stream import predict_stream

    data = b"\n".join(x if isinstance(x, bytes) else x.encode("utf-8") for x in lines)
    data += b"\n" if final_newline and data else b""
    source, out = fuzz_dir / "in.txt", fuzz_dir / "out.jsonl"
    source.write_bytes(data)
    before = out.read_bytes() if out.exists() else None
    bad = first_bad_line(data)
    if bad is not None:
        with pytest.raises(CorpusError) as info:
            predict_stream(entity_model_pipe, str(source), str(out), "jsonl", batch_size=4, chunk_chars=50)
        assert info.value.where == f"{source}:{bad}"
        assert (out.read_bytes() if out.exists() else None) == before
        assert sorted(p.name for p in fuzz_dir.iterdir()) in (["in.txt"], ["in.txt", "out.jsonl"])
        FUZZ["refused"] += 1
        return
    written = predict_stream(entity_model_pipe, str(source), str(out), "jsonl", batch_size=4, chunk_chars=50)
    texts = expected_lines(data)
    assert written == len(texts)
    FUZZ["entities"] += check_records(read_records(out), texts, entity_types(entity_model_pipe))
    FUZZ["examples"] += 1
    FUZZ["lines"] += len(texts)


@pytest.fixture(scope="module")
def entity_model_pipe(entity_model):
    from nerkit.inference.pipeline import Pipeline

    return Pipeline.load(entity_model)


def entity_types(pipe) -> set[str]:
    return {tag.split("-", 1)[1] for tag in pipe.tags if tag != "O"}


def test_the_offset_checks_see_entities(entity_model_pipe, fuzz_dir):
    """The checks the property test applies find real entities on text that has them, among the same
    kinds of hostile lines, so a model or a path that returned nothing would fail here."""
    from nerkit.inference.stream import predict_stream

    data = "\n".join(["张伟在北京大学读书。", "\u200b张伟\ufeff在北京", "😀李娜在上海工作\u202e", ""]).encode("utf-8")
    source, out = fuzz_dir / "known.txt", fuzz_dir / "known.jsonl"
    source.write_bytes(data)
    predict_stream(entity_model_pipe, str(source), str(out), "jsonl", batch_size=2, chunk_chars=10)
    assert check_records(read_records(out), expected_lines(data), entity_types(entity_model_pipe)) > 0


def nasty_lines() -> list[bytes]:
    """Valid UTF-8 text of every awkward kind (NUL aside: it marks a binary file), one line each."""
    rnd = random.Random(11)
    pools = {
        "combining": ["e\u0301", "\u0301", "a\u0300\u0301\u0302\u0303", "\u20dd"],
        "emoji": ["😀", "👩‍👩‍👧‍👦", "🇨🇳", "👍🏽", "\ufe0f"],
        "rtl": ["שלום", "مرحبا", "\u202e", "\u200f", "\u061c"],
        "cjk": ["张", "伟", "北京", "𠀀", "𪚥", "〇", "\u3000"],
        "controls": ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\r", "\t", "\x7f"],
        "odd": ["\ufeff", "\ufffe", "\uffff", "\ue000", "\U0010fffd", "\u00ad", "\u200b", "\u200d", " "],
    }
    lines = [b"", b"\r", b" ", b"\t\t", "张伟在北京。".encode()]
    for _ in range(300):
        parts = [rnd.choice(rnd.choice(list(pools.values()))) for _ in range(rnd.randint(1, 30))]
        lines.append("".join(parts).encode("utf-8"))
    lines.append(("张伟在北京工作。" * 12_500).encode())  # one 100,000-character line
    return lines


@pytest.mark.slow
def test_predict_cli_on_every_kind_of_line(entity_model, entity_model_pipe, tmp_path):
    lines = nasty_lines()
    data = b"\n".join(lines)  # no final newline
    source, out = tmp_path / "nasty.txt", tmp_path / "out.jsonl"
    source.write_bytes(data)
    result = nerkit("predict", source, "--model", entity_model, "--output", out)
    assert result.returncode == 0, text_of(result.stderr)[-2000:]
    texts = expected_lines(data)
    assert len(texts) == len(lines)
    entities = check_records(read_records(out), texts, entity_types(entity_model_pipe))
    assert entities > 0
    REPORT.row("Prediction on arbitrary text", "`nerkit predict FILE`: combining marks, emoji, RTL, astral CJK, "
               "controls, a 100,000-character line", f"{len(texts)} lines",
               f"exit 0; one record per line, in order; {entities} entities, all offsets index their text")


NOT_TEXT = {  # inserted in the middle of a line of text
    "a cut character": b"\xe5\xbc", "a lone continuation byte": b"\x80", "a UTF-16 BOM": b"\xff\xfe",
    "GBK": "张".encode("gbk"), "an encoded surrogate": b"\xed\xa0\x80", "a NUL byte": b"\x00",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", NOT_TEXT)
def test_predict_cli_refuses_a_line_that_is_not_text(monkeypatch, capfd, entity_model, tmp_path, name):
    """As `nerkit data` does: one line naming the file and line, and no output file."""
    lines = nasty_lines()
    lines[200] = lines[200][:4] + NOT_TEXT[name] + lines[200][4:]
    source, out = tmp_path / "nasty.txt", tmp_path / "out.jsonl"
    source.write_bytes(b"\n".join(lines))
    result = nerkit_here(monkeypatch, capfd, "predict", source, "--model", entity_model, "--output", out)
    message = check_user_error(result, f"{source}:201", "NUL byte" if name == "a NUL byte" else "are not UTF-8")
    assert list(tmp_path.iterdir()) == [source]
    REPORT.row("Prediction on arbitrary text", f"`nerkit predict FILE --output OUT`: {name} on line 201 of 306",
               "1 file", f"exit 2, no OUT: {message}")


# ------------------------------------------------------------------------------------ streaming


# Runs a command and prints its peak RSS in kilobytes. ru_maxrss of a child forked straight from
# pytest would include pytest's own memory (Linux keeps the larger of the pre-exec and post-exec
# peaks), so the measured process is started from this small launcher instead.
PEAK_RSS = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:]).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def predict_peak_rss(model: Path, source: Path, out: Path) -> tuple[int, float]:
    """Run `nerkit predict`; returns its peak resident memory in bytes and its seconds."""
    import time

    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", PEAK_RSS, sys.executable, "-m", "nerkit", "predict", str(source),
                             "--model", str(model), "--output", str(out), "--batch-size", "1024"],
                            cwd=REPO, env=ENV, capture_output=True, timeout=300)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, text_of(result.stderr)[-2000:]
    return int(result.stderr.split()[-1]) * 1024, seconds  # Linux reports kilobytes


@pytest.mark.slow
@pytest.mark.slow
def test_predict_streams_large_input_in_bounded_memory_and_order(trained_model, tmp_path):
    """Three times the input (624,000 characters against 208,000: four of predict's 200,000-character
    chunks against two) must not need more memory. Holding the whole input costs about 100 bytes a
    character in Python objects (measured: +56 MB here; streaming: +2 to +5 MB). The model tags few
    entities: with one on every character a chunk's output alone is some 10 MB of strings, and the
    allocator's reuse of those makes the peak vary by that much."""
    line = "张伟在北京的清华大学工作，李娜去了上海。"  # 20 characters, 26 with the line number
    runs = {}
    for n_lines in (8_000, 24_000):
        source = tmp_path / f"in{n_lines}.txt"
        source.write_text("".join(f"{i:06d}{line}\n" for i in range(n_lines)), encoding="utf-8")
        out = tmp_path / f"out{n_lines}.jsonl"
        runs[n_lines] = predict_peak_rss(trained_model, source, out)
        records = read_records(out)
        assert [r["text"][:6] for r in records] == [f"{i:06d}" for i in range(n_lines)]
    (small, _), (large, seconds) = runs[8_000], runs[24_000]
    growth = large - small
    assert growth < 25 * 2**20, f"peak memory grew by {growth / 2**20:.0f} MB with 3x the input"
    REPORT.row("Prediction on arbitrary text", "streaming: 208,000 vs 624,000 characters (8,000 vs 24,000 lines)",
               "2 runs", f"peak RSS {small / 2**20:.0f} MB vs {large / 2**20:.0f} MB (growth < 25 MB required); "
               f"order kept; {624_000 / seconds:,.0f} chars/s including start-up")


# ------------------------------------------------------------------------------ model directories


def copy_model(source: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(source, target)
    return target


@pytest.mark.parametrize("name", ["model.safetensors", "vocab.json", "config.yaml", "nerkit.json"])
def test_a_file_linking_outside_the_model_directory_is_refused(entity_model, tmp_path, name):
    from nerkit.errors import ModelDirError
    from nerkit.inference.pipeline import Pipeline

    model = copy_model(entity_model, tmp_path / "model")
    outside = tmp_path / "elsewhere" / name
    outside.parent.mkdir()
    (model / name).rename(outside)
    (model / name).symlink_to(outside)
    with pytest.raises(ModelDirError) as info:
        Pipeline.load(model)
    assert f"{name} is a link to {outside}, outside the model directory" in str(info.value)
    REPORT.row("Model directories", f"`{name}` a symlink to a file outside the directory", f"refused: {info.value}")


def test_links_inside_the_model_directory_and_a_linked_directory_load(entity_model, entity_model_pipe, tmp_path):
    from nerkit.inference.pipeline import Pipeline

    model = copy_model(entity_model, tmp_path / "model")
    (model / "vocab.json").rename(model / "vocab.real.json")
    (model / "vocab.json").symlink_to("vocab.real.json")
    (tmp_path / "link").symlink_to(model)
    text = "张伟在北京工作。"
    assert Pipeline.load(tmp_path / "link").predict([text]) == entity_model_pipe.predict([text])


@pytest.mark.slow
def test_cli_refuses_an_escaping_link(monkeypatch, capfd, entity_model, tmp_path):
    model = copy_model(entity_model, tmp_path / "model")
    (model / "vocab.json").unlink()
    (model / "vocab.json").symlink_to("/etc/passwd")
    result = nerkit_here(monkeypatch, capfd, "predict", "-", "--model", model)
    message = check_user_error(result, model, "vocab.json is a link to /etc/passwd, outside the model directory")
    REPORT.row("Model directories", "`nerkit predict` with `vocab.json` linked to /etc/passwd", f"exit 2: {message}")


OPENED: list[str] = []
AUDITING: list[bool] = []  # non-empty while a load is audited
HOOKED: list[bool] = []  # an audit hook cannot be removed: add it once, and let it idle


def _audit(event: str, args) -> None:
    if AUDITING and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        OPENED.append(os.fsdecode(args[0]))


def test_paths_named_in_a_model_config_are_never_read_at_load(entity_model, tmp_path):
    """config.yaml of a model directory may name pretrained vectors or a lexicon source (they were
    read at training time); loading must not open them, or any file outside the directory."""
    import yaml

    from nerkit.inference.pipeline import Pipeline

    model = copy_model(entity_model, tmp_path / "model")
    bait = tmp_path / "bait.txt"
    bait.write_text("张 0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8\n", encoding="utf-8")
    config = yaml.safe_load((model / "config.yaml").read_text(encoding="utf-8"))
    config["embeddings"].update(char_vectors="/etc/passwd", bichar_vectors=str(bait), word_vectors=str(bait))
    config["lexicon"]["source"] = str(bait)
    config["data"].update(train="/etc/shadow", dev=str(bait), test=str(bait))
    (model / "config.yaml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    if not HOOKED:
        sys.addaudithook(_audit)
        HOOKED.append(True)
    OPENED.clear()
    AUDITING.append(True)
    try:
        pipe = Pipeline.load(model)
    finally:
        AUDITING.clear()
    assert pipe.config.embeddings.char_vectors == "/etc/passwd"  # named, loaded, and never opened
    data_opened = [p for p in OPENED if not p.endswith((".py", ".pyc", ".so")) and "site-packages" not in p]
    assert not [p for p in data_opened if p in ("/etc/passwd", "/etc/shadow", str(bait))]
    outside = [p for p in data_opened if not Path(p).resolve().is_relative_to(model.resolve())]
    assert not outside, outside
    REPORT.row("Model directories", "config.yaml naming /etc/passwd, /etc/shadow and other files as vectors, "
               "lexicon and data", f"loaded; opened only {sorted({Path(p).name for p in data_opened})}")
