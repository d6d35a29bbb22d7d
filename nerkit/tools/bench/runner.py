"""Running a matrix (`nerkit bench`): each run trains in its own worker process (`worker.py`), so
that a crash or an out-of-memory kill ends only that run; records go to DIR/results.jsonl as each
run ends, with the machine and commit they ran on. This parent reads YAML and starts processes; it
never imports torch."""

from __future__ import annotations

import json
import logging
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from nerkit.config import load_config
from nerkit.errors import STOP_SIGNALS, Interrupted, UserError, killed_by, stop_signals_handled
from nerkit.files import CHECKPOINT, atomic_write_text, check_input, check_output_directory, read_json_lines
from nerkit.inference.model_dir import CONFIG_FILE
from nerkit.tools.bench.matrix import MatrixRun, load_matrix, select_runs, with_teachers
from nerkit.tools.bench.report import render_markdown, short_error, spread
from nerkit.training.resume import run_differences
from nerkit.typed_yaml import interpolate
from nerkit.version import __version__

RESULTS = "results.jsonl"


TABLE = "RESULTS.md"


WORKER_RESULT = "bench.json"  # written by the worker into its model directory


ERROR_LINES = 20  # of a failed run's log, kept in its record


BENCH_OUT = "BENCH_OUT"  # the variable that names the output directory to a run's prepare: and overrides
TEXTS = "texts"  # DIR/texts/NAME.train.txt: the training text of a student with `train_text: true`
PREPARED = "prepared"  # DIR/prepared/: what runs' `prepare:` commands write (${BENCH_OUT}/prepared/NAME)


log = logging.getLogger(__name__)


class Workers:
    """The worker processes running now. Each starts in a session of its own, so that a signal for
    the benchmark (Ctrl-C at the terminal, `kill` of this process, a scheduler's SIGTERM to the
    process group) reaches it once, passed on from here: it stops at its next step with a checkpoint
    and is recorded as stopped, instead of training on unwatched after this process ended, or taking
    the signal twice (a second signal stops training at once)."""

    def __init__(self):
        self.procs: set[subprocess.Popen] = set()
        self.lock = threading.RLock()  # re-entrant: the signal handler runs on the main thread, whatever it holds
        self.signum: int | None = None  # the signal that asked the benchmark to stop

    def run(self, args: list[str], **kwargs) -> int:
        """Run a worker to its end (as `subprocess.run`); returns its exit code."""
        with self.lock:
            if self.signum is not None:  # asked to stop before this one started
                return 128 + self.signum
            proc = subprocess.Popen(args, start_new_session=True, **kwargs)
            self.procs.add(proc)
        try:
            return proc.wait()
        finally:
            with self.lock:
                self.procs.discard(proc)

    def pass_on(self, signum: int, frame=None) -> None:
        with self.lock:
            self.signum = self.signum or signum
            for proc in self.procs:
                proc.send_signal(signum)

    def signals_passed_on(self):
        """While the benchmark runs, SIGINT and SIGTERM go to the workers (on the main thread:
        signals reach no other)."""
        self.signum = None
        return stop_signals_handled(self.pass_on)


WORKERS = Workers()


def is_bench_dir(directory: Path) -> bool:
    """Whether `directory` holds nothing but what `nerkit bench` writes (a session killed before
    its first record leaves only logs/ and runs/; texts/ holds the students' training texts, prepared/
    what `prepare:` commands wrote)."""
    return all(path.name in (RESULTS, TABLE, "logs", "runs", TEXTS, PREPARED) for path in directory.iterdir())


def read_results(out: Path) -> dict[str, dict]:
    """Records of DIR/results.jsonl by run name (a later line of a name replaces an earlier one)."""
    path = out / RESULTS
    records: dict[str, dict] = {}
    if not path.is_file():
        return records
    for n, record in read_json_lines(path, "a results line"):
        if not isinstance(record.get("name"), str):
            raise UserError("not a results line", where=f"{path}:{n}")
        records[record["name"]] = record
    return records


def write_results(out: Path, records: dict[str, dict]) -> None:
    atomic_write_text(out / RESULTS, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records.values()))


