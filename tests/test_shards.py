"""Tests for shards of one input (nerkit/inference/shards.py, `nerkit predict --shard I/N` and `nerkit
shards join`): the shards joined are `nerkit predict`'s output byte for byte, in every framed format, from
plain text and JSON lines, with a PyTorch model and its ONNX exports (int8 too); a rerun writes the same
bytes; the block-at-a-time planner makes the chunks predict's own reader makes; and every refusal is
one line naming the file and the fix, before a model loads, leaving no output behind."""

from __future__ import annotations

import io
import json
import random
import shutil
from pathlib import Path

import pytest
from helpers import REPO

from nerkit.data.corpus import read_corpus
from nerkit.inference import shards
from nerkit.inference.shards import MANIFEST_SUFFIX, Shard, _line_plan, _plain_plan


def sample_lines(count: int, seed: int = 0) -> list[str]:
    """`count` texts made of data/sample's sentences, one or two to a line (about 30 characters each)."""
    sentences = [s.text for name in ("train", "dev", "test")
                 for s in read_corpus(REPO / "data" / "sample" / f"{name}.bio").sentences]
    rng = random.Random(seed)
    return [rng.choice(sentences) + (rng.choice(sentences) if rng.random() < 0.3 else "") for _ in range(count)]


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    """3,000 lines, about 90,000 characters: five of predict's chunks."""
    path = tmp_path_factory.mktemp("shards") / "big.txt"
    path.write_text("\n".join(sample_lines(3000)) + "\n", encoding="utf-8")
    return path


def predict_shards(nerkit, model: Path, source: Path, out: Path, count: int, *options: str) -> list[Path]:
    out.mkdir(exist_ok=True)
    parts = []
    for index in range(1, count + 1):
        parts.append(out / f"part-{index}{source.suffix}")
        nerkit("predict", "--model", model, source, "--shard", f"{index}/{count}", "--output", parts[-1], *options)
    return parts


@pytest.mark.parametrize("fmt, count", [("jsonl", 3), pytest.param("label-studio", 7, marks=pytest.mark.slow),
                                        pytest.param("html", 2, marks=pytest.mark.slow)])
def test_joined_shards_are_predicts_output_byte_for_byte(tiny_model_dir, text, nerkit, tmp_path, fmt, count):
    """Seven shards of five chunks leave two empty, which join as nothing; label-studio's array and
    html's page are one frame around every shard's records. The manifests' lines follow one another
    and cover the input; a rerun of a shard writes the same bytes to its output and its manifest."""
    options = ["--format", fmt, "--scores"]
    nerkit("predict", "--model", tiny_model_dir, text, "--output", tmp_path / "whole", *options)
    parts = predict_shards(nerkit, tiny_model_dir, text, tmp_path / "parts", count, *options)
    nerkit("shards", "join", *reversed([str(p) for p in parts]), "--output", tmp_path / "joined")
    assert (tmp_path / "joined").read_bytes() == (tmp_path / "whole").read_bytes()

    manifests = [json.loads(Path(f"{p}{MANIFEST_SUFFIX}").read_text(encoding="utf-8")) for p in parts]
    assert [m["lines"]["first"] for m in manifests if m["records"]][0] == 1
    assert sum(m["lines"]["count"] for m in manifests) == sum(m["records"] for m in manifests) == 3000
    for before, after in zip(manifests, manifests[1:]):
        assert after["lines"]["first"] == before["lines"]["last"] + 1
    assert manifests[0]["input"]["sha256"] == shards.file_sha256(text)
    assert (count > 5) == any(m["records"] == 0 for m in manifests)

    last = parts[-1]
    written = last.read_bytes(), Path(f"{last}{MANIFEST_SUFFIX}").read_bytes()
    nerkit("predict", "--model", tiny_model_dir, text, "--shard", f"{count}/{count}", "--output", last, *options)
    assert (last.read_bytes(), Path(f"{last}{MANIFEST_SUFFIX}").read_bytes()) == written


