"""Tests for `nerkit bench`: a tiny matrix on data/sample run through the real CLI (results.jsonl,
RESULTS.md, a failing run recorded while the others finish, --resume, seeds as mean ± std),
strict matrix validation, and the table built from records and published anchors."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from helpers import nerkit_command
from helpers import run_nerkit as nerkit

from nerkit.errors import UserError
from nerkit.tools.bench import (
    failure_message,
    load_matrix,
    render_markdown,
    select_runs,
    worker_env,
)
from nerkit.tools.bench.runner import record_session

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "sample"
# A bilstm small enough to train 30 steps and score data/sample in a second or two.
TINY = {"data": {"train": str(SAMPLE / "train.bio"), "dev": str(SAMPLE / "dev.bio"), "test": str(SAMPLE / "test.bio")},
        "embeddings": {"char_dim": 16, "bichar_dim": 8, "dropout": 0.0},
        "encoder": {"name": "bilstm", "hidden_size": 16},
        "train": {"epochs": 1, "max_steps": 30, "batch_size": 8, "lr": 0.05, "patience": 0, "threads": 1}}
RECORD_KEYS = {
    "name", "run", "dataset", "seed", "config", "overrides", "status", "encoder", "config_sha256", "data_sha256",
    "test", "dev", "epochs", "parameters", "train_chars_per_s_steady", "predict_chars_per_s", "predict_batch_size",
    "peak_rss_mib", "peak_cuda_mib", "wall_s", "git_commit", "torch_version", "device", "torch_threads",
    "hostname", "cpu", "date", "quick", "pretrained",
}


def write_yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """One tiny matrix run through the CLI: `broken` (its training file does not exist, so its
    worker raises), then `tiny` with two seeds."""
    root = tmp_path_factory.mktemp("bench")
    config = write_yaml(root / "tiny.yaml", TINY)
    matrix = write_yaml(root / "matrix.yaml", {
        "predict_batch_size": 16,
        "runs": [{"name": "broken", "dataset": "sample", "config": str(config),
                  "overrides": ["data.train=/nonexistent/train.bio"]},
                 {"name": "tiny", "dataset": "sample", "config": str(config), "seeds": [1, 2]}]})
    out = root / "out"
    result = nerkit("bench", "--matrix", matrix, "--out", out, "--device", "cpu")
    return matrix, out, result


@pytest.mark.slow
def test_tiny_matrix_writes_results_and_table(bench_run):
    _, out, result = bench_run
    records = {r["name"]: r for r in read_jsonl(out / "results.jsonl")}
    assert set(records) == {"broken", "tiny_s1", "tiny_s2"}, result.stderr
    for name in ("tiny_s1", "tiny_s2"):
        r = records[name]
        assert r["status"] == "ok", r.get("error")
        assert RECORD_KEYS <= set(r), RECORD_KEYS - set(r)
        assert 0 <= r["test"]["f1"] <= 1 and 0 <= r["dev"]["f1"] <= 1
        assert r["train_chars_per_s_steady"] > 0 and r["predict_chars_per_s"] > 0
        assert r["peak_rss_mib"] > 0 and r["wall_s"] > 0 and r["parameters"] > 0
        assert r["device"] == "cpu" and r["encoder"] == "bilstm" and r["epochs"] == 1
        assert len(r["config_sha256"]) == 64 and set(r["data_sha256"]) == {"train", "dev", "test"}
        assert (out / "runs" / name / "model.safetensors").is_file()
        assert (out / "logs" / f"{name}.log").is_file()
    assert records["tiny_s2"]["overrides"][-2:] == ["train.seed=2", "train.device=cpu"]
    assert records["tiny_s1"]["config_sha256"] != records["tiny_s2"]["config_sha256"]  # the seed differs
    table = (out / "RESULTS.md").read_text(encoding="utf-8")
    assert result.stdout == table
    assert "| Dataset | Encoder | Run | Seeds | Test P | Test R | Test F1 |" in table
    assert "| sample | bilstm | tiny | 2 |" in table
    assert "random-init embeddings" in table


@pytest.mark.slow
def test_failed_runs_are_recorded_and_the_others_finish(bench_run):
    _, out, result = bench_run
    assert result.returncode == 1, result.stderr  # some run failed
    assert "Traceback" not in result.stderr
    records = {r["name"]: r for r in read_jsonl(out / "results.jsonl")}
    assert records["broken"]["status"] == "failed"
    assert records["broken"]["exit_code"] == 2
    assert "/nonexistent/train.bio" in records["broken"]["error"]
    assert "/nonexistent/train.bio" in (out / "logs" / "broken.log").read_text(encoding="utf-8")
    assert records["tiny_s1"]["status"] == records["tiny_s2"]["status"] == "ok"  # runs after a failure ran
    table = (out / "RESULTS.md").read_text(encoding="utf-8")
    assert "`broken`" in table


@pytest.mark.slow
def test_two_seeds_give_mean_and_std(bench_run):
    _, out, _ = bench_run
    records = {r["name"]: r for r in read_jsonl(out / "results.jsonl")}
    f1s = [100 * records[f"tiny_s{s}"]["test"]["f1"] for s in (1, 2)]
    row = next(line for line in (out / "RESULTS.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| sample | bilstm | tiny |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "2"
    mean, std = cells[6].split(" ± ")
    assert float(mean) == pytest.approx(sum(f1s) / 2, abs=0.01)
    assert float(std) == pytest.approx(abs(f1s[0] - f1s[1]) / 2 ** 0.5, abs=0.01)  # sample std of two


@pytest.mark.slow
def test_resume_skips_completed_runs(bench_run, tmp_path):
    matrix, out, _ = bench_run
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    ok_files = [copy / "runs" / n / "model.safetensors" for n in ("tiny_s1", "tiny_s2")]
    ok_files += [copy / "logs" / f"{n}.log" for n in ("tiny_s1", "tiny_s2")]
    before = {p: p.stat().st_mtime_ns for p in ok_files}
    failed_log = copy / "logs" / "broken.log"
    failed_log.write_text("stale\n", encoding="utf-8")
    result = nerkit("bench", "--matrix", matrix, "--out", copy, "--device", "cpu", "--resume")
    assert result.returncode == 1, result.stderr
    assert {p: p.stat().st_mtime_ns for p in ok_files} == before  # ok runs were not run again
    assert "stale" not in failed_log.read_text(encoding="utf-8")  # the failed one was
    assert result.stderr.count("skipped") == 2
    names = [r["name"] for r in read_jsonl(copy / "results.jsonl")]
    assert sorted(names) == sorted(set(names)) and len(names) == 3


def test_the_sessions_file_names_every_session_of_a_run_oldest_first(tmp_path):
    """A fresh run starts the file, a continuation adds to it, and a run begun before the file existed
    starts it from its last record's list of sessions (or that record's commit)."""
    path = tmp_path / "run.sessions.jsonl"
    assert record_session(path, {"git_commit": "a", "date": "d1"}, None) == ["a"]
    assert record_session(path, {"git_commit": "b", "date": "d2"}, {}) == ["a", "b"]
    assert record_session(path, {"git_commit": "c", "date": "d3"}, None) == ["c"]  # started over
    assert [json.loads(line)["commit"] for line in path.read_text(encoding="utf-8").splitlines()] == ["c"]
    path.unlink()
    assert record_session(path, {"git_commit": "z", "date": "d4"}, {"session_commits": ["x", "y"]}) == ["x", "y", "z"]
    path.unlink()
    assert record_session(path, {"git_commit": "z", "date": "d4"}, {"git_commit": "y"}) == ["y", "z"]
    path.unlink()
    assert record_session(path, {"git_commit": "z", "date": "d4"}, {}) == ["unknown", "z"]


@pytest.mark.slow
def test_resume_continues_a_stopped_run_from_its_checkpoint(tmp_path):
    """A run stopped by its step limit goes on from its checkpoint when --resume raises the limit: the
    model equals `nerkit train` then `nerkit train --resume` of the same config, the log keeps both
    sessions and the record adds them up. A change to what is trained starts the run over."""
    config = write_yaml(tmp_path / "tiny.yaml", {**TINY, "train": {**TINY["train"], "epochs": 3}})
    matrix = write_yaml(tmp_path / "matrix.yaml", {
        "predict_batch_size": 16, "runs": [{"name": "tiny", "dataset": "sample", "config": str(config)}]})
    out, results = tmp_path / "out", tmp_path / "out" / "results.jsonl"
    bench = ("bench", "--matrix", matrix, "--out", out, "--device", "cpu")
    first = nerkit(*bench, "--set", "train.max_steps=5")
    assert first.returncode == 0, first.stderr
    (before,) = read_jsonl(results)
    assert (before["steps"], before["epochs"], before["stopped"], before["partial_epoch"]) == (5, 1, "max_steps", True)

    # a session killed outright (SIGKILL, a machine restart) writes no record, only its sessions line
    sessions = out / "logs" / "tiny.sessions.jsonl"
    assert [json.loads(line)["commit"] for line in sessions.read_text(encoding="utf-8").splitlines()] == \
        [before["git_commit"]]
    with open(sessions, "a", encoding="utf-8") as f:
        f.write(json.dumps({"commit": "f" * 40, "date": "2026-01-01T00:00:00+00:00"}) + "\n")

    again = nerkit(*bench, "--set", "train.max_steps=12", "--resume")
    assert again.returncode == 0, again.stderr
    assert "continuing from its checkpoint" in again.stderr
    (after,) = read_jsonl(results)
    # the epoch the limit cut short goes on: steps 6-12 are still epoch 1
    assert (after["steps"], after["epochs"], after["continued"]) == (12, 1, 1)
    assert after["session_commits"] == [before["git_commit"], "f" * 40, after["git_commit"]]
    assert after["wall_s"] > before["wall_s"] and after["overrides"][-2:] == ["train.max_steps=12", "train.device=cpu"]
    assert after["peak_rss_mib"] >= before["peak_rss_mib"]
    log = (out / "logs" / "tiny.log").read_text(encoding="utf-8")
    assert log.count("model: bilstm") == 2 and "resuming" in log and "continuing from" in log
    run_dir = out / "runs" / "tiny"
    assert yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))["train"]["max_steps"] == 12
    assert f"`tiny` (sessions at commits {before['git_commit'][:7]}, " in (out / "RESULTS.md").read_text(encoding="utf-8")

    ref = tmp_path / "ref"
    trained = nerkit("train", "--config", config, "--out", ref, "--set", "train.max_steps=5", "--set", "train.device=cpu")
    assert trained.returncode == 0, trained.stderr
    resumed = nerkit("train", "--resume", ref, "--set", "train.max_steps=12")
    assert resumed.returncode == 0, resumed.stderr
    assert (ref / "model.safetensors").read_bytes() == (run_dir / "model.safetensors").read_bytes()

    redo = nerkit(*bench, "--set", "train.max_steps=12", "--set", "train.lr=0.01", "--resume")
    assert redo.returncode == 0, redo.stderr
    assert "starting over, what it trains changed since its checkpoint: train.lr: " in redo.stderr
    assert "continuing" not in redo.stderr
    (fresh,) = read_jsonl(results)
    assert (fresh["steps"], fresh["epochs"]) == (12, 1) and "continued" not in fresh
    assert len(sessions.read_text(encoding="utf-8").splitlines()) == 1
    assert (out / "logs" / "tiny.log").read_text(encoding="utf-8").count("model: bilstm") == 1
    assert (out / "logs" / "tiny.previous.log").read_text(encoding="utf-8") == log  # the run it replaced keeps its log


@pytest.mark.slow
def test_a_run_continues_when_its_data_file_is_named_another_way(tmp_path, monkeypatch):
    """The same training file, named relative to NERKIT_DATA in one session and absolute in the next
    (NERKIT_DATA set one way, then another), is the same run: it continues from its checkpoint."""
    data = tmp_path / "corpora"
    data.mkdir()
    shutil.copy(SAMPLE / "train.bio", data / "train.bio")
    tiny = {**TINY, "data": {**TINY["data"], "train": "${NERKIT_DATA}/train.bio"}, "train": {**TINY["train"], "epochs": 3}}
    matrix = write_yaml(tmp_path / "matrix.yaml", {"predict_batch_size": 16, "runs": [
        {"name": "tiny", "dataset": "sample", "config": str(write_yaml(tmp_path / "tiny.yaml", tiny))}]})
    out = tmp_path / "out"
    bench = ("bench", "--matrix", matrix, "--out", out, "--device", "cpu")
    monkeypatch.setenv("NERKIT_DATA", os.path.relpath(data, REPO))  # the commands run in REPO
    assert nerkit(*bench, "--set", "train.max_steps=5").returncode == 0
    monkeypatch.setenv("NERKIT_DATA", str(data))
    again = nerkit(*bench, "--set", "train.max_steps=8", "--resume")
    assert again.returncode == 0 and "continuing from its checkpoint" in again.stderr, again.stderr
    (record,) = read_jsonl(out / "results.jsonl")
    assert record["status"] == "ok" and (record["steps"], record["continued"]) == (8, 1)


@pytest.mark.slow
def test_a_continued_run_with_vectors_keeps_their_width_in_its_model_directory(tmp_path):
    """A matrix run whose table widths come from its vector file (`char_dim: null`) continues with
    --resume to a model directory that loads: its config.yaml keeps the file's width (once the
    matrix's null replaced it, and the model no longer matched its config)."""
    chars = sorted({line.split()[0] for line in (SAMPLE / "train.bio").read_text(encoding="utf-8").splitlines()
                    if line.strip()})[:20]
    vectors = tmp_path / "char.vec"
    vectors.write_text(f"{len(chars)} 6\n" + "".join(f"{c} {' '.join(str((i + k) % 5 - 2) for k in range(6))}\n"
                                                     for i, c in enumerate(chars)), encoding="utf-8")
    tiny = {**TINY, "embeddings": {**TINY["embeddings"], "char_dim": None, "char_vectors": str(vectors)},
            "train": {**TINY["train"], "epochs": 3}}
    matrix = write_yaml(tmp_path / "matrix.yaml", {"predict_batch_size": 16, "runs": [
        {"name": "tiny", "dataset": "sample", "config": str(write_yaml(tmp_path / "tiny.yaml", tiny))}]})
    out = tmp_path / "out"
    bench = ("bench", "--matrix", matrix, "--out", out, "--device", "cpu")
    assert nerkit(*bench, "--set", "train.max_steps=5").returncode == 0
    again = nerkit(*bench, "--set", "train.max_steps=12", "--resume")
    assert again.returncode == 0 and "continuing from its checkpoint" in again.stderr, again.stderr
    (record,) = read_jsonl(out / "results.jsonl")
    assert record["status"] == "ok" and record["steps"] == 12
    saved = yaml.safe_load((out / "runs" / "tiny" / "config.yaml").read_text(encoding="utf-8"))
    assert saved["embeddings"]["char_dim"] == 6 and saved["train"]["max_steps"] == 12