def git_commit() -> tuple[str, bool | None]:
    """HEAD of the repository nerkit runs from, and whether tracked files differ from it."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return "unknown", None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip(), bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return "unknown", None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_info() -> dict:
    commit, dirty = git_commit()
    if os.environ.get("NERKIT_GIT_COMMIT"):  # a copied tree, whose .git (if any) may not match it
        commit, dirty = os.environ["NERKIT_GIT_COMMIT"], None
    return {"git_commit": commit, "git_dirty": dirty, "nerkit_version": __version__, "hostname": socket.gethostname(),
            "cpu": cpu_model(), "cpu_count": os.cpu_count(), "python": platform.python_version()}


def open_simulation(config_path: str | Path, overrides: list[str], out: Path, resume: bool, device: str | None,
                    own: Callable[[Path], bool], what: str):
    """The start of a benchmark that simulates in-process (`bench loop`, `bench grow`): OUT checked
    (written again only when resumed, and only if `own` says it is the command's earlier output,
    which `what` names), then the config loaded, with `device` in place of train.device."""
    check_output_directory(out, resume, own=own, inputs=[config_path], what=what)
    config = load_config(config_path, overrides)
    return config if device is None else replace(config, train=replace(config.train, device=device))


def recorded(results: Path, resume: bool, key: Callable[[dict], tuple], what: str) -> set:
    """The keys of the records in `results` that a resumed simulation skips (none when not resumed)."""
    return {key(r) for _, r in read_json_lines(results, what)} if resume and results.is_file() else set()


def failure_message(returncode: int, log_text: str) -> str:
    """`killed by SIGKILL (...)` or `exit code N`, then the last lines of the run's log."""
    if returncode < 0:
        head = killed_by(returncode)
    elif returncode == 0:
        head = "the worker exited without writing its result"
    else:
        head = f"exit code {returncode}"
    lines = [line for line in log_text.splitlines() if line.strip()][-ERROR_LINES:]
    return "\n".join([head] + lines)


def worker_env(jobs: int) -> dict:
    """The environment of a worker. With several runs at once, each run's torch gets its share of the
    cores by default (OMP_NUM_THREADS, which `train.threads: 0` follows) instead of all of them."""
    env = dict(os.environ)
    if jobs > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    return env


def with_env(base: dict[str, str], env: dict[str, str | None]) -> dict[str, str]:
    """`base` with `env` applied: a value sets its variable, None unsets it (a matrix's `env:`, or
    `nerkit bench predict --env`)."""
    merged = dict(base)
    for name, value in env.items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
    return merged


def run_env(jobs: int, env: dict[str, str | None]) -> dict:
    """A run's worker environment: `worker_env`, then the matrix's `env:`."""
    return with_env(worker_env(jobs), env)


def continuation(run: MatrixRun, run_dir: Path) -> tuple[bool, str]:
    """Whether `run` can go on from the checkpoint in its model directory: there is one, and the
    config the matrix gives the run now differs from the one saved there only in what
    `nerkit train --resume` may change (train limits, threads, device). With it, why not where
    there is a checkpoint (the keys that changed), or "" where there is none."""
    if not (run_dir / CHECKPOINT / "state.json").is_file():
        return False, ""
    try:
        saved = load_config(run_dir / CONFIG_FILE)
    except UserError as e:
        return False, f"the config saved with its checkpoint cannot be read ({e.message})"
    changed = run_differences(saved, load_config(run.config, run.overrides),  # loads: check_configs ran first
                              distilled=bool(run.teachers))
    return not changed, ("what it trains changed since its checkpoint: " + "; ".join(changed)) if changed else ""