def test_json_lines_shards_keep_their_keys_and_blank_lines(tiny_model_dir, nerkit, tmp_path):
    """JSON lines (planned through predict's own reader): the other keys are kept, blank lines are no
    record, and the shards joined are predict's output."""
    source = tmp_path / "texts.jsonl"
    lines = [json.dumps({"id": i, "text": t}, ensure_ascii=False) for i, t in enumerate(sample_lines(2000, seed=1))]
    source.write_text("\n".join(line + ("\n" if i % 97 == 0 else "") for i, line in enumerate(lines)) + "\n\n",
                      encoding="utf-8")
    nerkit("predict", "--model", tiny_model_dir, source, "--output", tmp_path / "whole.jsonl")
    parts = predict_shards(nerkit, tiny_model_dir, source, tmp_path / "parts", 2)
    nerkit("shards", "join", *map(str, parts), "--output", tmp_path / "joined.jsonl")
    assert (tmp_path / "joined.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    manifest = json.loads(Path(f"{parts[-1]}{MANIFEST_SUFFIX}").read_text(encoding="utf-8"))
    assert manifest["lines"]["last"] == manifest["input"]["lines"] and manifest["options"]["field"] == "text"


def test_joining_to_stdout(tiny_model_dir, text, nerkit, tmp_path):
    whole = nerkit("predict", "--model", tiny_model_dir, text).stdout
    parts = predict_shards(nerkit, tiny_model_dir, text, tmp_path / "parts", 2)
    assert nerkit("shards", "join", *map(str, parts)).stdout == whole


# ------------------------------------------------------------------------------------------- the plan

ALPHABET = ["a", "中", "\r", "\n", "\n", "\n", "😀", " ", "\ufeff", "é"]


def test_the_block_planner_makes_the_chunks_of_predicts_reader(monkeypatch):
    """On random texts of line ends, carriage returns, byte-order marks and characters of 1 to 4
    bytes, with chunks of a few characters and blocks that cut lines and characters in two."""
    rng = random.Random(7)
    for block in (7, 64, 1 << 20):
        monkeypatch.setattr(shards, "_BLOCK", block)
        for _ in range(400):
            text = ("\ufeff" if rng.random() < 0.3 else "") + "".join(rng.choice(ALPHABET)
                                                                      for _ in range(rng.randrange(60)))
            data, chunk = text.encode("utf-8"), rng.randrange(1, 9)
            fast = _plain_plan(io.BytesIO(data), chunk)
            assert fast == _line_plan(io.BytesIO(data), "t.txt", None, "jsonl", chunk), (text, chunk)
            assert fast.size == len(data) and fast.lines == data.count(b"\n") + (not data.endswith(b"\n") and bool(data))


@pytest.mark.parametrize("data", [b"ok\n\xff\xfe bad\n", b"ok\nnul \x00 here\n"])
def test_the_block_planner_leaves_a_bad_line_to_the_reader_that_names_it(data):
    assert _plain_plan(io.BytesIO(data), 5) is None


def test_shards_divide_the_chunks_evenly():
    assert [Shard(i, 3).chunk_range(7) for i in (1, 2, 3)] == [(0, 2), (2, 4), (4, 7)]
    assert [Shard(i, 4).chunk_range(2) for i in (1, 2, 3, 4)] == [(0, 0), (0, 1), (1, 1), (1, 2)]


# ------------------------------------------------------------------------------------------- refusals

def test_join_refuses_in_one_line_and_leaves_no_output(tiny_model_dir, text, nerkit, tmp_path):
    """A missing shard, one given twice, one without its manifest, one changed since it was written,
    and one predicted with another model or other options: each is exit code 2, one line that names
    the file and what to do, and nothing written."""
    parts = predict_shards(nerkit, tiny_model_dir, text, tmp_path / "parts", 3)
    target = tmp_path / "joined.jsonl"

    def refused(*given) -> str:
        result = nerkit("shards", "join", *map(str, given), "--output", target, check=False)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result
        assert not target.exists()
        return result.stderr

    assert "1 of 3 shards missing: 2/3" in refused(parts[0], parts[2]) and "--shard 2/3" in refused(parts[0], parts[2])
    assert "given twice" in refused(parts[0], parts[1], parts[1], parts[2])
    gone = tmp_path / "parts" / "part-9.txt"
    assert f"{gone}: shard output not found" in refused(parts[0], gone, parts[2])

    other = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other)
    meta = json.loads((other / "nerkit.json").read_text(encoding="utf-8"))
    (other / "nerkit.json").write_text(json.dumps({**meta, "score_temperature": 2.0}), encoding="utf-8")
    stray = tmp_path / "stray"
    stray.mkdir()
    nerkit("predict", "--model", other, text, "--shard", "2/3", "--output", stray / "part-2.txt")
    message = refused(parts[0], stray / "part-2.txt", parts[2])
    assert f"{stray / 'part-2.txt'}{MANIFEST_SUFFIX}" in message and "another model" in message
    nerkit("predict", "--model", tiny_model_dir, text, "--shard", "2/3", "--window", "9", "--output",
           stray / "part-2.txt")
    assert "another options" in refused(parts[0], stray / "part-2.txt", parts[2])

    kept = parts[1].read_bytes()
    parts[1].write_bytes(kept.replace(b'"PER"', b'"LOC"', 1))
    assert f"{parts[1]}: this shard output is not the one its manifest describes" in refused(*parts)
    parts[1].write_bytes(kept)
    Path(f"{parts[1]}{MANIFEST_SUFFIX}").unlink()
    assert "no manifest beside this shard output" in refused(*parts)