@pytest.mark.slow
def test_a_failed_continuation_keeps_the_last_good_figures(tmp_path):
    """When a continued run fails (here its training file changed since the checkpoint), its record
    says so, and the figures of the record it continued stay in it."""
    train = tmp_path / "train.bio"
    shutil.copy(SAMPLE / "train.bio", train)
    tiny = {**TINY, "data": {**TINY["data"], "train": str(train)}, "train": {**TINY["train"], "epochs": 3}}
    matrix = write_yaml(tmp_path / "matrix.yaml", {"predict_batch_size": 16, "runs": [
        {"name": "tiny", "dataset": "sample", "config": str(write_yaml(tmp_path / "tiny.yaml", tiny))}]})
    out = tmp_path / "out"
    bench = ("bench", "--matrix", matrix, "--out", out, "--device", "cpu")
    assert nerkit(*bench, "--set", "train.max_steps=5").returncode == 0
    (good,) = read_jsonl(out / "results.jsonl")
    with train.open("a", encoding="utf-8") as f:
        f.write("\n中 B-LOC\n国 I-LOC\n")
    result = nerkit(*bench, "--set", "train.max_steps=12", "--resume")
    assert result.returncode == 1 and "continuing from its checkpoint" in result.stderr
    (failed,) = read_jsonl(out / "results.jsonl")
    assert failed["status"] == "failed" and "data changed" in failed["error"]
    assert failed["last_ok"] == good and failed["continued"] == 1
    assert (out / "runs" / "tiny" / "model.safetensors").is_file()


