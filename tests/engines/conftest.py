"""What the engines' tests share (nerkit/inference/engines/, `make test-engines`): a directory of text
files of several thousand lines made from data/sample, the entities `nerkit predict --scores` writes for
each line (one torch thread, as each engine worker has), files with lines predict refuses and its
messages for them, a deadline that ends a test that hangs, and a marker file that arms the crash of
one worker process (nerkit.inference.engines.tagging's CRASH_VARIABLE). The real clusters are each
module's, started and ended there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_helpers import FILES, LINES, sample_lines


@pytest.fixture(scope="session")
def corpus(tmp_path_factory, tiny_model_dir):
    """(directory of FILES text files, the whole text's file, the entities of each of its lines as
    `nerkit predict --scores --threads 1` writes them, in order)."""
    from nerkit.inference.stream import predict_file

    root = tmp_path_factory.mktemp("engines")
    lines = sample_lines(LINES)
    whole = root / "all.txt"
    whole.write_text("\n".join(lines) + "\n", encoding="utf-8")
    directory = root / "texts"
    directory.mkdir()
    share = LINES // FILES
    for k in range(FILES):  # texts/part-0.txt ... in the order of the whole text
        part = lines[k * share:(k + 1) * share]
        (directory / f"part-{k}.txt").write_text("\n".join(part) + "\n", encoding="utf-8")
    predicted = root / "predicted.jsonl"
    predict_file(tiny_model_dir, str(whole), str(predicted), "jsonl", 64, "cpu", 1, 1, None, False, None, 0.0)
    entities = [json.loads(line)["entities"] for line in predicted.read_text(encoding="utf-8").splitlines()]
    assert len(entities) == LINES and sum(map(len, entities)) > LINES // 4  # the tiny model finds some
    return directory, whole, entities


@pytest.fixture(scope="session")
def refused(tmp_path_factory, tiny_model_dir):
    """Files with lines that `nerkit predict` refuses, and its one-line message for each: {path:
    (field or None, the line number, the message)}: a line that is not UTF-8 (GBK) and a NUL byte in
    a text file, and a JSON-lines record without its text."""
    from nerkit.errors import UserError
    from nerkit.inference.stream import predict_file

    root = tmp_path_factory.mktemp("refused")
    good = "张伟在北京工作。\n".encode("utf-8")
    cases = {"gbk.txt": (None, 2, good + "上海".encode("gbk") + b"\n" + good),
             "nul.txt": (None, 3, good * 2 + b"a\x00b\n" + good),
             "records.jsonl": ("text", 2, b'{"text": "\xe5\xbc\xa0\xe4\xbc\x9f"}\n{"id": 7, "body": "x"}\n')}
    found = {}
    for name, (field, line, data) in cases.items():
        path = root / name
        path.write_bytes(data)
        try:
            predict_file(tiny_model_dir, str(path), str(root / "out.jsonl"), field=field)
        except UserError as e:
            found[str(path)] = (field, line, str(e))
        else:
            raise AssertionError(f"nerkit predict read {name}")
        assert f"{path}:{line}:" in found[str(path)][2]
    return found


@pytest.fixture(scope="session")
def crash_marker(tmp_path_factory) -> Path:
    """The marker whose absence arms the crash of one worker process: there (disarmed) unless a test
    takes it away, and the crash puts it back."""
    marker = tmp_path_factory.getbasetemp() / "engine-crash-marker"
    marker.touch()
    return marker