@pytest.mark.parametrize("args, message", [
    (["--shard", "0/3"], "--shard takes I/N with 1 <= I <= N"),
    (["--shard", "4/3"], "--shard takes I/N"),
    (["--shard", "two"], "--shard takes I/N"),
    (["--shard", "1/2"], "pass --output FILE"),
    (["--shard", "1/2", "--document", "--output", "OUT"], "--document reads the input in order"),
])
def test_a_shard_is_refused_in_one_line(tiny_model_dir, text, nerkit, tmp_path, args, message):
    args = [str(tmp_path / "out.txt") if a == "OUT" else a for a in args]
    result = nerkit("predict", "--model", tiny_model_dir, text, *args, check=False)
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_shard_of_stdin_or_under_torchrun_is_refused(tiny_model_dir, nerkit, tmp_path, monkeypatch, text):
    result = nerkit("predict", "--model", tiny_model_dir, "-", "--shard", "1/2", "--output", tmp_path / "o", check=False)
    assert result.returncode == 2 and "not stdin" in result.stderr
    monkeypatch.setenv("WORLD_SIZE", "2")
    result = nerkit("predict", "--model", tiny_model_dir, text, "--shard", "1/2", "--output", tmp_path / "o", check=False)
    assert result.returncode == 2 and "torchrun" in result.stderr and not (tmp_path / "o").exists()


def test_a_bad_line_fails_every_shard_as_predict_fails(tiny_model_dir, nerkit, tmp_path):
    """Planning reads every line: a line that is not UTF-8 near the end fails the first shard too,
    with predict's own message, and writes nothing."""
    source = tmp_path / "bad.txt"
    source.write_bytes("\n".join(sample_lines(2000)).encode("utf-8") + b"\n\xb1\xb1 GBK\n")
    expected = nerkit("predict", "--model", tiny_model_dir, source, "--output", tmp_path / "whole", check=False)
    result = nerkit("predict", "--model", tiny_model_dir, source, "--shard", "1/3", "--output", tmp_path / "p", check=False)
    assert result.returncode == expected.returncode == 2 and f"{source}:2001: bytes at offset" in result.stderr
    assert result.stderr == expected.stderr and not (tmp_path / "p").exists()
    assert not Path(f"{tmp_path / 'p'}{MANIFEST_SUFFIX}").exists()


# ------------------------------------------------------------------------------------------- exports

@pytest.mark.slow
def test_shards_of_an_onnx_export_and_its_int8_join_to_its_predict(tiny_model_dir, text, nerkit, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from nerkit.tools.onnx.export import export_model

    for quantize in (None, "int8"):
        model = tmp_path / f"onnx-{quantize}"
        export_model(tiny_model_dir, model, quantize=quantize)
        nerkit("predict", "--model", model, text, "--format", "doccano", "--output", tmp_path / "whole")
        parts = predict_shards(nerkit, model, text, tmp_path / f"parts-{quantize}", 3, "--format", "doccano")
        nerkit("shards", "join", *map(str, parts), "--output", tmp_path / "joined")
        assert (tmp_path / "joined").read_bytes() == (tmp_path / "whole").read_bytes()
        manifest = json.loads(Path(f"{parts[0]}{MANIFEST_SUFFIX}").read_text(encoding="utf-8"))
        assert manifest["model"]["runtime"] == "onnx"


@pytest.mark.slow
def test_a_shard_with_workers_writes_what_one_process_writes(tiny_model_dir, text, nerkit, tmp_path):
    one = predict_shards(nerkit, tiny_model_dir, text, tmp_path / "one", 2, "--threads", "1")
    two = predict_shards(nerkit, tiny_model_dir, text, tmp_path / "two", 2, "--workers", "2", "--threads", "2")
    assert [p.read_bytes() for p in one] == [p.read_bytes() for p in two]