@pytest.mark.parametrize("change, words", [
    ({"overrides": ["train.lrr=0.1"]}, ["run second:", "train.lrr", "did you mean 'lr'?"]),
    ({"config": "missing.yaml"}, ["run second:", "missing.yaml"]),
    ({"overrides": ["train.optimizer=adamm"]}, ["run second:", "train.optimizer", "adam"]),
])
@pytest.mark.slow
def test_every_config_is_checked_before_any_run_starts(tmp_path, change, words):
    """A typo in the second run's overrides (or a config that is not there) ends `nerkit bench` with
    one exit-2 line naming the run and the key, and nothing is created: the first run never starts."""
    config = write_yaml(tmp_path / "tiny.yaml", TINY)
    second = {"name": "second", "dataset": "sample", "config": str(config), **change}
    if change.get("config"):
        second["config"] = str(tmp_path / change["config"])
    matrix = write_yaml(tmp_path / "matrix.yaml", {"runs": [
        {"name": "first", "dataset": "sample", "config": str(config)}, second]})
    out = tmp_path / "out"
    result = nerkit("bench", "--matrix", matrix, "--out", out, "--device", "cpu")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines
    assert not out.exists()


@pytest.mark.slow
def test_markdown_only_rebuilds_the_table(bench_run, tmp_path):
    matrix, out, _ = bench_run
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    (copy / "RESULTS.md").unlink()
    log = copy / "logs" / "tiny_s1.log"
    before = log.stat().st_mtime_ns
    result = nerkit("bench", "--matrix", matrix, "--out", copy, "--markdown-only")
    assert result.returncode == 1, result.stderr  # the recorded failures still count
    assert (copy / "RESULTS.md").read_text(encoding="utf-8") == (out / "RESULTS.md").read_text(encoding="utf-8")
    assert log.stat().st_mtime_ns == before and "running" not in result.stderr  # nothing ran


@pytest.mark.slow
def test_parallel_jobs_with_set_and_seeds_match_the_sequential_runs(bench_run, tmp_path):
    """--jobs 2 trains two runs at once; --seeds replaces the entry's seeds and --set reaches every
    run. With the same seeds and values the figures equal the sequential fixture's (one thread each,
    deterministic on the CPU)."""
    _, out, _ = bench_run
    config = write_yaml(tmp_path / "tiny.yaml", TINY)
    matrix = write_yaml(tmp_path / "matrix.yaml", {
        "predict_batch_size": 16, "runs": [{"name": "tiny", "dataset": "sample", "config": str(config), "seeds": [7]}]})
    par = tmp_path / "par"
    result = nerkit("bench", "--matrix", matrix, "--out", par, "--device", "cpu", "--jobs", "2", "--seeds", "1,2",
                    "--set", "train.max_steps=30")
    assert result.returncode == 0, result.stderr
    sequential = {r["name"]: r for r in read_jsonl(out / "results.jsonl")}
    records = {r["name"]: r for r in read_jsonl(par / "results.jsonl")}
    assert set(records) == {"tiny_s1", "tiny_s2"}
    for name, r in records.items():
        assert r["status"] == "ok" and r["jobs"] == 2
        assert "train.max_steps=30" in r["overrides"]
        assert r["test"] == sequential[name]["test"] and r["dev"] == sequential[name]["dev"]
    table = (par / "RESULTS.md").read_text(encoding="utf-8")
    assert "`train.max_steps=30`" in table and "--jobs 2" in table
    bad = nerkit("bench", "--matrix", matrix, "--out", par, "--seeds", "1,x")
    assert bad.returncode == 2 and "--seeds" in bad.stderr and "Traceback" not in bad.stderr
    bad = nerkit("bench", "--matrix", matrix, "--out", par, "--set", "nosuch.key=1")
    assert bad.returncode == 2 and "nosuch" in bad.stderr and "Traceback" not in bad.stderr


