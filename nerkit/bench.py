"""Batch benchmarking (`nerkit bench`): train every run of a matrix file, each in its own worker
process so that a crash or an out-of-memory kill ends only that run, and collect accuracy, speed
and memory into `DIR/results.jsonl` and a Markdown table beside the published figures.

The parent reads YAML and starts processes; only the worker (`python -m nerkit.bench --worker
SPEC`) imports torch and trains, through the same `train()` as `nerkit train`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

import yaml

from nerkit import __version__
from nerkit.config import load_config, read_yaml, same_run
from nerkit.errors import UserError
from nerkit.files import CHECKPOINT, atomic_write_text

MATRIX_KEYS = ("runs", "quick", "anchors", "predict_batch_size")
RUN_KEYS = ("name", "config", "dataset", "overrides", "seeds", "quick")
REQUIRED_RUN_KEYS = ("name", "config", "dataset")
DATASET_KEYS = ("name", "note", "anchors")
ANCHOR_KEYS = ("encoder", "test_f1", "model", "paper", "setting", "note")
DEVICES = ("cpu", "cuda", "auto")
RESULTS = "results.jsonl"
TABLE = "RESULTS.md"
WORKER_RESULT = "bench.json"  # written by the worker into its model directory
ERROR_LINES = 20  # of a failed run's log, kept in its record
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a run name is a directory and a file name


@dataclass
class Run:
    name: str  # e.g. msra_bilstm_s1: names the model directory and the log
    group: str  # the matrix entry; its seeds form one row of the table
    dataset: str
    config: str
    overrides: list[str]  # everything applied to the config, in order: entry, quick, seed, device
    seed: int | None


@dataclass
class Matrix:
    path: Path
    runs: list[Run]
    anchors: dict  # dataset -> {"name", "note", "anchors": [...]}, see configs/bench/anchors.yaml
    predict_batch_size: int


# ------------------------------------------------------------------------------------ matrix file


def _check_keys(values, allowed, where: str, source: Path) -> None:
    if not isinstance(values, dict):
        raise UserError(f"{where} must be a mapping", where=str(source))
    for key in values:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.5)
            fix = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(allowed)}"
            raise UserError(f"unknown key {key!r} in {where}", where=str(source), fix=fix)


def _overrides(values, where: str, source: Path) -> list[str]:
    from nerkit.config import Config, parse_override

    if values is None:
        return []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise UserError(f"{where} must be a list of section.key=value strings", where=str(source))
    sections = {f.name for f in fields(Config)}
    for text in values:
        try:
            path, _ = parse_override(text)
        except UserError as e:
            raise UserError(f"{where}: {e}", where=str(source)) from None
        if path[0] not in sections:
            raise UserError(f"{where}: unknown section {path[0]!r} in {text!r}", where=str(source),
                            fix=f"sections: {', '.join(sorted(sections))}")
    return list(values)


def load_anchors(path: str | Path) -> dict:
    """Published figures by dataset (configs/bench/anchors.yaml), checked as strictly as a matrix."""
    path = Path(path)
    raw = read_yaml(path, "anchors file") or {}
    if not isinstance(raw, dict):
        raise UserError("the anchors file must map dataset names to their figures", where=str(path))
    anchors = {}
    for dataset, entry in raw.items():
        _check_keys(entry, DATASET_KEYS, f"dataset {dataset!r}", path)
        items = entry.get("anchors") or []
        if not isinstance(items, list):
            raise UserError(f"{dataset}.anchors must be a list", where=str(path))
        for i, anchor in enumerate(items):
            _check_keys(anchor, ANCHOR_KEYS, f"{dataset}.anchors[{i}]", path)
            if not isinstance(anchor.get("test_f1"), (int, float)) or not anchor.get("model"):
                raise UserError(f"{dataset}.anchors[{i}] needs model and a numeric test_f1", where=str(path))
        anchors[str(dataset)] = {**entry, "anchors": items}
    return anchors


def parse_seeds(text: str | None) -> list[int] | None:
    """`--seeds 1,2,3` -> [1, 2, 3]; None stays None (the matrix's own seeds)."""
    if text is None:
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"--seeds {text!r} is not a comma-separated list of integers", fix="e.g. --seeds 1,2,3") from None


