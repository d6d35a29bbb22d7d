"""Tests for prediction over several processes (nerkit/workers.py, `nerkit predict --workers N`): the
dispatcher keeps input order and a bounded number of chunks out (with threads standing in for the
processes), several processes write byte for byte what one writes with the same threads per
process, the prediction window reaches them, errors keep their one-line messages, and a killed
worker, Ctrl-C, SIGTERM or a closed pipe end the command without a wait or a leftover file."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from helpers import build_pipeline, parse_jsonl, run_cli

from nerkit.errors import CorpusError, UserError
from nerkit.inference.formats import FORMATS
from nerkit.inference.stream import predict_stream
from nerkit.inference.workers import WorkerLost, Workers, in_order, threads_per_worker

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# ------------------------------------------------------------------------- the dispatcher alone


@contextmanager
def thread_workers(count: int, work):
    """`count` threads, each answering the tasks on its end of a pipe with `work(task)` as a worker
    process would; a `work` that returns None closes its pipe instead, as a dying worker would."""
    ours, threads = [], []
    for _ in range(count):
        mine, theirs = multiprocessing.Pipe()

        def serve(conn=theirs):
            while True:
                try:
                    task = conn.recv_bytes()
                except (EOFError, OSError):
                    return
                reply = work(task)
                if reply is None:
                    conn.close()
                    return
                try:
                    conn.send_bytes(reply)
                except OSError:  # the dispatcher closed its end (it gave up on the run): done
                    return

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        ours.append(mine)
        threads.append(thread)
    try:
        yield ours
    finally:
        for conn in ours:
            conn.close()
        for thread in threads:
            thread.join(10)


def test_replies_come_in_task_order_with_at_most_window_tasks_out():
    """Every fifth task is slow, so the others finish before it; they wait, and no more than the
    window's worth of tasks is ever drawn and not yet yielded."""
    finished = []  # task numbers, as the workers finish them

    def work(task: bytes) -> bytes:
        number = int(task)
        time.sleep(0.3 if number % 5 == 0 else 0.01)
        finished.append(number)
        return b"reply %d" % number

    out_when_drawn = []  # tasks drawn and not yet yielded, each time one is drawn
    drawn = yielded = 0

    def tasks():
        nonlocal drawn
        for number in range(20):
            drawn += 1
            out_when_drawn.append(drawn - yielded)
            yield b"%d" % number

    replies = []
    with thread_workers(3, work) as conns:
        for reply in in_order(tasks(), conns, window=4):
            replies.append(reply)
            yielded += 1
    assert replies == [b"reply %d" % n for n in range(20)]
    assert finished != sorted(finished)  # they did finish out of order
    assert max(out_when_drawn) == 4  # the window filled up behind a slow task, and held


def test_a_reader_error_comes_after_the_replies_before_it():
    def tasks():
        yield from (b"%d" % n for n in range(7))
        raise CorpusError("bytes at offset 3 are not UTF-8", where="in.txt:8")

    replies = []
    with thread_workers(2, lambda task: task) as conns:
        with pytest.raises(CorpusError, match="in.txt:8"):
            for reply in in_order(tasks(), conns, window=4):
                replies.append(reply)
    assert replies == [b"%d" % n for n in range(7)]


def test_a_worker_that_closes_its_pipe_raises_instead_of_a_wait():
    outcome = []

    def run():
        with thread_workers(2, lambda task: None if task == b"5" else task) as conns:
            try:
                outcome.extend(in_order((b"%d" % n for n in range(50)), conns, window=4))
            except WorkerLost as lost:
                outcome.append(lost)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "the dispatcher waited for a worker that had gone"
    assert isinstance(outcome[-1], WorkerLost)
    assert outcome[:-1] == [b"%d" % n for n in range(len(outcome) - 1)] and len(outcome) <= 6  # none after 5