def test_jobs_run_at_the_same_time(tmp_path, monkeypatch):
    """With --jobs 2, two runs are in their workers at once: each waits at a barrier for the other
    (sequential runs would never meet there and the barrier would break). No clock involved."""
    import threading

    import nerkit.tools.bench.runner as runner

    barrier = threading.Barrier(2, timeout=60)

    def execute(run, out, predict_batch_size, base, previous=None):
        barrier.wait()
        return {"name": run.name, "status": "failed", "error": "not run", "run": run.group, "dataset": run.dataset}

    monkeypatch.setattr(runner, "execute", execute)
    config = write_yaml(tmp_path / "tiny.yaml", TINY)
    matrix = write_yaml(tmp_path / "matrix.yaml", {"runs": [{"name": "tiny", "dataset": "sample",
                                                              "config": str(config), "seeds": [1, 2]}]})
    _, failed = runner.run_bench(matrix, tmp_path / "out", jobs=2)
    assert failed == 2 and not barrier.broken


@pytest.mark.parametrize("code, stops", [(143, True), (130, True), (-9, False), (1, False)])
def test_a_run_stopped_by_a_signal_stops_the_benchmark(tmp_path, monkeypatch, code, stops):
    """A worker that SIGTERM or Ctrl-C stopped (exit 143 or 130, its checkpoint saved) was asked to
    stop: no further run starts, and the benchmark exits with the same code, saying how to continue.
    A run that failed otherwise (killed outright, as by the OOM killer; an error) is the next run's
    turn, as before."""
    import nerkit.tools.bench.runner as runner
    from nerkit.errors import Interrupted

    started = []

    def execute(run, out, predict_batch_size, base, previous=None):
        started.append(run.name)
        return {"name": run.name, "status": "failed", "exit_code": code, "error": f"exit code {code}",
                "run": run.group, "dataset": run.dataset}

    monkeypatch.setattr(runner, "execute", execute)
    config = write_yaml(tmp_path / "tiny.yaml", TINY)
    matrix = write_yaml(tmp_path / "matrix.yaml", {"runs": [{"name": "tiny", "dataset": "sample",
                                                              "config": str(config), "seeds": [1, 2]}]})
    if stops:
        with pytest.raises(Interrupted, match="--resume") as stopped:
            runner.run_bench(matrix, tmp_path / "out")
        assert stopped.value.exit_code == code and "tiny_s1" in str(stopped.value)
        assert started == ["tiny_s1"]
        assert runner._summary({"status": "failed", "exit_code": code, "error": "x"}).startswith("stopped")
    else:
        runner.run_bench(matrix, tmp_path / "out")
        assert started == ["tiny_s1", "tiny_s2"]
    assert (tmp_path / "out" / "RESULTS.md").is_file()


