"""The benchmark matrix file (`configs/bench/*.yaml`) and its published anchors: read and checked as
strictly as a config, expanded into runs (entry x seed), and selected with `--only`. A run may set
its process's environment (`env:`), its process count (`nproc:`, data-parallel through torchrun)
and how many times it is measured (`rounds:`). A run that names `teachers:` (other runs of the
matrix) trains as a distilled student (`nerkit distill`) on `text:` files and/or its own training
text (`train_text: true`), after its teachers; `ordered` and `with_teachers` hold that order."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from nerkit.config import DEVICES
from nerkit.errors import UserError, did_you_mean
from nerkit.typed_yaml import interpolate, parse_override, read_yaml, suggest, value_of

MATRIX_KEYS = ("runs", "quick", "anchors", "predict_batch_size", "env", "rounds")


RUN_KEYS = ("name", "config", "dataset", "overrides", "seeds", "quick", "env", "nproc", "rounds", "teachers", "text",
            "train_text", "prepare")


REQUIRED_RUN_KEYS = ("name", "config", "dataset")


DATASET_KEYS = ("name", "note", "anchors")


ANCHOR_KEYS = ("encoder", "test_f1", "model", "paper", "setting", "note")


NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a run name is a directory and a file name


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class MatrixRun:
    name: str  # e.g. msra_bilstm_s1: names the model directory and the log
    group: str  # the matrix entry; its seeds form one row of the table
    dataset: str
    config: str
    overrides: list[str]  # everything applied to the config, in order: entry, quick, seed, device
    seed: int | None
    env: dict[str, str | None] = field(default_factory=dict)  # set in the run's process; None: unset there
    nproc: int = 1  # processes training at once (torchrun, as `nerkit train --nproc`)
    rounds: int = 1  # times the run is trained and measured
    teachers: list[str] = field(default_factory=list)  # run names whose model directories teach this run
    texts: list[str] = field(default_factory=list)  # unlabelled text files (interpolated) a student reads
    train_text: bool = False  # a student also reads its own training split's text
    # nerkit commands (the words after `nerkit`) run in order before the run trains, e.g. the
    # `data match` that writes its training file; ${BENCH_OUT} in them and in the overrides is OUT,
    # and they write under ${BENCH_OUT}/prepared/ (a folder the benchmark owns, so --resume takes OUT)
    prepare: list[str] = field(default_factory=list)


@dataclass
class Matrix:
    path: Path
    runs: list[MatrixRun]
    anchors: dict  # dataset -> {"name", "note", "anchors": [...]}, see configs/bench/anchors.yaml
    predict_batch_size: int


def line_of(source: Path, at: tuple) -> str:
    """`FILE:LINE` of the key (or item) at the path `at` of the YAML file, e.g. ("runs", 1, "nproc");
    `FILE` alone where the path is not found (the value came from elsewhere)."""
    import yaml

    try:
        node = yaml.compose(source.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return str(source)
    line = None
    for step in at:
        if isinstance(node, yaml.MappingNode):
            found = [(k, v) for k, v in node.value if k.value == step]
            if not found:
                return str(source)
            key, node = found[0]
            line = key.start_mark.line
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
            node = node.value[step]
            line = node.start_mark.line
        else:
            return str(source)
    return f"{source}:{line + 1}" if line is not None else str(source)


def _check_keys(values, allowed, where: str, source: Path, at: tuple | None = None) -> None:
    """Every key of the mapping `values` is one of `allowed`; `at`: its path in the file, so that an
    unknown key's error names its line."""
    if not isinstance(values, dict):
        raise UserError(f"{where} must be a mapping", where=str(source))
    for key in values:
        if key not in allowed:
            raise UserError(f"unknown key {key!r} in {where}",
                            where=line_of(source, (*at, key)) if at is not None else str(source),
                            fix=suggest(key, allowed))


def _count(value, key: str, where: str, source: Path, at: tuple, default: int) -> int:
    """A positive integer (`nproc:`, `rounds:`), or `default` where it is not given."""
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(f"{where}{key} must be a positive integer, not {value!r}", where=line_of(source, at))
    return value


def _env(values, where: str, source: Path, at: tuple) -> dict[str, str | None]:
    """`env:`, a mapping of environment variable names to values (a number is written as text; null
    unsets the variable in the run's process)."""
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise UserError(f"{where}env must be a mapping of variable names to values", where=line_of(source, at))
    env = {}
    for name, value in values.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise UserError(f"{where}env: {name!r} is not an environment variable name",
                            where=line_of(source, (*at, name)), fix="letters, digits and '_', e.g. OMP_NUM_THREADS")
        if isinstance(value, (dict, list, bool)):
            raise UserError(f"{where}env.{name} must be a string, a number or null (unset), not {value!r}",
                            where=line_of(source, (*at, name)))
        env[name] = None if value is None else str(value)
    return env