@pytest.mark.slow
@pytest.mark.parametrize("model", ["absent", "tiny"])
def test_a_worker_whose_main_process_has_gone_ends_quietly(tiny_model_dir, tmp_path, model):
    """The main process stops on the first worker's error and closes every connection: a second
    worker that then reports its own error (or its readiness) finds a closed pipe. It ends with exit
    code 0 and writes nothing, where it used to print a BrokenPipeError traceback below the one-line error."""
    context = multiprocessing.get_context("spawn")
    mine, theirs = context.Pipe()
    mine.close()  # gone before the worker says anything
    path = str(tmp_path / "absent") if model == "absent" else str(tiny_model_dir)
    log = tmp_path / "stderr.txt"
    process = context.Process(target=_serve_with_stderr_to, args=(str(log), theirs, path))
    process.start()
    process.join(60)
    assert process.exitcode == 0 and log.read_text(encoding="utf-8") == ""


def _serve_with_stderr_to(log: str, conn, model: str) -> None:
    """`serve` in a spawned process with its stderr (and the stdout it points there) in `log`."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 - the process's own stderr until it ends
    from nerkit.inference.workers import serve

    serve(conn, model, "cpu", 1, 30)


def test_threads_are_shared_out_among_the_workers():
    assert threads_per_worker(8, 2) == 4 and threads_per_worker(3, 2) == 1 and threads_per_worker(1, 4) == 1
    cores = len(os.sched_getaffinity(0))
    assert threads_per_worker(0, 2) == max(1, cores // 2)


# ------------------------------------------------------------------------- real worker processes

AWKWARD = (b"\xef\xbb\xbf" + "\n".join([
    "张伟在北京工作。", "", "   ", "\t", "\u3000", "清华大学位于北京，李娜是那里的学生。",
    "刘洋去天元集团参观了。" * 40,  # 440 characters, longer than data.max_len (250): read in windows
    "李娜\ufeff王芳", "no Chinese here 123", "", "　ＡＢＣ😀张伟\t李娜", "新华社的记者王芳报道了这件事。",
]).encode() + "\r\n张三去上海\r\n\n最后一行没有换行".encode())
AWKWARD_LINES = 15


@pytest.fixture(scope="module")
def pool(tiny_model_dir):
    with Workers(tiny_model_dir, 2, threads=2) as workers:
        yield workers


@pytest.fixture(scope="module")
def pipe(tiny_model_dir):
    from nerkit.inference.pipeline import Pipeline

    return Pipeline.load(tiny_model_dir)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_two_workers_write_what_one_process_writes(pool, pipe, tmp_path, fmt):
    """Blank and whitespace-only lines, a BOM, CRLF, a line read in windows, no final newline; a
    chunk of about 30 characters, so that many chunks are out at once and finish out of order.
    What is claimed, and so checked: the same bytes with the same torch threads per process (a
    near-tie may be decided otherwise by a different number of threads)."""
    assert pool.worker_threads == [1, 1] and torch.get_num_threads() == 1
    source = tmp_path / "awkward.txt"
    source.write_bytes(AWKWARD)
    one, two = tmp_path / f"one.{fmt}", tmp_path / f"two.{fmt}"
    assert predict_stream(pipe, str(source), str(one), fmt, batch_size=2, chunk_chars=30) == AWKWARD_LINES
    assert predict_stream(pool, str(source), str(two), fmt, batch_size=2, chunk_chars=30) == AWKWARD_LINES
    assert two.read_bytes() == one.read_bytes()
    if fmt == "jsonl":
        records = parse_jsonl(one.read_text(encoding="utf-8"))
        assert len(records) == AWKWARD_LINES and records[0]["text"] == "张伟在北京工作。"
        assert sum(len(r["entities"]) for r in records) >= 30  # a model that finds entities


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["jsonl", "doccano", "label-studio"])
def test_two_workers_keep_the_keys_of_json_lines_as_one_process_does(pool, pipe, tmp_path, fmt):
    """JSON-lines input (`--field`): each text's other keys go to the workers and back into its record."""
    source = tmp_path / "texts.jsonl"
    source.write_text("".join(json.dumps({"id": f"t{i}", "text": t, "n": [i, None]}, ensure_ascii=False) + "\n"
                              for i, t in enumerate(["张伟在北京工作。", "", "李娜 去了上海。"] * 8)), encoding="utf-8")
    one, two = tmp_path / f"one.{fmt}", tmp_path / f"two.{fmt}"
    assert predict_stream(pipe, str(source), str(one), fmt, batch_size=2, chunk_chars=20) == 24
    assert predict_stream(pool, str(source), str(two), fmt, batch_size=2, chunk_chars=20) == 24
    assert two.read_bytes() == one.read_bytes()
    written = one.read_text(encoding="utf-8")
    records = [t["data"] for t in json.loads(written)] if fmt == "label-studio" else parse_jsonl(written)
    assert [(r["id"], r["text"], r["n"]) for r in records] == \
        [(f"t{i}", ["张伟在北京工作。", "", "李娜 去了上海。"][i % 3], [i, None]) for i in range(24)]