def workers_of(out: Path) -> list[int]:
    """The pids of the worker processes training into `out`."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and "nerkit.tools.bench.worker" in command and str(out) in command:
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow  # trains in a real worker, twice
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the worker through /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_benchmark_alone_stops_its_worker_with_a_checkpoint(tmp_path, signum):
    """`kill` of the `nerkit bench` process (or Ctrl-C, which now reaches only it: its workers have
    sessions of their own) is passed on to the worker, which stops with a checkpoint and is recorded
    as stopped; --resume then finishes the run. A benchmark that died of the signal left its worker
    training on, unrecorded, where a --resume would start a second one."""
    config = write_yaml(tmp_path / "tiny.yaml", {**TINY, "train": {**TINY["train"], "epochs": 400, "max_steps": 0,
                                                                   "checkpoint_every": 5}})
    matrix = write_yaml(tmp_path / "matrix.yaml", {"runs": [{"name": "tiny", "dataset": "sample",
                                                              "config": str(config), "seeds": [1]}]})
    out = tmp_path / "out"
    bench = subprocess.Popen(nerkit_command("bench", "--matrix", matrix, "--out", out), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "runs" / "tiny_s1" / "checkpoint" / "state.json").is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        assert len(workers_of(out)) == 1 and bench.poll() is None
        bench.send_signal(signum)  # to the benchmark alone
        _, stderr = bench.communicate(timeout=120)
        assert bench.returncode == 128 + signum, stderr
        assert "stopped run tiny_s1 (its checkpoint saved)" in stderr and "--resume" in stderr
        assert workers_of(out) == []
    finally:  # a worker left behind by a failure here is not left training
        bench.kill()
        for pid in workers_of(out):
            os.kill(pid, signal.SIGKILL)
    (record,) = read_jsonl(out / "results.jsonl")
    assert record["status"] == "failed" and record["exit_code"] == 128 + signum
    resumed = nerkit("bench", "--matrix", matrix, "--out", out, "--resume", "--set", "train.epochs=2")
    assert resumed.returncode == 0, resumed.stderr
    assert read_jsonl(out / "results.jsonl")[-1]["status"] == "ok"


@pytest.mark.slow
def test_bad_matrix_is_a_user_error(tmp_path):
    matrix = write_yaml(tmp_path / "bad.yaml", {"runs": [{"name": "a", "dataset": "d", "config": "c.yaml",
                                                          "seed": [1]}]})
    result = nerkit("bench", "--matrix", matrix, "--out", tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"nerkit: error: {matrix}:5: ")  # the line of the key
    assert "'seed'" in result.stderr and "did you mean 'seeds'?" in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("matrix, words", [
    ({"runs": [{"name": "a", "dataset": "d", "config": "c.yaml"}], "quik": []}, "unknown key 'quik'"),
    ({"runs": []}, "non-empty list"),
    ({"runs": [{"name": "a", "config": "c.yaml"}]}, "needs dataset"),
    ({"runs": [{"name": "a/b", "dataset": "d", "config": "c.yaml"}]}, "may hold only"),
    ({"runs": [{"name": "a", "dataset": "d", "config": "c.yaml", "seeds": [1, 1]}]}, "distinct"),
    ({"runs": [{"name": "a", "dataset": "d", "config": "c.yaml", "seeds": 3}]}, "seeds must be"),
    ({"runs": [{"name": "a", "dataset": "d", "config": "c.yaml", "overrides": ["train.lr"]}]}, "has no '='"),
    ({"runs": [{"name": "a", "dataset": "d", "config": "c.yaml", "overrides": ["trian.lr=1"]}]}, "unknown section"),
    ({"runs": [{"name": "a", "dataset": "d", "config": "c.yaml", "seeds": [1]},
               {"name": "a_s1", "dataset": "d", "config": "c.yaml"}]}, "run names repeat: a_s1"),
    ({"runs": [{"name": "a", "dataset": "d", "config": "c.yaml"}], "anchors": "nowhere.yaml"}, "anchors file not found"),
    ({"runs": [{"name": "a", "dataset": "d", "config": "c.yaml"}], "predict_batch_size": 0}, "positive"),
])
def test_matrix_is_checked_strictly(tmp_path, matrix, words):
    path = write_yaml(tmp_path / "m.yaml", matrix)
    with pytest.raises(UserError, match=words):
        load_matrix(path)


def test_quick_needs_a_quick_block_and_applies_it_before_the_seed(tmp_path):
    path = write_yaml(tmp_path / "m.yaml", {"runs": [{"name": "a", "dataset": "d", "config": "c.yaml", "seeds": [3]}]})
    with pytest.raises(UserError, match="no quick"):
        load_matrix(path, quick=True)
    path = write_yaml(tmp_path / "m.yaml", {"quick": ["train.epochs=1"], "runs": [
        {"name": "a", "dataset": "d", "config": "c.yaml", "overrides": ["train.lr=0.1"], "seeds": [3],
         "quick": ["encoder.num_layers=1"]}]})
    assert load_matrix(path).runs[0].overrides == ["train.lr=0.1", "train.seed=3"]
    assert load_matrix(path, quick=True, device="cuda").runs[0].overrides == [
        "train.lr=0.1", "train.epochs=1", "encoder.num_layers=1", "train.seed=3", "train.device=cuda"]


def test_shipped_matrices_and_anchors_load():
    full = load_matrix(REPO / "configs" / "bench" / "full.yaml")
    quick = load_matrix(REPO / "configs" / "bench" / "quick.yaml", quick=True)
    for matrix in (full, quick):
        combos = {(r.dataset, Path(r.config).stem.split("_", 1)[1]) for r in matrix.runs}
        assert combos == {(d, e) for d in ("msra", "peopledaily") for e in ("bilstm", "transformer", "tener", "flat")}
    assert {a["encoder"]: a["test_f1"] for a in reversed(full.anchors["msra"]["anchors"])} == {
        "bilstm": 91.87, "transformer": 88.35, "tener": 92.74, None: 93.18, "flat": 94.12}
    assert full.anchors["peopledaily"]["anchors"] == [] and "No published figure" in full.anchors["peopledaily"]["note"]


def test_only_selects_by_name_or_prefix(tmp_path):
    path = write_yaml(tmp_path / "m.yaml", {"runs": [
        {"name": "msra_bilstm", "dataset": "msra", "config": "c.yaml", "seeds": [1, 2]},
        {"name": "pd_bilstm", "dataset": "pd", "config": "c.yaml"}]})
    runs = load_matrix(path).runs
    assert [r.name for r in select_runs(runs, ["msra"])] == ["msra_bilstm_s1", "msra_bilstm_s2"]
    assert [r.name for r in select_runs(runs, ["msra_bilstm_s2,pd_bilstm"])] == ["msra_bilstm_s2", "pd_bilstm"]
    assert len(select_runs(runs, [])) == 3
    with pytest.raises(UserError, match="--only nope"):
        select_runs(runs, ["nope"])


def test_failure_message_names_a_kill_and_keeps_the_last_lines():
    log = "\n".join(f"line {i}" for i in range(50))
    message = failure_message(-9, log)
    assert message.startswith("killed by SIGKILL (out of memory?)")
    assert message.endswith("line 49") and "line 29" not in message
    assert failure_message(1, "Traceback\nValueError: boom").splitlines()[0] == "exit code 1"


def _record(name: str, group: str, seed: int, f1: float, dataset: str = "msra", **extra) -> dict:
    prf = {"precision": f1, "recall": f1, "f1": f1}
    return {"name": name, "run": group, "dataset": dataset, "seed": seed, "status": "ok", "encoder": "bilstm",
            "test": prf, "dev": prf, "epochs": 3, "train_chars_per_s_steady": 1000.0, "predict_chars_per_s": 5000.0,
            "predict_batch_size": 64, "peak_rss_mib": 512.0 + seed, "wall_s": 60.0, "git_commit": "abc",
            "torch_version": "2", "device": "cpu", "torch_threads": 2, "hostname": "h", "cpu": "c",
            "date": "2025-01-01T00:00:00+00:00", "nerkit_version": "0.1.0", **extra}


def test_table_compares_with_the_published_figure():
    anchors = load_matrix(REPO / "configs" / "bench" / "full.yaml").anchors
    records = [_record("m_s1", "m", 1, 0.90), _record("m_s2", "m", 2, 0.92),
               _record("p", "p", 1, 0.80, dataset="peopledaily", pretrained=True),
               {"name": "x", "run": "x", "dataset": "msra", "status": "failed", "error": "exit code 1\nboom"}]
    table = render_markdown(records, anchors)
    assert "| msra | bilstm | m | 2 | 91.00 ± 1.41 | 91.00 ± 1.41 | 91.00 ± 1.41 | 91.87 | -0.87 | 91.00 ± 1.41 | 3 " \
           "| 1,000 | 5,000 | 514 | 60 |" in table
    assert "| peopledaily | bilstm † | p | 1 | 80.00 | 80.00 | 80.00 | – | – |" in table  # one seed: no ±
    assert "88.81" in table and "94.12" in table  # every MSRA anchor is listed under the table
    assert "No published figure" in table
    assert "- `x`: exit code 1: boom" in table


def test_parallel_workers_share_the_cores_unless_told(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert worker_env(4)["OMP_NUM_THREADS"] == "2"
    assert worker_env(16)["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in worker_env(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert worker_env(4)["OMP_NUM_THREADS"] == "3"


def test_an_interrupted_worker_says_so_without_a_traceback(monkeypatch, capsys):
    import nerkit.tools.bench.worker as bench
    from nerkit.errors import Interrupted

    def interrupted(*args):
        raise Interrupted("training interrupted at epoch 2, step 7; checkpoint saved")

    monkeypatch.setattr(bench, "measure", interrupted)
    spec = {"config": "c.yaml", "overrides": [], "out": "o", "predict_batch_size": 8}
    assert bench.worker_main([json.dumps(spec)]) == 130
    err = capsys.readouterr().err
    assert "checkpoint saved" in err and "Traceback" not in err


def test_a_copied_tree_can_name_its_commit(monkeypatch):
    from nerkit.tools.bench import host_info

    monkeypatch.setenv("NERKIT_GIT_COMMIT", "0123abcd")
    info = host_info()
    assert info["git_commit"] == "0123abcd" and info["git_dirty"] is None
    monkeypatch.delenv("NERKIT_GIT_COMMIT")
    assert host_info()["git_commit"] != "0123abcd"


# ----------------------------------------------------------------------- env:, nproc:, rounds: and the line of an error

@pytest.mark.parametrize("text, line, words", [
    ("runs:\n  - name: a\n    dataset: d\n    config: c.yaml\n    nprc: 2\n", 5, ["unknown key 'nprc'", "'nproc'"]),
    ("runs:\n  - name: a\n    dataset: d\n    config: c.yaml\n    nproc: 0\n", 5, ["runs[0].nproc", "positive"]),
    ("rounds: two\nruns:\n  - {name: a, dataset: d, config: c.yaml}\n", 1, ["rounds must be a positive integer"]),
    ("runs:\n  - name: a\n    dataset: d\n    config: c.yaml\n    env:\n      OK: 1\n      BAD NAME: 2\n", 7,
     ["'BAD NAME'", "not an environment variable name"]),
    ("env: [A]\nruns:\n  - {name: a, dataset: d, config: c.yaml}\n", 1, ["env must be a mapping"]),
    ("runs:\n  - {name: a, dataset: d, config: c.yaml}\n  - {name: b, dataset: d, config: c.yaml,\n"
     "     env: {A: [1]}}\n", 4, ["runs[1].env.A must be a string"]),
])
def test_a_bad_env_nproc_or_rounds_names_the_matrix_line(tmp_path, text, line, words):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as info:
        load_matrix(matrix)
    assert info.value.where == f"{matrix}:{line}", info.value
    assert all(w in str(info.value) for w in words), str(info.value)


def test_env_nproc_and_rounds_expand_into_the_runs(tmp_path):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("rounds: 2\nenv: {A: 1, B: x}\nruns:\n"
                      "  - {name: a, dataset: d, config: c.yaml, seeds: [1, 2], env: {B: null, C: y}, nproc: 2}\n"
                      "  - {name: b, dataset: d, config: c.yaml, rounds: 5}\n", encoding="utf-8")
    a1, a2, b = load_matrix(matrix).runs
    assert a1.env == a2.env == {"A": "1", "B": None, "C": "y"} and b.env == {"A": "1", "B": "x"}
    assert (a1.nproc, a1.rounds, b.nproc, b.rounds) == (2, 2, 1, 5)
    assert [r.rounds for r in load_matrix(matrix, rounds=3).runs] == [3, 3, 3]


def test_an_unknown_matrix_key_is_one_line_naming_the_file_and_line(tmp_path):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("runs:\n  - name: a\n    dataset: d\n    config: c.yaml\n    envs: {A: 1}\n", encoding="utf-8")
    result = nerkit("bench", "--matrix", matrix, "--out", tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"nerkit: error: {matrix}:5: unknown key 'envs'") and "did you mean 'env'?" in result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "out").exists()


def assert_spread(record: dict, figure: str, rounds: int = 2) -> None:
    values = [r[figure] for r in record["rounds"]]
    spread = record["spread"][figure]
    assert len(values) == rounds and spread["min"] <= spread["median"] <= spread["max"], record
    assert (spread["min"], spread["max"]) == (min(values), max(values))


@pytest.mark.slow
def test_env_reaches_the_runs_process_and_rounds_give_min_median_max(tmp_path):
    config = write_yaml(tmp_path / "tiny.yaml", TINY)
    matrix = write_yaml(tmp_path / "matrix.yaml", {
        "rounds": 2, "env": {"NERKIT_BENCH_PROBE": "seen"},
        "runs": [{"name": "tiny", "dataset": "sample", "config": str(config), "overrides": ["train.max_steps=10"],
                  "env": {"NERKIT_BENCH_GONE": None}}]})
    out = tmp_path / "out"
    result = nerkit("bench", "--matrix", matrix, "--out", out,
                    env={**os.environ, "PYTHONWARNINGS": "error", "NERKIT_BENCH_GONE": "here"})
    assert result.returncode == 0, result.stderr
    (record,) = read_jsonl(out / "results.jsonl")
    assert record["env_seen"] == {"NERKIT_BENCH_PROBE": "seen", "NERKIT_BENCH_GONE": None}
    assert record["env"] == {"NERKIT_BENCH_PROBE": "seen", "NERKIT_BENCH_GONE": None}
    for figure in ("predict_chars_per_s", "train_chars_per_s", "fixed_s"):
        assert_spread(record, figure)
    assert [r["round"] for r in record["rounds"]] == [1, 2]
    # the fixed cost: the worker's wall seconds less its training steps and its timed prediction pass
    last = record["rounds"][-1]
    assert 0 < last["fixed_s"] == pytest.approx(last["wall_s"] - record["train_steps_s"] - record["predict_s"])
    assert record["train_steps_s"] > 0 and record["predict_s"] > 0
    table = (out / "RESULTS.md").read_text(encoding="utf-8")
    assert "Runs measured in several rounds" in table and "| tiny | 2 | 1 |" in table and "Fixed s" in table


@pytest.mark.slow
def test_nproc_trains_the_run_on_that_many_processes(tmp_path):
    config = write_yaml(tmp_path / "tiny.yaml", TINY)
    matrix = write_yaml(tmp_path / "matrix.yaml", {"runs": [
        {"name": "pair", "dataset": "sample", "config": str(config), "overrides": ["train.max_steps=6"], "nproc": 2}]})
    result = nerkit("bench", "--matrix", matrix, "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    (record,) = read_jsonl(tmp_path / "out" / "results.jsonl")
    assert record["status"] == "ok" and record["nproc"] == 2 and record["processes"] == 2, record


# ----------------------------------------------------------------------- nerkit bench predict, export, serve

SPEED_KEYS = {"name", "kind", "command", "timed", "model", "git_commit", "git_dirty", "date", "hostname", "cpu",
              "cpu_count", "rounds", "spread"}


def speed_record(out: Path, kind: str) -> dict:
    (record,) = [r for r in read_jsonl(out / "results.jsonl") if r["kind"] == kind]
    assert SPEED_KEYS <= set(record), SPEED_KEYS - set(record)
    assert record["command"].startswith(f"nerkit bench {kind} ") and f"nerkit --quiet {kind} " in record["timed"]
    assert f"## nerkit {kind}" in (out / "RESULTS.md").read_text(encoding="utf-8")
    return record


@pytest.mark.slow
def test_bench_predict_times_whole_processes_in_rounds(tiny_model_dir, tmp_path):
    text = tmp_path / "texts.txt"
    text.write_text("新华社北京电\n张三在北京大学读书。\n", encoding="utf-8")
    out = tmp_path / "out"
    result = nerkit("bench", "predict", "--model", tiny_model_dir, "--text", text, "--rounds", "2", "--threads", "1",
                    "--env", "OMP_WAIT_POLICY=PASSIVE", "--out", out)
    assert result.returncode == 0, result.stderr
    record = speed_record(out, "predict")
    assert record["chars"] == 16 and record["env"] == {"OMP_WAIT_POLICY": "PASSIVE"} and record["threads"] == 1
    for figure in ("chars_per_s", "seconds", "peak_rss_mib", "startup_s", "steady_chars_per_s"):
        assert_spread(record, figure)
    assert record["spread"]["peak_rss_mib"]["min"] > 50  # a process that imported torch and loaded a model
    for r in record["rounds"]:  # the fixed cost, timed over an empty text, is beside the steady rate
        assert 0 < r["startup_s"] and r["steady_chars_per_s"] == pytest.approx(16 / max(r["seconds"] - r["startup_s"], 1e-9))
    assert "| start-up s | steady chars/s |" in (out / "RESULTS.md").read_text(encoding="utf-8")
    import stat

    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)  # its --output /dev/null was written, not replaced
    # a missing text file is one line and exit 2
    bad = nerkit("bench", "predict", "--model", tiny_model_dir, "--text", tmp_path / "none.txt", "--out", out)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "text file not found" in bad.stderr


@pytest.mark.slow
def test_bench_export_times_the_export_and_its_size(tiny_model_dir, tmp_path):
    pytest.importorskip("onnx")
    out = tmp_path / "out"
    result = nerkit("bench", "export", "--model", tiny_model_dir, "--rounds", "2", "--out", out)
    assert result.returncode == 0, result.stderr
    record = speed_record(out, "export")
    assert record["int8"] is False and record["format"] == "onnx"
    for figure in ("seconds", "size_mib", "peak_rss_mib"):
        assert_spread(record, figure)
    assert 0 < record["spread"]["size_mib"]["min"]


@pytest.mark.slow
def test_bench_serve_puts_a_bounded_load_on_a_real_server(tiny_model_dir, tmp_path):
    text = tmp_path / "texts.txt"
    text.write_text("新华社北京电\n\n张三在北京大学读书。\n", encoding="utf-8")
    out = tmp_path / "out"
    result = nerkit("bench", "serve", "--model", tiny_model_dir, "--text", text, "--rounds", "2", "--requests", "12",
                    "--concurrency", "3", "--seconds", "30", "--threads", "1", "--out", out)
    assert result.returncode == 0, result.stderr
    record = speed_record(out, "serve")
    assert [r["requests_done"] for r in record["rounds"]] == [12, 12] and record["concurrency"] == 3
    for figure in ("requests_per_s", "chars_per_s", "p50_ms", "p95_ms"):
        assert_spread(record, figure)
    assert all(r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"] for r in record["rounds"])


@pytest.mark.slow
def test_a_lattice_run_records_its_lexicons_sha256_and_coverage_of_dev_and_test(tmp_path):
    import hashlib

    from nerkit.data.corpus import read_corpus
    from nerkit.features.lexicon import Lexicon
    from nerkit.tools.resources.lexicon import lexicon_record

    corpora = {split: read_corpus(SAMPLE / f"{split}.bio").sentences for split in ("train", "dev", "test")}
    entities = sorted({s.text[sp.start:sp.end] for s in corpora["train"] for sp in s.spans() if sp.end - sp.start > 1})
    words = tmp_path / "words.txt"
    words.write_text("\n".join(entities + ["中国", "我们"]) + "\n", encoding="utf-8")
    flat = {**TINY, "embeddings": {**TINY["embeddings"], "word_dim": 8}, "lexicon": {"source": str(words)},
            "encoder": {"name": "flat", "n_heads": 2, "head_dim": 8, "num_layers": 1},
            "train": {**TINY["train"], "max_steps": 3}}
    config = write_yaml(tmp_path / "flat.yaml", flat)
    matrix = write_yaml(tmp_path / "matrix.yaml", {"runs": [
        {"name": "flat", "dataset": "sample", "config": str(config)},
        {"name": "bilstm", "dataset": "sample", "config": str(write_yaml(tmp_path / "tiny.yaml", TINY))}]})
    nerkit("bench", "--matrix", matrix, "--out", tmp_path / "out")
    records = {r["name"]: r for r in read_jsonl(tmp_path / "out" / "results.jsonl")}
    assert records["flat"]["status"] == "ok", records["flat"].get("error")
    recorded = records["flat"]["lexicon"]
    assert recorded["sha256"] == hashlib.sha256(words.read_bytes()).hexdigest()
    expected = lexicon_record(Lexicon.from_source(str(words)), str(words),
                              {"dev": corpora["dev"], "test": corpora["test"]}, normalize=True)
    assert recorded == expected and recorded["coverage"]["test"]["entities"]["held"] > 0
    assert "lexicon" not in records["bilstm"]  # a model without a lattice has none


@pytest.mark.slow
def test_a_span_run_chooses_its_threshold_on_dev_and_scores_test_at_it(tmp_path):
    from nerkit.data.corpus import read_corpus
    from nerkit.inference.evaluate import score
    from nerkit.inference.pipeline import Pipeline
    from nerkit.inference.span_threshold import GRID

    span = {**TINY, "model": {"head": "span"}, "span": {"size": 8, "max_width": 6},
            "train": {**TINY["train"], "max_steps": 40}}
    matrix = write_yaml(tmp_path / "matrix.yaml", {"runs": [
        {"name": "span", "dataset": "sample", "config": str(write_yaml(tmp_path / "span.yaml", span))},
        {"name": "crf", "dataset": "sample", "config": str(write_yaml(tmp_path / "tiny.yaml", TINY))}]})
    nerkit("bench", "--matrix", matrix, "--out", tmp_path / "out")
    records = {r["name"]: r for r in read_jsonl(tmp_path / "out" / "results.jsonl")}
    assert records["span"]["status"] == "ok", records["span"].get("error")
    chosen = records["span"]["span_threshold"]
    assert chosen["threshold"] in GRID and chosen["before"]["threshold"] == 0.5
    assert round(chosen["after"]["f1"], 6) == max(chosen["grid"].values()) and chosen["after"]["f1"] >= chosen["before"]["f1"]
    assert records["span"]["dev"]["f1"] == pytest.approx(chosen["after"]["f1"])
    # the saved model holds the threshold and the scores' map (the threshold on the map's scale), and
    # the record's test F1 is that model's on test
    model = tmp_path / "out" / "runs" / "span"
    meta = json.loads((model / "nerkit.json").read_text(encoding="utf-8"))
    fitted = chosen["score_map"]
    assert meta["span_threshold"] == fitted["threshold"]
    assert meta["span_score_map"] == {"scale": fitted["scale"], "shift": fitted["shift"]}
    test = read_corpus(SAMPLE / "test.bio").sentences
    pipe = Pipeline.load(model)
    found = pipe.predict_tokens([s.tokens for s in test], 16)
    assert score([s.spans() for s in test], found)["f1"] == pytest.approx(records["span"]["test"]["f1"])
    assert set(chosen["test_before"]) == {"threshold", "precision", "recall", "f1"}
    assert "span_threshold" not in records["crf"]  # a CRF model has no threshold


def test_a_runs_prepare_commands_write_the_file_it_trains_on(tmp_path):
    """`prepare:` runs nerkit commands before the run trains, ${BENCH_OUT} naming OUT in them and in
    the overrides: here the dictionary matches the run trains on (issue 57's dictionary benchmarks),
    written under OUT/prepared/, which the benchmark owns: --resume takes the directory again."""
    config = write_yaml(tmp_path / "tiny.yaml", TINY)
    matched = "${BENCH_OUT}/prepared/matched.jsonl"
    matrix = write_yaml(tmp_path / "matrix.yaml", {"predict_batch_size": 16, "runs": [
        {"name": "matched", "dataset": "sample", "config": str(config), "overrides": [f"data.train={matched}"],
         "prepare": [f"data match --dict {SAMPLE / 'train.bio'} --text {SAMPLE / 'train.bio'} --rest o --out {matched}"]},
        {"name": "broken", "dataset": "sample", "config": str(config),
         "prepare": ["data match --dict /nonexistent.txt:PER --text /nonexistent.txt --out ${BENCH_OUT}/x.jsonl"]}]})
    out = tmp_path / "out"
    result = nerkit("bench", "--matrix", matrix, "--out", out, "--device", "cpu")
    records = {r["name"]: r for r in read_jsonl(out / "results.jsonl")}
    assert records["matched"]["status"] == "ok", (out / "logs" / "matched.log").read_text(encoding="utf-8")
    assert records["matched"]["prepare"] == matrix_prepare(matrix, 0)
    assert (out / "prepared" / "matched.jsonl").is_file()
    assert f"$ nerkit data match --dict {SAMPLE / 'train.bio'}" in (out / "logs" / "matched.log").read_text(encoding="utf-8")
    assert records["broken"]["status"] == "failed" and result.returncode == 1  # a failed prepare fails its run
    assert not (out / "runs" / "broken" / "model.safetensors").exists()
    again = nerkit("bench", "--matrix", matrix, "--out", out, "--device", "cpu", "--resume", "--only", "matched")
    assert again.returncode == 0, again.stderr  # the finished run is kept, the directory taken as the bench's


def matrix_prepare(matrix: Path, i: int) -> list[str]:
    return yaml.safe_load(matrix.read_text(encoding="utf-8"))["runs"][i]["prepare"]


def test_prepare_must_be_a_list_of_commands(tmp_path):
    matrix = write_yaml(tmp_path / "m.yaml", {"runs": [{"name": "a", "dataset": "d", "config": "c.yaml",
                                                        "prepare": "data match"}]})
    with pytest.raises(UserError, match="prepare must be a list"):
        load_matrix(matrix)


def test_the_scale_table_sets_each_engine_against_predict_with_two_workers(tmp_path):
    """docs/scale.md's table (speed.scale_table): an engine's median rates as shares of `nerkit predict
    --workers 2`'s with the same model, the target met or not by the steady one (the start-up is
    measured apart), and 10^9 characters on N machines as
    start-up plus the characters over N times the steady rate. split_text cuts a text into whole lines."""
    from nerkit.tools.bench.speed import scale_table, split_text

    def record(engine, chars_per_s, steady, startup):
        spread = {"chars_per_s": {"median": chars_per_s}, "steady_chars_per_s": {"median": steady},
                  "startup_s": {"median": startup}, "peak_rss_mib": {"median": 300.0}}
        return {"kind": "predict", "model": "/m/bilstm", "engine": engine, "workers": 2, "spread": spread}

    table = scale_table([record(None, 40_000, 50_000, 2.0), record("dask", 36_000, 45_000, 8.0),
                         record("ray", 30_000, 48_000, 20.0), record("spark", 39_000, 40_000, 1.0)])
    predict, dask, ray, spark = table.splitlines()[2:]
    assert "| bilstm | nerkit predict | 2 | 50,000 | 2.0 | – | – | 300 | 5.6 h | 33 min | 3 min |" == predict
    assert "| 0.90 / 0.90 | yes |" in dask and "| 6.2 h | 37 min | 4 min |" in dask  # 8 s + 10^9 / (N x 45,000) s
    assert "| 0.75 / 0.96 | yes |" in ray  # a long start-up is reported, not counted per character
    assert "| 0.97 / 0.80 | no |" in spark

    text = tmp_path / "t.txt"
    text.write_text("a\nbb\nc\nd\ne\n", encoding="utf-8")
    assert split_text(text, tmp_path / "parts", 2) == 5
    assert [p.read_text(encoding="utf-8") for p in sorted((tmp_path / "parts").iterdir())] == ["a\nbb\n", "c\nd\ne\n"]
