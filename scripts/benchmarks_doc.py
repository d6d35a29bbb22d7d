"""Write the result tables of the docs from the records: no figure on a results page is copied by hand.

Each recorded run lives in docs/bench/NAME/results.jsonl, as `nerkit bench` wrote it. Blocks in the
pages are replaced by what the records give:

    <!-- bench: docs/bench/NAME configs/bench/full.yaml -->  the table `nerkit bench --markdown-only`
    <!-- loop: docs/bench/NAME -->                           builds, the loop's and the calibration's
    <!-- calibration: docs/bench/NAME -->                    summaries (any page)
    <!-- nesting: docs/bench/NAME -->       test F1 overall and on nested and flat gold entities
    <!-- lexicon: docs/bench/NAME -->       each lattice run's lexicon, its coverage of dev and test, F1
    <!-- speed: docs/bench/NAME -->         `nerkit bench predict` / `bench export` records, min / median / max
    <!-- scale: docs/bench/NAME -->         the engines' `nerkit bench predict` records against predict's
    <!-- audit: docs/bench/NAME -->         `nerkit bench audit`: the rankings, omissions, the review
    <!-- grow: docs/bench/NAME -->          `nerkit bench grow`: each order's steps, per method
    <!-- best: DATASET -->    the dev-selected best run of each input kind, its config and command
    <!-- runs: DATASET -->    every run docs/bench/index.yaml lists for the dataset
    <!-- grid: NAME -->       a grid of test F1 (index.yaml's `grids`)
    <!-- dirty: records -->   every record whose tree had uncommitted changes, and what they were
    <!-- readme: best -->     one row per dataset: its dev-selected best run
    <!-- targets: NAME -->    teacher, gold-only model and student of each case against a target
                              (index.yaml's `targets`): F1 within `gap` of the teacher, int8 speed

each closed by `<!-- /KIND -->`. docs/bench/index.yaml says which runs appear, their input kind and
label. `--check` changes nothing and exits 1 when a page is out of date (the test suite runs it).

    python scripts/benchmarks_doc.py [--check]      (make benchmarks-doc)
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import yaml

from nerkit.files import read_json_lines
from nerkit.tools.bench import load_matrix, read_results, render_markdown

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
INDEX = DOCS / "bench" / "index.yaml"
BENCHMARKS = DOCS / "BENCHMARKS.md"


def pages() -> list[Path]:
    """Every page that may hold a block."""
    return [REPO / "README.md", *sorted(DOCS.glob("*.md")), *sorted((DOCS / "notebook").glob("*.md"))]


BLOCK = re.compile(r"(<!-- bench: (\S+) (\S+) -->\n)(.*?)(<!-- /bench -->)", re.S)
# The records of `nerkit bench loop` and of calibration runs, rendered by their own modules.
RECORD_KINDS = ("loop", "calibration", "nesting", "lexicon", "speed", "scale", "audit", "grow")
RECORD_BLOCK = re.compile(rf"(<!-- ({'|'.join(RECORD_KINDS)}): (\S+) -->\n)(.*?)(<!-- /\2 -->)", re.S)


def table(out: str, matrix: str) -> str:
    records = read_results(REPO / out)
    if not records:
        raise SystemExit(f"{out}: no results.jsonl")
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        anchors = load_matrix(matrix).anchors
    finally:
        os.chdir(cwd)
    text = render_markdown(list(records.values()), anchors, title="")
    return text.split("\n", 2)[2]  # drop the title line and the blank line after it


def record_table(kind: str, out: str) -> str:
    from nerkit.tools.bench.audit import audit_table
    from nerkit.tools.bench.grow import summary as grow_summary
    from nerkit.tools.bench.loop import summary
    from nerkit.tools.bench.speed import render_speed, scale_table
    from nerkit.tools.annotation.calibrate import calibration_table

    records = [r for _, r in read_json_lines(REPO / out / "results.jsonl", f"a {kind} record")]
    return {"loop": summary, "calibration": calibration_table, "nesting": nesting_table,
            "lexicon": lexicon_table, "speed": lambda rs: render_speed(rs, level=4).split("\n", 2)[2],
            "scale": scale_table, "grow": grow_summary,
            "audit": lambda rs: "\n".join(audit_table(r) for r in rs)}[kind](records)


def nesting_table(records: list[dict]) -> str:
    """Each run's test F1 overall, on the gold entities that overlap another (nested) and on the rest
    (flat), with dev F1 and the epochs (nerkit.inference.evaluate's split of a nested gold corpus);
    a span head's threshold where the bench chose it on dev, with the test F1 it had before."""
    lines = ["| run | config | test F1 | nested P / R / F1 | flat F1 | dev F1 | threshold (dev) / test F1 before "
             "| best epoch / epochs |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        if r.get("status") != "ok":
            continue
        nested, flat = r["test"]["nesting"]["nested"], r["test"]["nesting"]["flat"]
        chosen = r.get("span_threshold")
        threshold = (f"{chosen['threshold']:g} / {f1(chosen['test_before']['f1'])} at {chosen['before']['threshold']:g}"
                     if chosen else "-")
        lines.append(f"| {r['name']} | `{r['config']}` | {f1(r['test']['f1'])} | {f1(nested['precision'])} / "
                     f"{f1(nested['recall'])} / {f1(nested['f1'])} | {f1(flat['f1'])} | {f1(r['dev']['f1'])} "
                     f"| {threshold} | {r['best_epoch']} / {r['epochs']} |")
    return "\n".join(lines) + "\n"


def lexicon_table(records: list[dict]) -> str:
    """Each run with a lexicon (FLAT's lattice): the lexicon's source, words and file sha256, its
    coverage of dev and test (`nerkit lexicon coverage --config`: gold entities held, matches that
    are exactly an entity, matches that cross one, matches per character), and the run's F1."""
    def pct(part: int, whole: int) -> str:
        return f"{100 * part / whole:.2f}" if whole else "-"

    figures = {"held": lambda c: pct(c["entities"]["held"], c["entities"]["total"]),
               "exact": lambda c: pct(c["matches"]["exact"], c["matches"]["total"]),
               "crossing": lambda c: pct(c["matches"]["crossing"], c["matches"]["total"]),
               "per_char": lambda c: f"{c['matches']['total'] / max(c['characters'], 1):.2f}"}
    lines = ["| run | lexicon | words | sha256 | entities held, dev / test | matches exactly an entity "
             "| matches crossing one | matches per character | test F1 | dev F1 |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        if r.get("status") != "ok" or "lexicon" not in r:
            continue
        lexicon = r["lexicon"]
        cells = [" / ".join(figure(lexicon["coverage"][split]) for split in ("dev", "test"))
                 for figure in figures.values()]
        lines.append(f"| {r['name']} | `{lexicon['source']}` | {lexicon['words']:,} | `{lexicon['sha256'][:12]}` | "
                     + " | ".join(cells) + f" | {f1(r['test']['f1'])} | {f1(r['dev']['f1'])} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------- the index

def load_index(path: Path = INDEX) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def record(name: str, run: str, bench: Path) -> dict:
    """The record of `run` in docs/bench/NAME (bench is the docs/bench folder)."""
    records = read_results(bench / name)
    if run not in records:
        raise SystemExit(f"docs/bench/index.yaml: {name} has no run {run} (runs: {', '.join(records)})")
    return records[run]


def f1(value: float) -> str:
    return f"{100 * value:.2f}"


def entries(dataset: dict, bench: Path) -> list[dict]:
    """The dataset's runs as rows: kind, label, test, dev, notebook, and the record where there is one."""
    rows = []
    for e in dataset.get("runs", []):
        r = record(e["record"], e["run"], bench)
        rows.append({**e, "rec": r, "test": f1(r["test"]["f1"]), "dev": f1(r["dev"]["f1"]), "score": r["dev"]["f1"]})
    for e in dataset.get("no_record", []):
        rows.append({**e, "rec": None, "test": f"{e['test']:.2f}", "dev": f"{e['dev']:.2f}", "score": e["dev"] / 100})
    return rows


def best_of(rows: list[dict]) -> dict:
    """The row with the highest dev F1: test F1 never chooses."""
    return max(rows, key=lambda row: row["score"])


def best_per_kind(index: dict, dataset: dict, bench: Path) -> list[dict]:
    rows = entries(dataset, bench)
    return [best_of(group) for kind in index["kinds"] if (group := [r for r in rows if r["kind"] == kind])]


def record_link(row: dict, docs: str) -> str:
    if row["rec"] is None:
        return "no record"
    dirty = " (dirty)" if row["rec"].get("git_dirty") else ""
    return f"[{row['record']}]({docs}bench/{row['record']}/results.jsonl){dirty}"


def command(row: dict) -> str:
    """The `nerkit bench` command that reruns a recorded run, at the commit its record names."""
    r = row["rec"]
    sets = [f"--set {o}" for o in r.get("overrides", []) if not o.startswith(("train.seed=", "train.device="))]
    device = f" --device {r['device']}" if r.get("device") else ""
    return (f"git checkout {r['git_commit'][:7]}\n"
            f"nerkit bench --matrix {row['matrix']} --only {row['run']}{device} {' '.join(sets)}".rstrip())


def render_best(index: dict, name: str, docs: str, bench: Path) -> str:
    best = best_per_kind(index, index["datasets"][name], bench)
    lines = ["| inputs | model | test F1 | dev F1 | record | config | notebook |", "|---|---|---:|---:|---|---|---|"]
    for row in best:
        config = f"`{row['rec']['config']}`" if row["rec"] else "in its entry"
        lines.append(f"| {row['kind']} | {row['label']} | {row['test']} | {row['dev']} | {record_link(row, docs)} "
                     f"| {config} | [entry]({docs}{row['notebook']}) |")
    lines += ["", "To rerun one (from a clone with the data; `make lm`, `make lac` or `make vectors` first where the "
              "config needs them, and for an adapted language model the `nerkit lm adapt` command of its notebook "
              "entry):", "", "```"]
    for row in best:
        lines += [f"# {row['kind']}: {row['label']}", command(row) if row["rec"] else "# no record: see its notebook entry"]
    return "\n".join(lines + ["```", ""])


def render_runs(index: dict, name: str, docs: str, bench: Path) -> str:
    rows = entries(index["datasets"][name], bench)
    order = list(index["kinds"])
    lines = ["| inputs | model | test F1 | dev F1 | record | notebook |", "|---|---|---:|---:|---|---|"]
    for row in sorted(rows, key=lambda r: order.index(r["kind"])):  # stable: index order within a kind
        lines.append(f"| {row['kind']} | {row['label']} | {row['test']} | {row['dev']} | {record_link(row, docs)} "
                     f"| [entry]({docs}{row['notebook']}) |")
    return "\n".join(lines) + "\n"


def render_grid(index: dict, name: str, docs: str, bench: Path) -> str:
    grid = index["grids"][name]
    lines = ["| | " + " | ".join(grid["columns"]) + " |", "|---|" + "---:|" * len(grid["columns"])]
    for row in grid["rows"]:
        cells = [f1(record(*cell.split("/"), bench)["test"]["f1"]) if "/" in cell else cell for cell in row["cells"]]
        lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_dirty(index: dict, name: str, docs: str, bench: Path) -> str:
    notes = index.get("dirty", {})
    lines = ["| record | run | test F1 | dev F1 | what the uncommitted change was |", "|---|---|---:|---:|---|"]
    for path in sorted(bench.glob("*/results.jsonl")):
        runs = [r for _, r in read_json_lines(path, "a record") if r.get("git_dirty")]
        if not runs:
            continue
        if path.parent.name not in notes:
            raise SystemExit(f"docs/bench/index.yaml: the dirty record {path.parent.name} has no entry under `dirty`")
        note = notes[path.parent.name]
        for r in runs:
            lines.append(f"| [{path.parent.name}]({docs}bench/{path.parent.name}/results.jsonl) | {note['run']}"
                         f"{simulated_step(r)} | {f1(scores(r, 'test'))} | {f1(scores(r, 'dev'))} | {note['change']} |")
    return "\n".join(lines) + "\n"


def scores(record: dict, split: str) -> float:
    """A record's F1 on `split`: a matrix run's (`test: {f1: ...}`) or a simulation's (`test_f1`)."""
    return record[split]["f1"] if split in record else record[f"{split}_f1"]


def simulated_step(record: dict) -> str:
    """Which step of a simulation (`nerkit bench loop`) a record is, as `: span, seed 1, round 2`."""
    return f": {record['unit']}, seed {record['seed']}, round {record['round']}" if "unit" in record else ""


def render_readme(index: dict, name: str, docs: str, bench: Path) -> str:
    lines = ["| dataset | inputs | model | test F1 | dev F1 | record |", "|---|---|---|---:|---:|---|"]
    for dataset in index["datasets"].values():
        row = best_of(entries(dataset, bench))
        lines.append(f"| {dataset['title']} | {index['kinds'][row['kind']]} | {row['label']} | {row['test']} "
                     f"| {row['dev']} | {record_link(row, docs)} |")
    return "\n".join(lines) + "\n"


def dev_best(cells: list[str], bench: Path) -> tuple[str, dict]:
    """Of the `RECORD/run` cells, the run whose record has the highest dev F1, and that record."""
    return max(((cell.split("/")[1], record(*cell.split("/"), bench)) for cell in cells),
               key=lambda pair: pair[1]["dev"]["f1"])


def slowest(cell: str, bench: Path) -> float:
    """The slowest round's characters a second of the `nerkit bench predict` record `RECORD/name`."""
    name, run = cell.split("/")
    records = [r for _, r in read_json_lines(bench / name / "results.jsonl", "a speed record")
               if r.get("name") == run and r.get("kind") == "predict"]
    if len(records) != 1:
        raise SystemExit(f"docs/bench/index.yaml: {name} has {len(records)} predict records named {run}")
    return records[0]["spread"]["chars_per_s"]["min"]


def render_targets(index: dict, name: str, docs: str, bench: Path) -> str:
    """Each case's teacher, gold-only model and student, each the dev-best of its candidates; whether
    the student is within `gap` test F1 of its teacher, and whether its int8 export's slowest round
    reached `speed` chars/s. A student without a speed record is unmeasured, never taken as fast."""
    targets = index["targets"][name]
    gap, speed = targets["gap"], targets["speed"]
    lines = [f"| case | teacher | gold-only | student | student − teacher | within {gap:.1f} | int8 chars/s, "
             f"slowest round | ≥ {speed:,} |", "|---|---:|---:|---|---:|---|---:|---|"]
    for row in targets["rows"]:
        teacher, gold = dev_best(row["teacher"], bench)[1], dev_best(row["gold"], bench)[1]
        run, student = dev_best(row["students"], bench)
        delta = round(100 * (student["test"]["f1"] - teacher["test"]["f1"]), 2)
        chosen = f" (dev-best of {len(row['students'])})" if len(row["students"]) > 1 else ""
        fast = slowest(row["speed"][run], bench) if run in row.get("speed", {}) else None
        speed_cells = "not measured | –" if fast is None else f"{fast:,.0f} | {'yes' if fast >= speed else 'no'}"
        lines.append(f"| {row['label']} | {f1(teacher['test']['f1'])} | {f1(gold['test']['f1'])} "
                     f"| {f1(student['test']['f1'])} `{run}`{chosen} | {delta:+.2f} "
                     f"| {'yes' if delta >= -gap else 'no'} | {speed_cells} |")
    return "\n".join(lines) + "\n"


RENDER = {"best": render_best, "runs": render_runs, "grid": render_grid, "dirty": render_dirty, "readme": render_readme,
          "targets": render_targets}
# The blocks built from docs/bench/index.yaml, one kind for each renderer.
INDEX_BLOCK = re.compile(rf"(<!-- ({'|'.join(RENDER)}): (\S+) -->\n)(.*?)(<!-- /\2 -->)", re.S)


def render(doc: str, page: Path = BENCHMARKS, index: dict | None = None, bench: Path = DOCS / "bench") -> str:
    """The page with every block rebuilt from the records (links relative to `page`)."""
    doc = BLOCK.sub(lambda m: m.group(1) + table(m.group(2), m.group(3)) + m.group(5), doc)
    doc = RECORD_BLOCK.sub(lambda m: m.group(1) + record_table(m.group(2), m.group(3)) + m.group(5), doc)
    if not INDEX_BLOCK.search(doc):
        return doc
    index = index or load_index()
    docs = os.path.relpath(DOCS, page.parent).replace(os.sep, "/") + "/"
    docs = "" if docs == "./" else docs
    return INDEX_BLOCK.sub(lambda m: m.group(1) + RENDER[m.group(2)](index, m.group(3), docs, bench) + m.group(5), doc)


def main(argv: list[str]) -> int:
    stale = 0
    for page in pages():
        doc = page.read_text(encoding="utf-8")
        new = render(doc, page)
        if new == doc:
            continue
        if "--check" in argv:
            print(f"{page} is out of date: run make benchmarks-doc", file=sys.stderr)
            stale = 1
        else:
            page.write_text(new, encoding="utf-8")
    return stale


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