@pytest.mark.slow
def test_invalid_utf8_with_workers_is_the_reader_error_after_the_same_records(pool, pipe, tmp_path, capfd):
    source = tmp_path / "in.txt"
    source.write_bytes("张伟在北京。\n".encode() * 40 + "李娜".encode("gbk") + "\n张伟\n".encode())
    errors, printed = [], []
    for predictor in (pipe, pool):
        with pytest.raises(CorpusError) as info:
            predict_stream(predictor, str(source), None, chunk_chars=40)
        errors.append(str(info.value))
        printed.append(capfd.readouterr().out)
    assert errors[0] == errors[1] and errors[0].startswith(f"{source}:41: bytes at offset")
    assert printed[0] == printed[1] and 0 < len(parse_jsonl(printed[0])) < 40  # chunks before the bad one
    output = tmp_path / "out" / "pred.jsonl"
    output.parent.mkdir()
    with pytest.raises(CorpusError):
        predict_stream(pool, str(source), str(output), chunk_chars=40)
    assert list(output.parent.iterdir()) == []  # nothing half-written


@pytest.mark.slow
def test_the_workers_option_on_the_command_line(tiny_model_dir, tmp_path, monkeypatch, capfd):
    """The same bytes from one process with one thread and from two workers sharing two threads
    (one each, which --verbose says)."""
    model = str(tiny_model_dir)
    source = tmp_path / "awkward.txt"
    source.write_bytes(AWKWARD)
    _, expected, _ = run_cli(monkeypatch, capfd, "predict", "--model", model, str(source), "--workers", "1",
                             "--threads", "1")
    code, stdout, stderr = run_cli(monkeypatch, capfd, "--verbose", "predict", "--model", model, str(source),
                                   "--workers", "2", "--threads", "2")
    assert code == 0, stderr
    assert "2 prediction workers, torch threads each: 1, 1" in stderr
    assert stdout == expected and len(parse_jsonl(stdout)) == AWKWARD_LINES
    for count in ("0", "-1"):
        code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, str(source), "--workers", count)
        assert code == 2 and stdout == "" and "Traceback" not in stderr
        assert stderr.startswith("nerkit: error: Invalid value for '--workers'") and len(stderr.splitlines()) == 1
    messages = []
    for count in ("1", "2"):  # a model that cannot load: the worker's error, one line, as in one process
        code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", str(tmp_path / "absent"),
                                       str(source), "--workers", count)
        assert code == 2 and stdout == "", stderr
        messages.append(stderr)
    assert messages[0] == messages[1] and len(messages[1].splitlines()) == 1
    assert "model directory not found" in messages[1]

    source.write_bytes("张伟在北京。\n".encode() * 3 + "李娜".encode("gbk") + b"\n")
    output = tmp_path / "out" / "pred.jsonl"
    output.parent.mkdir()
    messages = []
    for count in ("1", "2"):  # a line that is not UTF-8: the reader's error, one line, as in one process
        code, _, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, str(source), "--workers", count,
                                  "--output", str(output))
        assert code == 2 and list(output.parent.iterdir()) == [], stderr
        messages.append(stderr)
    assert messages[0] == messages[1] and len(messages[1].splitlines()) == 1
    assert messages[1].startswith(f"nerkit: error: {source}:4: bytes at offset")


def joined_dev_text() -> str:
    from nerkit.data.corpus import read_corpus

    return "".join(s.text for s in read_corpus(FIXTURES / "tiny_dev.bio").sentences)