def load_matrix(path: str | Path, quick: bool = False, device: str | None = None, sets: list[str] = (),
                seeds: list[int] | None = None) -> Matrix:
    """Read and check a matrix file, and expand it into runs (one per seed) with their overrides.
    `sets` (from `--set`) are applied to every run after its own overrides; `seeds` (from `--seeds`)
    replaces every entry's seeds."""
    path = Path(path)
    raw = read_yaml(path, "matrix file")
    _check_keys(raw, MATRIX_KEYS, "the matrix", path)
    if device is not None and device not in DEVICES:
        raise UserError(f"unknown --device {device!r}", fix=f"use one of {', '.join(DEVICES)}")
    sets = _overrides(list(sets), "--set", Path("the command line"))
    entries = raw.get("runs")
    if not isinstance(entries, list) or not entries:
        raise UserError("the matrix needs `runs:`, a non-empty list", where=str(path))
    batch_size = raw.get("predict_batch_size", 64)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise UserError("predict_batch_size must be a positive integer", where=str(path))
    if raw.get("anchors") is not None and not isinstance(raw["anchors"], str):
        raise UserError("anchors must be the path of an anchors file", where=str(path))
    shared_quick = _overrides(raw.get("quick"), "quick", path)
    if quick and "quick" not in raw and not any(isinstance(e, dict) and "quick" in e for e in entries):
        raise UserError("--quick, but the matrix has no quick: overrides", where=str(path),
                        fix="add a top-level quick: list (see configs/bench/quick.yaml)")
    runs: list[Run] = []
    for i, entry in enumerate(entries):
        where = f"runs[{i}]"
        _check_keys(entry, RUN_KEYS, where, path)
        for key in REQUIRED_RUN_KEYS:
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise UserError(f"{where} needs {key}: (a string)", where=str(path))
        group = entry["name"]
        if not NAME.match(group):
            raise UserError(f"{where}: name {group!r} may hold only letters, digits, '_', '.' and '-'",
                            where=str(path))
        overrides = _overrides(entry.get("overrides"), f"{where}.overrides", path)
        own_quick = _overrides(entry.get("quick"), f"{where}.quick", path)
        if quick:
            overrides += shared_quick + own_quick
        run_seeds = list(seeds) if seeds else entry.get("seeds")
        if run_seeds is not None and (
                not isinstance(run_seeds, list) or not run_seeds or len(set(run_seeds)) != len(run_seeds)
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in run_seeds)):
            raise UserError(f"{where}.seeds must be a non-empty list of distinct non-negative integers",
                            where=str(path))
        for seed in run_seeds or [None]:
            name = group if seed is None else f"{group}_s{seed}"
            extra = [] if seed is None else [f"train.seed={seed}"]
            extra += [] if device is None else [f"train.device={device}"]
            runs.append(Run(name, group, entry["dataset"], entry["config"], overrides + sets + extra, seed))
    names = [r.name for r in runs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UserError(f"run names repeat: {', '.join(duplicates)}", where=str(path),
                        fix="give every entry its own name")
    anchors = load_anchors(raw["anchors"]) if raw.get("anchors") else {}
    return Matrix(path, runs, anchors, batch_size)


def select_runs(runs: list[Run], only: list[str]) -> list[Run]:
    """The runs whose name (or entry name) equals or starts with one of `only` (comma lists allowed)."""
    wanted = [w for item in only for w in item.split(",") if w]
    if not wanted:
        return runs
    for w in wanted:
        if not any(r.name.startswith(w) or r.group.startswith(w) for r in runs):
            raise UserError(f"--only {w}: no run of the matrix is named so or starts so",
                            fix=f"runs: {', '.join(r.name for r in runs)}")
    return [r for r in runs if any(r.name.startswith(w) or r.group.startswith(w) for w in wanted)]


# ------------------------------------------------------------------------------------ results


def read_results(out: Path) -> dict[str, dict]:
    """Records of DIR/results.jsonl by run name (a later line of a name replaces an earlier one)."""
    path = out / RESULTS
    records: dict[str, dict] = {}
    if not path.is_file():
        return records
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            records[record["name"]] = record
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError("not a results line", where=f"{path}:{n}") from None
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


def failure_message(returncode: int, log_text: str) -> str:
    """`killed by SIGKILL (...)` or `exit code N`, then the last lines of the run's log."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        head = f"killed by {name}" + (" (out of memory?)" if returncode == -signal.SIGKILL else "")
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


def continuable(run: Run, run_dir: Path) -> bool:
    """Whether `run` can go on from the checkpoint in its model directory: there is one, and the
    config the matrix gives the run now differs from the one saved there only in what
    `nerkit train --resume` may change (train limits, threads, device)."""
    if not (run_dir / CHECKPOINT / "state.json").is_file():
        return False
    try:
        return same_run(load_config(run_dir / "config.yaml"), load_config(run.config, run.overrides))
    except UserError:  # a missing or broken config on either side: nothing to continue safely
        return False


def execute(run: Run, out: Path, predict_batch_size: int, base: dict, previous: dict | None = None) -> dict:
    """Train and measure one run in a worker process; a failure becomes a `failed` record.
    `previous`: go on from the run's checkpoint instead of starting over; the record it continues
    (or {}), whose wall time is added to this session's and whose memory peaks count."""
    run_dir, log_path = out / "runs" / run.name, out / "logs" / f"{run.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    record = {"name": run.name, "run": run.group, "dataset": run.dataset, "seed": run.seed, "config": run.config,
              "overrides": run.overrides, **base, "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if not Path(run.config).is_file():
        error = f"config file not found: {run.config}"
        log_path.write_text(error + "\n", encoding="utf-8")
        return {**record, "status": "failed", "error": error}
    result_path = run_dir / WORKER_RESULT
    result_path.unlink(missing_ok=True)  # a stale result must not pass for this run's
    resume = previous is not None
    spec = {"config": run.config, "overrides": run.overrides, "out": str(run_dir),
            "predict_batch_size": predict_batch_size, "resume": resume}
    started = time.perf_counter()
    with open(log_path, "a" if resume else "w", encoding="utf-8") as log:
        if resume:
            log.write(f"\n--- nerkit bench --resume {record['date']}: continuing from {run_dir / CHECKPOINT} ---\n")
            log.flush()
        proc = subprocess.run([sys.executable, "-m", "nerkit.bench", "--worker", json.dumps(spec)],
                              stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                              env=worker_env(base.get("jobs") or 1))
    record["wall_s"] = time.perf_counter() - started
    if resume:
        record["wall_s"] += previous.get("wall_s", 0.0)
        record["continued"] = previous.get("continued", 0) + 1
    if proc.returncode == 0 and result_path.is_file():
        result = json.loads(result_path.read_text(encoding="utf-8"))
        for key in ("peak_rss_mib", "peak_cuda_mib"):  # the peaks of every session of the run
            peaks = [v for v in (result.get(key), (previous or {}).get(key)) if v is not None]
            result[key] = max(peaks) if peaks else None
        return {**record, "status": "ok", **result}
    error = failure_message(proc.returncode, log_path.read_text(encoding="utf-8", errors="replace"))
    failed = {**record, "status": "failed", "exit_code": proc.returncode, "error": error}
    if resume:  # a failed continuation keeps the figures of the run's last good record
        last_ok = previous if previous.get("status") == "ok" else previous.get("last_ok")
        if last_ok:
            failed["last_ok"] = last_ok
    return failed


def short_error(error: str) -> str:
    """The first line of a failure (how the worker ended) and its last (the error, or where it was)."""
    lines = error.splitlines() or [""]
    return lines[0] if len(lines) == 1 else f"{lines[0]}: {lines[-1]}"


def _summary(record: dict) -> str:
    if record["status"] != "ok":
        return "FAILED: " + short_error(record["error"])
    return (f"ok  test F1 {100 * record['test']['f1']:.2f}  dev F1 {100 * record['dev']['f1']:.2f}  "
            f"{record['wall_s']:.0f} s") if record.get("test") else f"ok  dev F1 {100 * record['dev']['f1']:.2f}"


def run_bench(matrix_path: str | Path, out: str | Path | None = None, quick: bool = False, only: list[str] = (),
              resume: bool = False, device: str | None = None, markdown_only: bool = False, sets: list[str] = (),
              seeds: list[int] | None = None, jobs: int = 1) -> tuple[str, int]:
    """Run the matrix (or, with `markdown_only`, only rebuild the table); returns the Markdown table
    and the number of this matrix's runs that failed. Up to `jobs` runs train at once, each in its
    own process. Each finished run is written to DIR/results.jsonl at once, replacing an earlier
    record of the same name."""
    if jobs < 1:
        raise UserError(f"--jobs must be at least 1, not {jobs}")
    matrix = load_matrix(matrix_path, quick, device, sets, seeds)
    out = Path(out) if out else Path("bench-out") / matrix.path.stem
    runs = select_runs(matrix.runs, list(only))
    records = read_results(out)
    if markdown_only:
        if not records:
            raise UserError(f"no {RESULTS} to build the table from", where=str(out),
                            fix="run the matrix first, or pass the --out of an earlier run")
    else:
        out.mkdir(parents=True, exist_ok=True)
        base = {**host_info(), "quick": quick, "jobs": jobs}
        todo = []
        for i, run in enumerate(runs, 1):
            step = f"[{i}/{len(runs)}] {run.name}"
            done = records.get(run.name) if resume else None
            if done and done["status"] == "ok" and (done.get("config"), done.get("overrides")) == (run.config, run.overrides):
                print(f"{step}: skipped, recorded as ok in {out / RESULTS}", file=sys.stderr)
                continue
            previous = None
            if resume and continuable(run, out / "runs" / run.name):
                previous = done or {}
                print(f"{step}: continuing from its checkpoint", file=sys.stderr)
            elif done and done["status"] == "ok":
                print(f"{step}: its config or overrides changed since it was recorded; running it again",
                      file=sys.stderr)
            todo.append((step, run, previous))
        lock = threading.Lock()

        def one(step: str, run: Run, previous: dict | None) -> None:
            print(f"{step}: running (log: {out / 'logs' / run.name}.log)", file=sys.stderr, flush=True)
            record = execute(run, out, matrix.predict_batch_size, base, previous)
            with lock:
                records[run.name] = record
                write_results(out, records)
            print(f"{step}: {_summary(record)}", file=sys.stderr, flush=True)

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for future in [pool.submit(one, *job) for job in todo]:
                future.result()
    table = render_markdown(list(records.values()), matrix.anchors, title=f"nerkit benchmark: {matrix.path}")
    atomic_write_text(out / TABLE, table)
    failed = sum(1 for r in runs if records.get(r.name, {}).get("status") == "failed")
    return table, failed


# ------------------------------------------------------------------------------------ the table


def _mean_std(values: list[float], scale: float = 100.0) -> str:
    mean = statistics.fmean(values) * scale
    if len(values) > 1:
        return f"{mean:.2f} ± {statistics.stdev(values) * scale:.2f}"
    return f"{mean:.2f}"


def _stopped(runs: list[dict]) -> str:
    """Why training ended, when it was not the configured number of epochs: ' (time budget)' etc."""
    reasons = {r.get("stopped") for r in runs} - {None, "epochs"}
    return f" ({', '.join(sorted(reasons)).replace('_', ' ')})" if reasons else ""


def _published(anchors: dict, dataset: str, encoder: str) -> dict | None:
    """The first anchor of the dataset mapped to the encoder: the one its row is compared with."""
    return next((a for a in anchors.get(dataset, {}).get("anchors", []) if a.get("encoder") == encoder), None)


def _distinct(records: list[dict], key: str) -> str:
    values = sorted({str(r.get(key)) for r in records if r.get(key) is not None})
    return ", ".join(values) if values else "unknown"


def render_markdown(records: list[dict], anchors: dict, title: str = "nerkit benchmark") -> str:
    """The results table (one row per matrix entry, seeds aggregated) with the published figure
    beside nerkit's, then the anchors' sources and the failed runs."""
    ok = [r for r in records if r.get("status") == "ok"]
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r["run"], []).append(r)
    lines = [f"# {title}", ""]
    gpu = any(r.get("peak_cuda_mib") for r in ok)
    if ok:
        commits = sorted({r["git_commit"] + ("-dirty" if r.get("git_dirty") else "") for r in ok})
        days = sorted({r["date"][:10] for r in ok})
        gpus = _distinct(ok, "gpu")
        lines += [f"- nerkit {_distinct(ok, 'nerkit_version')}, commit {', '.join(commits)}; torch "
                  f"{_distinct(ok, 'torch_version')}; device {_distinct(ok, 'device')}"
                  + (f" ({gpus})" if gpus != "unknown" else "") + f"; torch threads {_distinct(ok, 'torch_threads')}",
                  f"- host {_distinct(ok, 'hostname')}: {_distinct(ok, 'cpu')}; "
                  + (days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}")
                  + ("; **quick mode** (a small slice of training: a smoke test, not a result)"
                     if any(r.get("quick") for r in ok) else "")]
        common = [o for o in ok[0].get("overrides", []) if not o.startswith("train.seed=")
                  and all(o in r.get("overrides", []) for r in ok)]
        if common:
            lines.append("- overrides of every run: " + ", ".join(f"`{o}`" for o in common))
        jobs = max(r.get("jobs") or 1 for r in ok)
        if jobs > 1:
            shared = "cores and GPU" if gpu else "cores"
            lines.append(f"- up to {jobs} runs trained at once on this machine (`--jobs {jobs}`): they shared its "
                         f"{shared}, so each run's speed is lower than it would be alone")
        continued = [f"`{r['name']}`" for r in ok if r.get("continued")]
        if continued:
            lines.append(f"- continued from their checkpoints by `nerkit bench --resume`: {', '.join(continued)}; "
                         "their epochs and training chars/s cover all their training, their wall time and peak memory "
                         "every `nerkit bench` session of theirs, their overrides are the last session's")
        lines.append("")
    header = ["Dataset", "Encoder", "Run", "Seeds", "Test P", "Test R", "Test F1", "Published F1", "Δ", "Dev F1",
              "Epochs", "Train chars/s", "Predict chars/s", "Peak RSS MiB"] + (["Peak GPU MiB"] if gpu else []) + ["Wall s"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for group, runs in groups.items():
        good = [r for r in runs if r.get("status") == "ok"]
        if not good:
            continue
        first = good[0]
        test = [r["test"] for r in good if r.get("test")]
        f1 = statistics.fmean(t["f1"] for t in test) * 100 if test else None
        anchor = _published(anchors, first["dataset"], first["encoder"])
        steady = [r["train_chars_per_s_steady"] for r in good]
        encoder = first["encoder"] + (" †" if any(r.get("pretrained") for r in good) else "")
        seeds = f"{len(good)}" if len(good) == len(runs) else f"{len(good)} of {len(runs)}"
        lines.append("| " + " | ".join([
            first["dataset"], encoder, group, seeds,
            _mean_std([t["precision"] for t in test]) if test else "–",
            _mean_std([t["recall"] for t in test]) if test else "–",
            _mean_std([t["f1"] for t in test]) if test else "–",
            f"{anchor['test_f1']:.2f}" if anchor else "–",
            f"{f1 - anchor['test_f1']:+.2f}" if anchor and f1 is not None else "–",
            _mean_std([r["dev"]["f1"] for r in good]),
            f"{statistics.fmean(r['epochs'] for r in good):g}" + _stopped(good),
            # 0 when a run took fewer steps than the warm-up that steady state excludes
            f"{statistics.fmean(steady):,.0f}" if all(steady) else "n/a",
            f"{statistics.fmean(r['predict_chars_per_s'] for r in good):,.0f}",
            f"{max(r['peak_rss_mib'] for r in good):,.0f}",
        ] + ([f"{max(r.get('peak_cuda_mib') or 0 for r in good):,.0f}"] if gpu else []) + [
            f"{statistics.fmean(r['wall_s'] for r in good):,.0f}",
        ]) + " |")
    batch_sizes = _distinct(ok, "predict_batch_size")
    lines += ["",
              "nerkit's runs use random-init embeddings unless the config sets pretrained vectors (rows marked † "
              "do); every published figure below was obtained with pretrained embeddings.",
              "",
              "Test P/R/F1 and dev F1 in %: mean ± sample standard deviation over seeds (± only with more than one "
              "seed); the model is selected on dev and the test set is scored once. Δ = nerkit's test F1 minus "
              "the published one. Train chars/s: steady state (after the first warm-up batches of training). "
              f"Predict chars/s: `Pipeline.predict_tokens` over the test set (dev for a run without one) at batch "
              f"size {batch_sizes}, timed "
              "after one warm-up batch. Peak RSS: the largest over seeds. Wall s: the whole run (training, "
              "evaluation, timing), mean over seeds."]
    datasets = [d for d in dict.fromkeys(r["dataset"] for r in ok) if d in anchors]
    for dataset in datasets:
        entry = anchors[dataset]
        lines += ["", f"Published test F1 on {entry.get('name', dataset)}:"]
        for a in entry["anchors"]:
            if not a.get("encoder"):
                compared = ""
            elif a is _published(anchors, dataset, a["encoder"]):
                compared = f" (in the table beside nerkit's `{a['encoder']}`)"
            else:
                compared = f" (also relevant to nerkit's `{a['encoder']}`)"
            lines.append(f"- {a['model']}: {a['test_f1']:.2f}{compared}; {a.get('paper', '')}; {a.get('setting', '')}"
                         + (f" ({a['note']})" if a.get("note") else ""))
        if entry.get("note"):
            lines.append(f"- {entry['note'].strip()}")
    failed = [r for r in records if r.get("status") != "ok"]
    if failed:
        lines += ["", "Failed runs (the full error is in results.jsonl and logs/NAME.log):"]
        lines += [f"- `{r['name']}`: {short_error(r['error'])}" for r in failed]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ the worker


def config_sha256(config) -> str:
    """sha256 of the resolved config YAML, output directory left out (it names the run, not the setting)."""
    from nerkit.config import config_to_dict

    resolved = config_to_dict(config)
    resolved.pop("output_dir")
    return hashlib.sha256(yaml.safe_dump(resolved, sort_keys=False, allow_unicode=True).encode("utf-8")).hexdigest()


def measure(config_path: str, overrides: list[str], out: str, predict_batch_size: int, resume: bool = False) -> dict:
    """Train one run through `train()` (from its checkpoint in `out` with `resume`), then load the
    saved model, score dev and test once, and time prediction over the test set. Returns the
    figures of a results.jsonl record."""
    import resource

    import torch

    from nerkit.config import config_to_yaml
    from nerkit.evaluate import score
    from nerkit.pipeline import Pipeline
    from nerkit.train import prepare_data, train

    config = load_config(config_path, overrides)
    digest = config_sha256(config)
    data = prepare_data(config)  # read once: training selects on its dev split, and it is scored below
    if resume:  # the model directory keeps explaining itself: its config now has the new limits
        config.output_dir = str(out)
        atomic_write_text(Path(out) / "config.yaml", config_to_yaml(config))
    metrics = train(config, out=out, force=not resume, resume=resume, progress_bar=False, data=data)
    pipe = Pipeline.load(out, device=metrics["device"])
    dev = pipe.evaluate_sentences(data.dev, config.train.eval_batch_size)[0]
    timed = data.test if data.test is not None else data.dev
    tokens = [s.tokens for s in timed]
    pipe.predict_tokens(tokens[:predict_batch_size], predict_batch_size)  # warm-up: allocator, caches
    started = time.perf_counter()
    predicted = pipe.predict_tokens(tokens, predict_batch_size)  # returns Python lists: GPU work is done
    seconds = time.perf_counter() - started
    # evaluate_sentences, split in two so that prediction alone is timed
    test = score([s.spans() for s in data.test], predicted) if data.test is not None else None
    on_gpu = pipe.device.type == "cuda"
    emb = config.embeddings
    return {
        "encoder": config.encoder.name, "config_sha256": digest, "data_sha256": metrics["data_sha256"],
        "test": test, "dev": dev, "epochs": metrics["epochs"], "best_epoch": metrics["best_epoch"],
        "steps": metrics["steps"], "stopped": metrics["stopped"], "partial_epoch": metrics["partial_epoch"],
        "parameters": metrics["parameters"],
        "train_chars_per_s": metrics["train_chars_per_s"],
        "train_chars_per_s_steady": metrics["train_chars_per_s_steady"], "train_s": metrics["elapsed_s"],
        "predict_chars_per_s": sum(map(len, tokens)) / max(seconds, 1e-9), "predict_on": "dev" if data.test is None else "test",
        "predict_batch_size": predict_batch_size,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
        "peak_cuda_mib": torch.cuda.max_memory_allocated() / 2**20 if on_gpu else None,
        "pretrained": bool(emb.char_vectors or emb.bichar_vectors or emb.word_vectors),
        "device": str(pipe.device), "gpu": torch.cuda.get_device_name() if on_gpu else None,
        "torch_version": torch.__version__, "torch_threads": torch.get_num_threads(),
    }


def worker_main(argv: list[str]) -> int:
    """`python -m nerkit.bench --worker SPEC`: SPEC is JSON with config, overrides, out and
    predict_batch_size; the figures go to OUT/bench.json, errors to stderr."""
    if len(argv) != 2 or argv[0] != "--worker":
        print("usage: python -m nerkit.bench --worker SPEC_JSON (started by `nerkit bench`)", file=sys.stderr)
        return 2
    from nerkit.train import Interrupted

    spec = json.loads(argv[1])
    try:
        result = measure(spec["config"], spec["overrides"], spec["out"], spec["predict_batch_size"],
                         spec.get("resume", False))
    except UserError as e:
        print(f"nerkit: error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:  # SIGINT: the run's checkpoint is saved; say so without a traceback
        print(f"nerkit: {e}", file=sys.stderr)
        return 130
    atomic_write_text(Path(spec["out"]) / WORKER_RESULT, json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