def _overrides(values, where: str, source: Path) -> list[str]:
    from nerkit.config import Config

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


def _student(entry: dict, where: str, source: Path, i: int) -> tuple[list[str], list[str], bool]:
    """A run's `teachers:`, `text:` (each path interpolated as a config's are) and `train_text:`."""
    teachers, text, train_text = entry.get("teachers"), entry.get("text"), entry.get("train_text", False)
    if teachers is None:
        if text is not None or train_text:
            key = "text" if text is not None else "train_text"
            raise UserError(f"{where}.{key} is for a student, which names its teachers:",
                            where=line_of(source, ("runs", i, key)), fix="add teachers: [RUN_NAME, ...]")
        return [], [], False
    if not isinstance(teachers, list) or not teachers or not all(isinstance(t, str) and t for t in teachers):
        raise UserError(f"{where}.teachers must be a non-empty list of run names",
                        where=line_of(source, ("runs", i, "teachers")))
    if text is not None and (not isinstance(text, list) or not all(isinstance(t, str) and t for t in text)):
        raise UserError(f"{where}.text must be a list of text files", where=line_of(source, ("runs", i, "text")),
                        fix="e.g. text: [lm/text/pd199801.txt]")
    if not isinstance(train_text, bool):
        raise UserError(f"{where}.train_text must be true or false, not {train_text!r}",
                        where=line_of(source, ("runs", i, "train_text")))
    if not text and not train_text:
        raise UserError(f"{where}: a student needs unlabelled text: text: [FILE, ...] or train_text: true",
                        where=line_of(source, ("runs", i, "teachers")))
    where_text = line_of(source, ("runs", i, "text"))
    return teachers, [interpolate(t, where_text) for t in text or []], train_text


def _resolve_teachers(runs: list[MatrixRun], lines: dict[str, str]) -> None:
    """Each student's `teachers:` as run names: a run's name, or an entry's (its run of the student's
    seed, or its only run). An unknown name, the run itself or a cycle is an error at the key's line."""
    by_name = {r.name: r for r in runs}
    for run in runs:
        resolved = []
        for wanted in run.teachers:
            group = [r for r in runs if r.group == wanted]
            if wanted in by_name:
                found = by_name[wanted]
            elif len(group) == 1 or any(r.seed == run.seed for r in group):
                found = group[0] if len(group) == 1 else next(r for r in group if r.seed == run.seed)
            elif group:
                raise UserError(f"run {run.name}: teacher {wanted!r} has several seeds and none is {run.seed}",
                                where=lines[run.name], fix=f"name one run: {', '.join(r.name for r in group)}")
            else:
                raise UserError(f"run {run.name}: teacher {wanted!r} is no run of the matrix", where=lines[run.name],
                                fix=did_you_mean(wanted, list(by_name)) or f"runs: {', '.join(by_name)}")
            if found.name == run.name:
                raise UserError(f"run {run.name} names itself as its teacher", where=lines[run.name])
            resolved.append(found.name)
        run.teachers = list(dict.fromkeys(resolved))
    for run in runs:  # a cycle: a teacher that (through its own teachers) learns from its student
        path = _cycle(run.name, by_name, [])
        if path:
            raise UserError(f"teachers: form a cycle: {' -> '.join(path)}", where=lines[path[0]],
                            fix="a student learns from runs that do not learn from it")


def _cycle(name: str, by_name: dict[str, MatrixRun], seen: list[str]) -> list[str] | None:
    """The cycle of teachers that leads from `name` back into `seen`, if any."""
    if name in seen:
        return seen[seen.index(name):] + [name]
    for teacher in by_name[name].teachers:
        found = _cycle(teacher, by_name, seen + [name])
        if found:
            return found
    return None


def ordered(runs: list[MatrixRun]) -> list[MatrixRun]:
    """`runs` in matrix order, except that every run comes after the teachers among them."""
    left, placed, order = list(runs), set(), []
    names = {r.name for r in runs}
    while left:
        run = next(r for r in left if all(t in placed or t not in names for t in r.teachers))  # no cycles: loaded
        order.append(run)
        placed.add(run.name)
        left.remove(run)
    return order