@pytest.mark.slow
def test_the_window_is_the_same_from_the_api_the_command_line_and_the_workers(tiny_model_dir, pool, pipe, tmp_path,
                                                                               monkeypatch, capfd):
    """Issue 33: a long text is read in windows of the longest training sentence (17 characters for
    the tiny model), or of `--window N`: `nerkit predict` in one process and in two, `nerkit eval`
    and the Python API give the same, and the two windows give different entities."""
    model, text = str(tiny_model_dir), joined_dev_text()
    lines = [text, "张伟在北京工作。", text[:60], text * 2]
    source = tmp_path / "long.txt"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    gold = tmp_path / "joined.bio"  # the dev corpus as one sentence of 177 characters
    gold.write_text("".join(line for line in (FIXTURES / "tiny_dev.bio").read_text(encoding="utf-8").splitlines(True)
                            if line.strip()), encoding="utf-8")
    found, scores = {}, {}
    for window in (None, 250):
        option = [] if window is None else ["--window", str(window)]
        api = [{"text": t, "entities": e} for t, e in zip(lines, pipe.predict(lines, window=window))]
        for workers in ("1", "2"):
            code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", model, str(source),
                                           "--workers", workers, "--threads", workers, *option)
            assert code == 0, stderr
            assert parse_jsonl(stdout) == api, (window, workers)
        assert predict_stream(pool, str(source), str(tmp_path / "pool.jsonl"), window=window) == len(lines)
        assert parse_jsonl((tmp_path / "pool.jsonl").read_text(encoding="utf-8")) == api
        code, stdout, stderr = run_cli(monkeypatch, capfd, "eval", "--model", model, "--data", str(gold), "--json",
                                       *option)
        assert code == 0, stderr
        assert json.loads(stdout) == json.loads(json.dumps(pipe.evaluate(gold, window=window)))
        found[window], scores[window] = api, json.loads(stdout)
    assert pipe.window == 17 and found[None] != found[250] and scores[None] != scores[250]
    for command in (["predict", str(source)], ["eval", "--data", str(gold)]):
        code, stdout, stderr = run_cli(monkeypatch, capfd, *command, "--model", model, "--window", "-1")
        assert code == 2 and stdout == "" and len(stderr.splitlines()) == 1
        assert stderr.startswith("nerkit: error: Invalid value for '--window'"), stderr
    with pytest.raises(UserError, match="the prediction window must be a whole number of characters"):
        predict_stream(pool, str(source), None, window=-1)  # refused here, not by a worker


@pytest.mark.slow
def test_a_window_the_model_cannot_read_is_one_line_with_or_without_workers(tiny_config, tmp_path, monkeypatch,
                                                                           capfd):
    """A Transformer with learned positions reads at most encoder.max_positions characters: a larger
    --window is refused once the model loads, in one line and before any input is read, by one
    process as by the workers."""
    model = tmp_path / "learned"
    build_pipeline(tiny_config("encoder.name=transformer", "encoder.attention=learned", "encoder.max_positions=20",
                               "data.max_len=20", "encoder.n_heads=2", "encoder.head_dim=4")).save(model)
    source = tmp_path / "in.txt"
    source.write_text("张伟在北京工作。\n", encoding="utf-8")
    messages = []
    for workers in ("1", "2"):
        code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", str(model), str(source),
                                       "--workers", workers, "--window", "30", "--output", str(tmp_path / "out.jsonl"))
        assert code == 2 and stdout == "" and len(stderr.splitlines()) == 1, stderr
        messages.append(stderr)
    assert messages[0] == messages[1] and "reads at most encoder.max_positions = 20 characters" in messages[0]
    assert not (tmp_path / "out.jsonl").exists()
    code, stdout, stderr = run_cli(monkeypatch, capfd, "predict", "--model", str(model), str(source), "--workers", "2",
                                   "--window", "20")
    assert code == 0 and len(parse_jsonl(stdout)) == 1, stderr


# ------------------------------------------------------------------ a killed worker, Ctrl-C, a closed pipe


