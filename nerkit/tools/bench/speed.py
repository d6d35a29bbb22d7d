"""Speed of whole commands, in the spirit of `spacy benchmark speed` (`nerkit bench predict`,
`nerkit bench export`; `serve_load.py` has `nerkit bench serve`, `label_studio.py` `nerkit bench
label-studio`): each round times a fresh process of the command as a user runs it; the record (each
round, min/median/max, the command, commit, date and machine) goes to OUT/results.jsonl, replacing
an earlier record of its name, and OUT/RESULTS.md."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from nerkit.data.records import read_text
from nerkit.errors import UserError
from nerkit.files import atomic_write_text, check_output_directory
from nerkit.inference.model_dir import ModelDir
from nerkit.tools.bench.report import spread, spread_text
from nerkit.tools.bench.runner import TABLE, host_info, is_bench_dir, read_results, with_env, write_results

ERROR_LINES = 5  # of a failed command's stderr, in its error


@dataclass
class Timed:
    """One round: the process's wall seconds, its peak resident memory (MiB, its children's
    included as the kernel counts them) and what it wrote on stderr."""
    seconds: float
    peak_rss_mib: float
    stdout: str


def invocation() -> str:
    """The `nerkit ...` command line of this process, as a record names it."""
    return shlex.join(["nerkit", *sys.argv[1:]])


def shown(command: list[str]) -> str:
    """A `python -m nerkit` command line as a user types it: `nerkit ...`."""
    if command[:3] == [sys.executable, "-m", "nerkit"]:
        command = ["nerkit", *command[3:]]
    return shlex.join(command)


def parse_env(items: list[str]) -> dict[str, str | None]:
    """`--env KEY=VALUE` options (`KEY=`: unset KEY in the timed process)."""
    env = {}
    for item in items:
        name, equals, value = item.partition("=")
        if not equals or not name:
            raise UserError(f"--env {item!r} is not KEY=VALUE", fix="e.g. --env OMP_WAIT_POLICY=PASSIVE "
                            "(KEY= unsets it)")
        env[name] = value or None
    return env


def environment(env: dict[str, str | None]) -> dict:
    """This process's environment with `env` applied (None unsets a variable)."""
    return with_env(dict(os.environ), env)