def run_record(run: MatrixRun, base: dict) -> dict:
    """What a run's record says before it runs: the run, the machine and commit, the date; a
    student's teachers (run names) and texts."""
    record = {"name": run.name, "run": run.group, "dataset": run.dataset, "seed": run.seed, "config": run.config,
              "overrides": run.overrides, "nproc": run.nproc, "env": run.env, **base,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if run.teachers:
        record.update({"teachers": run.teachers, "text": run.texts, "train_text": run.train_text})
    if run.prepare:
        record["prepare"] = run.prepare
    return record


def prepare(run: MatrixRun, log_file, env: dict) -> int:
    """Run the run's `prepare:` commands in order (${BENCH_OUT} and the like interpolated as a
    config's paths are), their output in the run's log; the first failure's exit code, else 0. They
    write under ${BENCH_OUT}/prepared/, made here."""
    (Path(os.environ[BENCH_OUT]) / PREPARED).mkdir(exist_ok=True)
    for command in run.prepare:
        args = shlex.split(interpolate(command, f"{run.name}: prepare"))
        log_file.write(f"$ nerkit {shlex.join(args)}\n")
        log_file.flush()
        returncode = WORKERS.run([sys.executable, "-m", "nerkit", *args], stdin=subprocess.DEVNULL, stdout=log_file,
                                 stderr=subprocess.STDOUT, env=env)
        if returncode:
            return returncode
    return 0


def student_of_failed(run: MatrixRun, out: Path, base: dict, failed: list[str]) -> dict:
    """The record of a student not trained because teachers of it failed (their records say why)."""
    error = (f"not trained: its teacher{'s' if len(failed) > 1 else ''} {', '.join(failed)} failed "
             f"(see {'their records' if len(failed) > 1 else 'its record'} in {out / RESULTS})")
    log_path = out / "logs" / f"{run.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(error + "\n", encoding="utf-8")
    return {**run_record(run, base), "status": "failed", "error": error, "failed_teachers": failed}


def same_run(record: dict | None, run: MatrixRun) -> bool:
    """Whether `record` is of `run` as the matrix gives it now (config, overrides, teachers, texts)."""
    return record is not None and (
        (record.get("config"), record.get("overrides"), record.get("teachers", []), record.get("text", []),
         record.get("train_text", False)) == (run.config, run.overrides, run.teachers, run.texts, run.train_text))


def execute(run: MatrixRun, out: Path, predict_batch_size: int, base: dict, previous: dict | None = None) -> dict:
    """Train and measure one run in a worker process; a failure becomes a `failed` record.
    `previous`: go on from the run's checkpoint instead of starting over; the record it continues
    (or {}), whose wall time is added to this session's and whose memory peaks count."""
    run_dir, log_path = out / "runs" / run.name, out / "logs" / f"{run.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    record = run_record(run, base)
    if not Path(run.config).is_file():
        error = f"config file not found: {run.config}"
        log_path.write_text(error + "\n", encoding="utf-8")
        return {**record, "status": "failed", "error": error}
    result_path = run_dir / WORKER_RESULT
    result_path.unlink(missing_ok=True)  # a stale result must not pass for this run's
    resume = previous is not None
    spec = {"config": run.config, "overrides": run.overrides, "out": str(run_dir),
            "predict_batch_size": predict_batch_size, "resume": resume, "nproc": run.nproc, "env": sorted(run.env),
            "teachers": [str(out / "runs" / t) for t in run.teachers], "texts": run.texts,
            "train_text": str(out / TEXTS / f"{run.name}.train.txt") if run.train_text else None}
    commits = record_session(log_path.with_suffix(".sessions.jsonl"), record, previous)
    if not resume and log_path.is_file():  # the log of the run this one starts over keeps its own file
        log_path.replace(log_path.with_suffix(".previous.log"))
    started = time.perf_counter()
    with open(log_path, "a" if resume else "w", encoding="utf-8") as log_file:
        if resume:
            log_file.write(f"\n--- nerkit bench --resume {record['date']}: continuing from {run_dir / CHECKPOINT} ---\n")
            log_file.flush()
        env = run_env(base.get("jobs") or 1, run.env)
        returncode = prepare(run, log_file, env)
        if not returncode:
            returncode = WORKERS.run([sys.executable, "-m", "nerkit.tools.bench.worker", json.dumps(spec)],
                                     stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    record["wall_s"] = time.perf_counter() - started
    if resume:
        record["wall_s"] += previous.get("wall_s", 0.0)
        record["continued"] = previous.get("continued", 0) + 1
        record["session_commits"] = commits
    if returncode == 0 and result_path.is_file():
        result = json.loads(result_path.read_text(encoding="utf-8"))
        for key in ("peak_rss_mib", "peak_cuda_mib"):  # the peaks of every session of the run
            peaks = [v for v in (result.get(key), (previous or {}).get(key)) if v is not None]
            result[key] = max(peaks) if peaks else None
        # the fixed cost: the worker's whole process but its training steps and the timed prediction
        # pass (start-up, reading, vocabularies, evaluation, writing), beside the steady rate
        fixed = record["wall_s"] - result["train_steps_s"] - result["predict_s"] if not resume else None
        return {**record, "status": "ok", **result, "fixed_s": fixed}
    error = failure_message(returncode, log_path.read_text(encoding="utf-8", errors="replace"))
    failed = {**record, "status": "failed", "exit_code": returncode, "error": error}
    if resume:  # a failed continuation keeps the figures of the run's last good record
        last_ok = previous if previous.get("status") == "ok" else previous.get("last_ok")
        if last_ok:
            failed["last_ok"] = last_ok
    return failed


ROUND_FIGURES = ("train_chars_per_s_steady", "train_chars_per_s", "predict_chars_per_s", "fixed_s", "wall_s")


def execute_rounds(run: MatrixRun, out: Path, predict_batch_size: int, base: dict, previous: dict | None = None) -> dict:
    """`execute` the run `run.rounds` times over (a run continued from its checkpoint: once); the
    last round's record, with each round's speed (`rounds`) and their min/median/max (`spread`).
    A failed round is the run's record."""
    if run.rounds == 1 or previous is not None:
        return execute(run, out, predict_batch_size, base, previous)
    figures, wall = [], 0.0
    for number in range(1, run.rounds + 1):
        record = execute(run, out, predict_batch_size, base)
        if record["status"] != "ok":
            return {**record, "error": f"round {number} of {run.rounds}: {record['error']}"}
        figures.append({"round": number, **{k: record.get(k) for k in ROUND_FIGURES}})
        wall += record["wall_s"]
    return {**record, "wall_s": wall, "rounds": figures,
            "spread": {k: spread([f[k] for f in figures]) for k in ROUND_FIGURES if k != "wall_s"}}


def record_session(path: Path, record: dict, previous: dict | None) -> list[str]:
    """Add this `nerkit bench` session to the run's sessions file before it trains, so that a session
    killed outright (which leaves no record) is still named; returns the commit of each session of
    the run, oldest first. A fresh run starts the file; a run begun before the file existed starts it
    from its last record's list (where a session that left no record is "unknown")."""
    sessions = []
    if previous is not None:
        if path.is_file():
            sessions = [record for _, record in read_json_lines(path, "a session record")]
        else:
            sessions = [{"commit": c} for c in previous.get("session_commits")
                        or [previous.get("git_commit", "unknown")]]
    sessions.append({"commit": record.get("git_commit", "unknown"), "date": record["date"]})
    atomic_write_text(path, "".join(json.dumps(entry) + "\n" for entry in sessions))
    return [entry["commit"] for entry in sessions]


def _summary(record: dict) -> str:
    if record["status"] != "ok":
        stopped = record.get("exit_code") in STOPPED_CODES
        return ("stopped, its checkpoint saved: " if stopped else "FAILED: ") + short_error(record["error"])
    return (f"ok  test F1 {100 * record['test']['f1']:.2f}  dev F1 {100 * record['dev']['f1']:.2f}  "
            f"{record['wall_s']:.0f} s") if record.get("test") else f"ok  dev F1 {100 * record['dev']['f1']:.2f}"


def check_configs(runs: list[MatrixRun]) -> None:
    """Load every run's config with its overrides applied, as its worker will: a missing file, a
    misspelt key or a bad value is one error naming the run, before anything starts."""
    for run in runs:
        try:
            load_config(run.config, run.overrides)
            for text in run.texts:
                check_input(text, "text", "no such file", fix="check the path (and NERKIT_DATA); "
                            "`make pd1998` writes lm/text/pd199801.txt")
        except UserError as e:
            raise UserError(f"run {run.name}: {e.message}", where=e.where, fix=e.fix) from None


def plan(runs: list[MatrixRun], out: Path, records: dict, resume: bool) -> list[tuple[str, MatrixRun, dict | None]]:
    """The runs to train, in order, each with the record it continues from its checkpoint (or None):
    with `resume`, a run recorded ok as it is now is skipped, unless a teacher of it trains again."""
    todo, names = [], set()
    for i, run in enumerate(runs, 1):
        step = f"[{i}/{len(runs)}] {run.name}"
        done = records.get(run.name) if resume else None
        again = [t for t in run.teachers if t in names]
        if done and done["status"] == "ok" and same_run(done, run) and not again:
            log.info(f"{step}: skipped, recorded as ok in {out / RESULTS}")
            continue
        previous = None
        go_on, why_not = continuation(run, out / "runs" / run.name) if resume else (False, "")
        if go_on and again:
            why_not = f"its teacher {', '.join(again)} trains again"
        elif go_on:
            previous = done or {}
            log.info(f"{step}: continuing from its checkpoint")
        if why_not:
            log.info(f"{step}: starting over, {why_not}")
        elif done and done["status"] == "ok":
            log.info(f"{step}: its config, overrides, teachers or text changed since it was recorded; running it again")
        todo.append((step, run, previous))
        names.add(run.name)
    return todo


# A worker's exit codes when SIGINT or SIGTERM stopped its training after a checkpoint was written
# (training.loop.Interrupted): somebody asked the benchmark to stop, so no further run starts.
STOPPED_CODES = {128 + signum: signum for signum in STOP_SIGNALS}


def run_in_order(todo: list, jobs: int, one, records: dict, teachers_failed, stopped=lambda: False) -> None:
    """Up to `jobs` runs of `todo` at once (`one(step, run, previous)`), each started once its
    teachers among them have finished; a run with a teacher not recorded ok is handed to
    `teachers_failed(step, run, names)` instead. Once `stopped()` is true, no further run starts
    (those running finish)."""
    pending, running, finished = list(todo), {}, set()
    names = {run.name for _, run, _ in todo}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        while pending or running:
            if stopped():
                pending.clear()
            for job in list(pending):
                step, run, _ = job
                if len(running) >= jobs:
                    break
                if any(t in names and t not in finished for t in run.teachers):
                    continue  # a teacher of it is still to train or training
                pending.remove(job)
                failed = [t for t in run.teachers if records.get(t, {}).get("status") != "ok"]
                if failed:
                    teachers_failed(step, run, failed)
                    finished.add(run.name)
                    continue
                running[pool.submit(one, *job)] = run.name
            if running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    future.result()
                    finished.add(running.pop(future))


def run_bench(matrix_path: str | Path, out: str | Path | None = None, quick: bool = False, only: list[str] = (),
              resume: bool = False, device: str | None = None, markdown_only: bool = False, sets: list[str] = (),
              seeds: list[int] | None = None, jobs: int = 1, rounds: int | None = None) -> tuple[str, int]:
    """Run the matrix (or, with `markdown_only`, only rebuild the table); returns the Markdown table
    and the number of this matrix's runs that failed. Up to `jobs` runs train at once, each in its
    own process. Each finished run is written to DIR/results.jsonl at once, replacing an earlier
    record of the same name."""
    if jobs < 1:
        raise UserError(f"--jobs must be at least 1, not {jobs}")
    matrix = load_matrix(matrix_path, quick, device, sets, seeds, rounds)
    out = Path(out) if out else Path("bench-out") / matrix.path.stem
    os.environ[BENCH_OUT] = str(out.resolve())  # for ${BENCH_OUT} in prepare: commands and overrides
    records = read_results(out)
    runs = select_runs(matrix.runs, list(only))
    if not markdown_only:
        by_name = {r.name: r for r in matrix.runs}

        def ready(name: str) -> bool:  # a teacher that --only left out: its model from an earlier session
            return (records.get(name, {}).get("status") == "ok" and same_run(records[name], by_name[name])
                    and (out / "runs" / name / "model.safetensors").is_file())

        runs, added = with_teachers(runs, matrix.runs, ready)
        for name in added:
            log.info(f"also running {name}: a student of --only learns from it, and {out} has no model of it")
        check_configs(runs)  # before anything is created or any worker starts
    if markdown_only:
        if not records:
            raise UserError(f"no {RESULTS} to build the table from", where=str(out),
                            fix="run the matrix first, or pass the --out of an earlier run")
    else:
        # bench adds to its own directory (a record per run name), and to no other
        check_output_directory(out, True, own=is_bench_dir, inputs=[matrix.path], what="a benchmark's directory")
        out.mkdir(parents=True, exist_ok=True)
        base = {**host_info(), "quick": quick, "jobs": jobs}
        todo = plan(runs, out, records, resume)
        lock, stops = threading.Lock(), []  # the runs a signal stopped

        def one(step: str, run: MatrixRun, previous: dict | None) -> None:
            log.info(f"{step}: running (log: {out / 'logs' / run.name}.log)")
            record = execute_rounds(run, out, matrix.predict_batch_size, base, previous)
            keep(step, run, record)

        def keep(step: str, run: MatrixRun, record: dict) -> None:
            with lock:
                records[run.name] = record
                write_results(out, records)
                if record.get("exit_code") in STOPPED_CODES:
                    stops.append((run.name, STOPPED_CODES[record["exit_code"]]))
            log.info(f"{step}: {_summary(record)}")

        with WORKERS.signals_passed_on():
            run_in_order(todo, jobs, one, records, lambda step, run, failed: keep(
                step, run, student_of_failed(run, out, base, failed)), stopped=lambda: bool(stops) or WORKERS.signum is not None)
    table = render_markdown(list(records.values()), matrix.anchors, title=f"nerkit benchmark: {matrix.path}")
    atomic_write_text(out / TABLE, table)
    if not markdown_only and (stops or WORKERS.signum):
        then = f"Continue with: nerkit bench --matrix {matrix_path} --out {out} --resume"
        if stops:
            name, signum = stops[0]
            raise Interrupted(f"benchmark stopped: {signal.Signals(signum).name} stopped run {name} (its checkpoint "
                              f"saved) and no further run started. {then}", signum)
        raise Interrupted(f"benchmark stopped by {signal.Signals(WORKERS.signum).name} between runs; no further run "
                          f"started. {then}", WORKERS.signum)
    failed = sum(1 for r in runs if records.get(r.name, {}).get("status") == "failed")
    return table, failed