def with_teachers(selected: list[MatrixRun], runs: list[MatrixRun], have) -> tuple[list[MatrixRun], list[str]]:
    """The `selected` runs and, before them, the teachers they need (through their teachers' own)
    that are not selected and that `have(name)` says are not ready; and the names of those added."""
    by_name = {r.name: r for r in runs}
    chosen = {r.name for r in selected}
    added: list[str] = []
    todo = [t for r in selected for t in r.teachers]
    while todo:
        name = todo.pop(0)
        if name in chosen or have(name):
            continue
        chosen.add(name)
        added.append(name)
        todo += by_name[name].teachers
    return ordered([r for r in runs if r.name in chosen]), added


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
                seeds: list[int] | None = None, rounds: int | None = None) -> Matrix:
    """Read and check a matrix file, and expand it into runs (one per seed) with their overrides.
    `sets` (from `--set`) are applied to every run after its own overrides; `seeds` (from `--seeds`)
    replaces every entry's seeds, `rounds` (from `--rounds`) every entry's rounds."""
    path = Path(path)
    raw = read_yaml(path, "matrix file")
    _check_keys(raw, MATRIX_KEYS, "the matrix", path, at=())
    if rounds is not None and rounds < 1:
        raise UserError(f"--rounds must be at least 1, not {rounds}")
    shared_env = _env(raw.get("env"), "", path, ("env",))
    shared_rounds = _count(raw.get("rounds"), "rounds", "", path, ("rounds",), 1)
    if device is not None and device not in DEVICES:
        raise UserError(f"unknown --device {device!r}", fix=f"use one of {', '.join(DEVICES)}")
    sets = _overrides(list(sets), "--set", Path("the command line"))
    entries = raw.get("runs")
    if not isinstance(entries, list) or not entries:
        raise UserError("the matrix needs `runs:`, a non-empty list", where=str(path))
    batch_size = value_of(raw.get("predict_batch_size", 64), int, "predict_batch_size", str(path), "(0, inf)")
    if raw.get("anchors") is not None and not isinstance(raw["anchors"], str):
        raise UserError("anchors must be the path of an anchors file", where=str(path))
    shared_quick = _overrides(raw.get("quick"), "quick", path)
    if quick and "quick" not in raw and not any(isinstance(e, dict) and "quick" in e for e in entries):
        raise UserError("--quick, but the matrix has no quick: overrides", where=str(path),
                        fix="add a top-level quick: list (see configs/bench/quick.yaml)")
    runs: list[MatrixRun] = []
    teacher_lines: dict[str, str] = {}  # run name -> FILE:LINE of its teachers: key
    for i, entry in enumerate(entries):
        where = f"runs[{i}]"
        _check_keys(entry, RUN_KEYS, where, path, at=("runs", i))
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
        env = {**shared_env, **_env(entry.get("env"), f"{where}.", path, ("runs", i, "env"))}
        nproc = _count(entry.get("nproc"), "nproc", f"{where}.", path, ("runs", i, "nproc"), 1)
        times = rounds or _count(entry.get("rounds"), "rounds", f"{where}.", path, ("runs", i, "rounds"), shared_rounds)
        teachers, texts, train_text = _student(entry, where, path, i)
        prepare = entry.get("prepare", [])
        if not isinstance(prepare, list) or not all(isinstance(c, str) and c.strip() for c in prepare):
            raise UserError(f"{where}.prepare must be a list of nerkit commands (the words after `nerkit`)",
                            where=line_of(path, ("runs", i, "prepare")),
                            fix="e.g. prepare: ['data match --dict D.txt:PER --text T.txt --out ${BENCH_OUT}/prepared/m.jsonl']")
        if teachers and nproc > 1:
            raise UserError(f"{where}: a student (teachers:) trains in one process, not nproc: {nproc}",
                            where=line_of(path, ("runs", i, "nproc")))
        for seed in run_seeds or [None]:
            name = group if seed is None else f"{group}_s{seed}"
            extra = [] if seed is None else [f"train.seed={seed}"]
            extra += [] if device is None else [f"train.device={device}"]
            runs.append(MatrixRun(name, group, entry["dataset"], entry["config"], overrides + sets + extra, seed,
                                  env, nproc, times, list(teachers), texts, train_text, list(prepare)))
            teacher_lines[name] = line_of(path, ("runs", i, "teachers"))
    names = [r.name for r in runs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UserError(f"run names repeat: {', '.join(duplicates)}", where=str(path),
                        fix="give every entry its own name")
    _resolve_teachers(runs, teacher_lines)
    anchors = load_anchors(raw["anchors"]) if raw.get("anchors") else {}
    return Matrix(path, runs, anchors, batch_size)


def select_runs(runs: list[MatrixRun], only: list[str]) -> list[MatrixRun]:
    """The runs whose name (or entry name) equals or starts with one of `only` (comma lists allowed)."""
    wanted = [w for item in only for w in item.split(",") if w]
    if not wanted:
        return runs
    for w in wanted:
        if not any(r.name.startswith(w) or r.group.startswith(w) for r in runs):
            raise UserError(f"--only {w}: no run of the matrix is named so or starts so",
                            fix=f"runs: {', '.join(r.name for r in runs)}")
    return [r for r in runs if any(r.name.startswith(w) or r.group.startswith(w) for w in wanted)]