def time_process(command: list[str], env: dict[str, str | None]) -> Timed:
    """Run `command` to its end; a failure is a UserError with the end of its stderr."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=environment(env))
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = (f.read().decode("utf-8", errors="replace") for f in (out, err))
    if process.returncode:
        tail = " | ".join(line for line in stderr.splitlines() if line.strip())[-600:]
        raise UserError(f"`{shown(command)}` ended with exit code {process.returncode}: {tail}")
    return Timed(seconds, usage.ru_maxrss / 1024, stdout)  # KiB on Linux


def nerkit_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "nerkit", "--quiet", *args]


def summarise(kind: str, name: str, command: list[str], rounds: list[dict], settings: dict) -> dict:
    """A speed record: what ran and where, each round's figures and their min/median/max."""
    figures = [k for k, v in rounds[0].items() if k != "round" and isinstance(v, (int, float))]
    return {"name": name, "kind": kind, "command": invocation(), "timed": shown(command), **settings,
            **host_info(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "rounds": rounds, "spread": {k: spread([r[k] for r in rounds]) for k in figures}}


def prepare_out(out: Path, *inputs: Path) -> None:
    """OUT holds only speed records (a new directory, or one this command wrote)."""
    check_output_directory(out, True, own=is_bench_dir, inputs=inputs, what="a benchmark's directory")
    out.mkdir(parents=True, exist_ok=True)


def save(out: Path, record: dict) -> str:
    """Add `record` to OUT/results.jsonl (replacing its name's earlier one), rewrite OUT/RESULTS.md;
    returns the table."""
    records = read_results(out)
    records[record["name"]] = record
    write_results(out, records)
    table = render_speed(list(records.values()))
    atomic_write_text(out / TABLE, table)
    return table


# The columns of each kind's table: (heading, figure, digits).
COLUMNS = {
    "predict": [("chars/s", "chars_per_s", 0), ("wall s", "seconds", 2), ("start-up s", "startup_s", 2),
                ("steady chars/s", "steady_chars_per_s", 0), ("peak RSS MiB", "peak_rss_mib", 0),
                ("worker RSS MiB", "worker_rss_mib", 0), ("all RSS MiB", "total_rss_mib", 0)],
    "export": [("export s", "seconds", 2), ("size MiB", "size_mib", 2), ("peak RSS MiB", "peak_rss_mib", 0),
               ("model F1", "model_f1", 2), ("export F1", "export_f1", 2), ("model eval s", "model_eval_s", 2),
               ("export eval s", "export_eval_s", 2), ("export eval RSS MiB", "export_eval_rss_mib", 0)],
    "serve": [("requests/s", "requests_per_s", 1), ("chars/s", "chars_per_s", 0), ("p50 ms", "p50_ms", 1),
              ("p95 ms", "p95_ms", 1)],
    "label-studio": [("loop s", "loop_s", 1), ("to job start s", "to_start_s", 1), ("job s", "job_s", 1),
                     ("to prediction s", "to_prediction_s", 2), ("idle p50 ms", "idle_p50_ms", 1),
                     ("training p50 ms", "training_p50_ms", 1), ("training p95 ms", "training_p95_ms", 1),
                     ("held-out F1", "heldout_f1", 2)],
}
SETTINGS = {"predict": ("engine", "runtime", "workers", "threads", "env"), "export": ("format", "int8"),
            "serve": ("requests", "concurrency", "seconds", "threads", "workers"),
            "label-studio": ("tasks", "batch", "trigger")}


def _cell(value) -> str:
    """A setting in a table cell: an env mapping as KEY=VALUE words (KEY= where it is unset)."""
    if isinstance(value, dict):
        return " ".join(f"{k}={v or ''}" for k, v in value.items()) or "–"
    return "–" if value is None else str(value)


def render_speed(records: list[dict], level: int = 2) -> str:
    """One table per kind of command, each under a heading of `level`: each figure as min / median /
    max over the rounds."""
    lines = ["# nerkit speed benchmarks", ""]
    for kind, columns in COLUMNS.items():
        mine = [r for r in records if r.get("kind") == kind]
        if not mine:
            continue
        # a figure no record measured (records written before it was) gets no column
        columns = [c for c in columns if any(c[1] in r["spread"] for r in mine)]
        settings = [s for s in SETTINGS[kind] if any(s in r for r in mine)]  # likewise a setting (engine)
        header = ["Name", "Model", *settings, "Rounds", *(c[0] for c in columns), "Commit", "Date"]
        lines += [f"{'#' * level} nerkit {kind}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r in mine:
            commit = r["git_commit"][:10] + ("-dirty" if r.get("git_dirty") else "")
            cells = [r["name"], r["model"], *(_cell(r.get(s)) for s in settings), str(len(r["rounds"])),
                     *(spread_text(r["spread"].get(key), digits) for _, key, digits in columns), commit, r["date"][:10]]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    machines = sorted({f"{r['hostname']} ({r['cpu']}, {r['cpu_count']} cores)" for r in records})
    lines += ["Figures: min / median / max over the rounds, each a fresh process (the timed command of each "
              "record is in results.jsonl). Machines: " + "; ".join(machines) + "."]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- nerkit bench predict


@dataclass
class PredictOptions:
    """The `nerkit predict` options a benchmark passes on."""
    runtime: str = "auto"
    workers: int = 1
    threads: int = 0
    batch_size: int = 64
    device: str = "cpu"
    env: dict[str, str | None] = field(default_factory=dict)
    engine: str | None = None  # ray, spark or dask: that engine's run (engine_run.py) instead of nerkit predict

    def arguments(self) -> list[str]:
        return ["--runtime", self.runtime, "--workers", str(self.workers), "--threads", str(self.threads),
                "--batch-size", str(self.batch_size), "--device", self.device]


def text_chars(text: Path) -> int:
    """The characters `nerkit predict` reads from a text file, line ends not counted."""
    if not text.is_file():
        raise UserError("text file not found", where=str(text))
    return sum(len(line.rstrip("\r")) for line in read_text(text).split("\n"))  # every line, as predict reads them


def check_subject(model: Path, rounds: int) -> None:
    """What every timing subcommand needs: a model directory and at least one round."""
    if rounds < 1:
        raise UserError(f"--rounds must be at least 1, not {rounds}")
    if not model.is_dir():
        raise UserError("model directory not found", where=str(model))


def bench_predict(model: Path, text: Path, out: Path, options: PredictOptions, rounds: int,
                  name: str | None = None) -> tuple[str, dict]:
    """Time `rounds` whole `nerkit predict` processes over `text` (start-up and loading included):
    chars/s (the text's characters over the wall seconds) and peak RSS; the record and the table.
    Each round also times the same command over an empty text, its fixed cost (`startup_s`: the
    interpreter, the imports, loading the model, writing nothing), and gives the rate beside it
    (`steady_chars_per_s`: the characters over the seconds the text itself added)."""
    check_subject(model, rounds)
    chars = text_chars(text)
    prepare_out(out, model, text)
    if options.engine is not None:
        return bench_engine(model, text, chars, out, options, rounds, name)
    command = nerkit_command("predict", "--model", str(model), str(text), "--output", os.devnull, *options.arguments())
    figures = []
    with tempfile.TemporaryDirectory(prefix="nerkit-bench-predict-") as scratch:
        empty = Path(scratch) / "empty.txt"
        empty.write_bytes(b"")
        nothing = [str(empty) if part == str(text) else part for part in command]
        for number in range(1, rounds + 1):
            timed, startup = time_process(command, options.env), time_process(nothing, options.env)
            figures.append({"round": number, "chars_per_s": chars / timed.seconds, "seconds": timed.seconds,
                            "startup_s": startup.seconds,
                            "steady_chars_per_s": chars / max(timed.seconds - startup.seconds, 1e-9),
                            "peak_rss_mib": timed.peak_rss_mib})
    settings = {"model": str(model), "text": str(text), "chars": chars, "runtime": options.runtime,
                "workers": options.workers, "threads": options.threads, "batch_size": options.batch_size,
                "device": options.device, "env": options.env}
    name = name or f"predict_{model.name}_{options.runtime}_w{options.workers}_t{options.threads}"
    record = summarise("predict", name, command, figures, settings)
    return save(out, record), record


# -------------------------------------------------------------------- nerkit bench predict --engine

# Files the text is cut into for an engine, per worker: a directory of files is what the engines read
# in parallel (a file is one task's), and several per worker keep them all busy to the end.
FILES_PER_WORKER = 4


def split_text(text: Path, directory: Path, files: int) -> int:
    """Cut `text` into `files` files of whole lines, about as many lines each, in order
    (DIRECTORY/part-000.txt, ...); returns its lines."""
    lines = read_text(text).split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # after the last line end there is no line
    directory.mkdir(parents=True)
    for k in range(files):
        part = lines[k * len(lines) // files:(k + 1) * len(lines) // files]
        (directory / f"part-{k:03d}.txt").write_text("".join(line + "\n" for line in part), encoding="utf-8")
    return len(lines)


def bench_engine(model: Path, text: Path, chars: int, out: Path, options: PredictOptions, rounds: int,
                 name: str | None = None) -> tuple[str, dict]:
    """`bench_predict` for a cluster engine: each round a fresh process (engine_run.py) starts the
    engine on this machine with `options.workers` worker processes, makes it ready (`startup_s`),
    tags the text cut into files (`steady_chars_per_s`: its characters over the tagging's seconds)
    and brings every row back; `chars_per_s` is over the whole process, as for nerkit predict. Memory:
    the largest worker's peak and the engine's processes together. A round that loses a line or
    reports a row in error fails."""
    from nerkit.inference.workers import threads_per_worker

    figures = []
    with tempfile.TemporaryDirectory(prefix="nerkit-bench-engine-") as scratch:
        texts = Path(scratch) / "texts"
        lines = split_text(text, texts, FILES_PER_WORKER * options.workers)
        spec = {"engine": options.engine, "model": str(model), "texts": str(texts), "workers": options.workers,
                "threads": threads_per_worker(options.threads, options.workers), "batch_size": options.batch_size}
        command = [sys.executable, "-m", "nerkit.tools.bench.engine_run", json.dumps(spec, ensure_ascii=False)]
        for number in range(1, rounds + 1):
            timed = time_process(command, options.env)
            result = json.loads(timed.stdout.strip().splitlines()[-1])
            if result["rows"] != lines or result["errors"]:
                raise UserError(f"{options.engine} returned {result['rows']:,} rows for {lines:,} lines, "
                                f"{result['errors']:,} in error", where=str(text))
            figures.append({"round": number, "chars_per_s": chars / timed.seconds, "seconds": timed.seconds,
                            "startup_s": result["startup_s"], "steady_chars_per_s": chars / result["tag_s"],
                            "peak_rss_mib": timed.peak_rss_mib, "worker_rss_mib": result["worker_rss_mib"],
                            "total_rss_mib": result["total_rss_mib"]})
    settings = {"model": str(model), "text": str(text), "chars": chars, "lines": lines, "engine": options.engine,
                "runtime": ModelDir.read(model).runtime, "workers": options.workers, "threads": options.threads,
                "batch_size": options.batch_size, "device": "cpu", "env": options.env,
                "files": FILES_PER_WORKER * options.workers}
    name = name or f"predict_{model.name}_{options.engine}_w{options.workers}_t{options.threads}"
    record = summarise("predict", name, command, figures, settings)
    return save(out, record), record


# The engines' target (issue 60): each at least this share of `nerkit predict --workers 2`'s steady rate
# with the same model, on the same machine and text (the start-up is measured apart: it is paid once
# per machine, not per character).
ENGINE_TARGET = 0.85

# A collection the scale table works out the time of, and the machines it is shared among.
COLLECTION_CHARS = 10**9
MACHINES = (1, 10, 100)


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def scale_table(records: list[dict]) -> str:
    """docs/scale.md's table from `nerkit bench predict` records (with and without --engine) over one
    text: for each model, every run's median steady rate and start-up, the engines' rate as a share of
    `nerkit predict --workers 2`'s (whole process and steady; the steady one against ENGINE_TARGET), the largest
    worker's memory, and the time COLLECTION_CHARS take on MACHINES machines of this kind, each
    starting once and tagging its share at the steady rate (time = start-up + chars / (N x rate))."""
    def median(record: dict, figure: str) -> float | None:
        spread = record["spread"].get(figure)
        return spread["median"] if spread else None

    header = ["model", "run", "workers", "steady chars/s", "start-up s", "share of predict --workers 2 (whole / steady)",
              f"steady ≥ {ENGINE_TARGET}", "worker RSS MiB", *(f"10^{len(str(COLLECTION_CHARS)) - 1} chars, {n} machine"
                                                       + ("s" if n > 1 else "") for n in MACHINES)]
    lines = ["| " + " | ".join(header) + " |", "|---|---|---:|---:|---:|---:|---|---:|" + "---:|" * len(MACHINES)]
    for model in dict.fromkeys(r["model"] for r in records):
        mine = [r for r in records if r["model"] == model and r.get("kind") == "predict"]
        base = next((r for r in mine if not r.get("engine") and r["workers"] == 2), None)
        for r in mine:
            steady, startup = median(r, "steady_chars_per_s"), median(r, "startup_s")
            share, met = "–", "–"
            if base is not None and r.get("engine"):
                whole = median(r, "chars_per_s") / median(base, "chars_per_s")
                rate = steady / median(base, "steady_chars_per_s")
                share, met = f"{whole:.2f} / {rate:.2f}", "yes" if rate >= ENGINE_TARGET else "no"
            memory = median(r, "worker_rss_mib") or median(r, "peak_rss_mib")
            run = r.get("engine") or "nerkit predict"
            times = [_duration(startup + COLLECTION_CHARS / (n * steady)) for n in MACHINES]
            lines.append(f"| {Path(model).name} | {run} | {r['workers']} | {steady:,.0f} | "
                         f"{startup:.1f} | {share} | {met} | {memory:,.0f} | " + " | ".join(times) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- nerkit bench export


def directory_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def evaluated(model: Path, data: Path, prefix: str) -> dict:
    """A whole `nerkit eval --json` process of `model` on the gold file `data`: its F1 (%), wall
    seconds and peak RSS, under names starting with `prefix`."""
    import json

    timed = time_process(nerkit_command("eval", "--model", str(model), "--data", str(data), "--json"), {})
    f1 = json.loads(timed.stdout.strip().splitlines()[-1])["f1"]
    return {f"{prefix}_f1": 100 * f1, f"{prefix}_eval_s": timed.seconds, f"{prefix}_eval_rss_mib": timed.peak_rss_mib}


def bench_export(model: Path, out: Path, fmt: str, quantize: str | None, rounds: int, data: Path | None = None,
                 name: str | None = None) -> tuple[str, dict]:
    """Time `rounds` whole `nerkit export` processes, each into a fresh temporary directory: the
    export's seconds, its size on disk and the process's peak RSS; with `data` (a gold file), also a
    whole `nerkit eval` process of the model and of its export each round (F1, seconds, peak RSS).
    The record and the table."""
    check_subject(model, rounds)
    if data is not None and not data.is_file():
        raise UserError("gold file not found", where=str(data))
    prepare_out(out, model, *([data] if data else []))
    figures = []
    for number in range(1, rounds + 1):
        with tempfile.TemporaryDirectory(prefix="nerkit-bench-export-") as tmp:
            target = Path(tmp) / "export"
            command = nerkit_command("export", "--model", str(model), "--out", str(target), "--format", fmt,
                                     *(["--quantize", quantize] if quantize else []))
            timed = time_process(command, {})
            figures.append({"round": number, "seconds": timed.seconds, "size_mib": directory_mib(target),
                            "peak_rss_mib": timed.peak_rss_mib})
            if data is not None:
                figures[-1].update({**evaluated(model, data, "model"), **evaluated(target, data, "export")})
    settings = {"model": str(model), "format": fmt, "int8": quantize == "int8", "quantize": quantize,
                "data": str(data) if data else None, "model_mib": directory_mib(model)}
    name = name or f"export_{model.name}_{fmt}" + (f"_{quantize}" if quantize else "")
    record = summarise("export", name, command, figures, settings)
    return save(out, record), record