def worker_pids(parent: int) -> list[int]:
    """The processes `parent` spawned through multiprocessing (its resource tracker is not one)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"spawn_main" in command:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["kill a worker", "ctrl-c", "close the pipe"])
def test_a_run_with_workers_ends_at_once_and_leaves_no_worker(tiny_model_dir, tmp_path, stop):
    """A worker killed mid-run (as the out-of-memory killer would) ends the command with one line
    and exit 2; Ctrl-C at a terminal (SIGINT to the whole process group) with 130; a reader that
    closes stdout (`| head -1`) with 0 and nothing said. No worker outlives the command, and
    --output is not left half-written."""
    source = tmp_path / "many.txt"
    source.write_text("张伟在北京的清华大学工作。\n" * 60_000, encoding="utf-8")  # some 10 s of work for two
    output = tmp_path / "out" / "pred.jsonl"
    output.parent.mkdir()
    command = [sys.executable, "-m", "nerkit", "predict", "--model", str(tiny_model_dir), str(source), "--workers", "2"]
    if stop != "close the pipe":
        command += ["--output", str(output)]
    # As at a terminal, SIGINT is not ignored: a suite started in the background (`make test &`) passes
    # its shell's SIG_IGN on, and a Python started so keeps Ctrl-C ignored.
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, start_new_session=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "error"},
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as process:
        deadline = time.monotonic() + 120
        if stop == "close the pipe":
            assert parse_jsonl(process.stdout.readline().decode())[0]["text"] == "张伟在北京的清华大学工作。"
        else:  # the workers have loaded the model and the output's temporary file is open
            while not any(output.parent.iterdir()):
                assert process.poll() is None and time.monotonic() < deadline, process.stderr.read().decode()
                time.sleep(0.05)
        workers = worker_pids(process.pid)
        assert len(workers) == 2
        stopped = time.monotonic()
        if stop == "kill a worker":
            os.kill(workers[0], signal.SIGKILL)
        elif stop == "ctrl-c":
            os.killpg(process.pid, signal.SIGINT)
        else:
            process.stdout.close()
        code = process.wait(timeout=60)
        took = time.monotonic() - stopped
        stderr = process.stderr.read().decode()
    expected = {"kill a worker": 2, "ctrl-c": 130, "close the pipe": 0}[stop]
    assert code == expected, stderr
    assert took < 10, f"{took:.1f} s to end"
    if stop == "kill a worker":
        assert stderr.startswith("nerkit: error: prediction worker 1 of 2 was killed by SIGKILL") and \
            "--workers" in stderr and len(stderr.splitlines()) == 1, stderr
    else:
        assert stderr == ""
    for pid in workers:  # ended, and reaped by the command before it ended
        assert not Path(f"/proc/{pid}").exists()
    assert list(output.parent.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("workers, target, old", [("1", "process", False), ("2", "job", True), ("2", "process", True)],
                         ids=["one process", "two workers, the job", "two workers, the main process"])
def test_sigterm_during_predict_output_leaves_no_temporary_file(tiny_model_dir, tmp_path, workers, target, old):
    """Issue 33: SIGTERM (`kill`, a batch scheduler or a service manager stopping the job) during
    `nerkit predict --output` left the hidden partial file `.pred.jsonl.<hex>.tmp`. It now ends
    the command as Ctrl-C does, whether it reaches the main process alone or the whole job (as
    `kill %1` in a shell): exit 143 and nothing said, no temporary file, the output as it was
    before (absent, or the old file untouched), no worker left."""
    source = tmp_path / "many.txt"
    source.write_text("张伟在北京的清华大学工作。\n" * 60_000, encoding="utf-8")
    output = tmp_path / "out" / "pred.jsonl"
    output.parent.mkdir()
    if old:
        output.write_bytes(b"the old predictions\n")
    command = [sys.executable, "-m", "nerkit", "predict", "--model", str(tiny_model_dir), str(source),
               "--workers", workers, "--output", str(output)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, start_new_session=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "error"}) as process:
        deadline = time.monotonic() + 120
        while not list(output.parent.glob(".pred.jsonl.*.tmp")):  # the workers are ready, the file is open
            assert process.poll() is None and time.monotonic() < deadline, process.stderr.read().decode()
            time.sleep(0.05)
        children = worker_pids(process.pid)
        assert len(children) == (2 if workers == "2" else 0)
        if target == "job":
            os.killpg(process.pid, signal.SIGTERM)
        else:
            os.kill(process.pid, signal.SIGTERM)
        code = process.wait(timeout=60)
        stderr = process.stderr.read().decode()
    assert code == 143, stderr
    assert stderr == ""
    assert [p.name for p in output.parent.iterdir()] == (["pred.jsonl"] if old else [])
    if old:
        assert output.read_bytes() == b"the old predictions\n"
    for pid in children:
        assert not Path(f"/proc/{pid}").exists()
