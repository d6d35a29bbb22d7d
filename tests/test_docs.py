"""The result tables of the docs (BENCHMARKS.md, the README's row, the notebook, confidence.md) are
what scripts/benchmarks_doc.py builds from the recorded results.jsonl files and docs/bench/index.yaml,
with the best run of a kind chosen on dev; the README describes what a model directory holds."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("benchmarks_doc", REPO / "scripts" / "benchmarks_doc.py")
benchmarks_doc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(benchmarks_doc)


def test_every_result_table_is_what_the_records_give():
    """The one check that the pages are up to date: each page rendered from the records is the page."""
    kinds = set()
    for page in benchmarks_doc.pages():
        doc = page.read_text(encoding="utf-8")
        for _, out, matrix, _, _ in benchmarks_doc.BLOCK.findall(doc):
            assert (REPO / out / "results.jsonl").is_file() and (REPO / matrix).is_file()
        kinds |= {m.group(2) for m in benchmarks_doc.INDEX_BLOCK.finditer(doc)}
        kinds |= {"bench"} if benchmarks_doc.BLOCK.search(doc) else set()
        kinds |= {m.group(2) for m in benchmarks_doc.RECORD_BLOCK.finditer(doc)}
        assert benchmarks_doc.render(doc, page) == doc, f"{page.name}: run make benchmarks-doc"
    assert kinds == {"bench", *benchmarks_doc.RECORD_KINDS, *benchmarks_doc.RENDER}  # every kind is used somewhere


@pytest.mark.parametrize("block", [benchmarks_doc.BLOCK, benchmarks_doc.INDEX_BLOCK, benchmarks_doc.RECORD_BLOCK])
def test_a_hand_edited_figure_is_caught(block):
    page = next(p for p in benchmarks_doc.pages() if block.search(p.read_text(encoding="utf-8")))
    doc = page.read_text(encoding="utf-8")
    first = block.search(doc)
    edited = doc[: first.start(4)] + re.sub(r"\d+\.\d\d", "99.99", first.group(4), count=1) + doc[first.end(4):]
    assert edited != doc and benchmarks_doc.render(edited, page) == doc


def write_record(bench: Path, name: str, run: str, test: float, dev: float, **extra) -> None:
    (bench / name).mkdir(parents=True)
    line = {"name": run, "test": {"f1": test}, "dev": {"f1": dev}, "git_commit": "0123456789abcdef",
            "config": "configs/x.yaml", "overrides": ["train.seed=1", "train.epochs=3"], **extra}
    (bench / name / "results.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")


def tiny_index(no_record: list[dict] = ()) -> dict:
    entry = {"matrix": "configs/bench/full.yaml", "kind": "random-init", "notebook": "notebook/x.md"}
    return {"kinds": {"random-init": "random-init characters"},
            "datasets": {"d": {"title": "D", "no_record": list(no_record), "runs": [
                {**entry, "record": "high-test", "run": "a_s1", "label": "A"},
                {**entry, "record": "high-dev", "run": "b_s1", "label": "B"}]}}}


def test_the_best_of_a_kind_is_chosen_on_dev_never_on_test(tmp_path):
    write_record(tmp_path, "high-test", "a_s1", test=0.95, dev=0.80)
    write_record(tmp_path, "high-dev", "b_s1", test=0.85, dev=0.90)
    page = benchmarks_doc.BENCHMARKS
    best = benchmarks_doc.render("<!-- best: d -->\n<!-- /best -->", page, tiny_index(), tmp_path)
    assert "| B | 85.00 | 90.00 |" in best and "| A |" not in best
    assert "git checkout 0123456\nnerkit bench --matrix configs/bench/full.yaml --only b_s1 --set train.epochs=3" in best
    readme = benchmarks_doc.render("<!-- readme: best -->\n<!-- /readme -->", benchmarks_doc.REPO / "README.md",
                                   tiny_index([{"kind": "random-init", "label": "C", "test": 99.0, "dev": 91.0,
                                                "notebook": "notebook/x.md"}]), tmp_path)
    assert "| C | 99.00 | 91.00 | no record |" in readme  # a run without a record competes on dev too


def test_a_dirty_record_without_its_note_is_refused(tmp_path):
    write_record(tmp_path, "high-test", "a_s1", test=0.95, dev=0.80, git_dirty=True)
    with pytest.raises(SystemExit, match="high-test has no entry under `dirty`"):
        benchmarks_doc.render("<!-- dirty: records -->\n<!-- /dirty -->", benchmarks_doc.BENCHMARKS, {}, tmp_path)
    index = {"dirty": {"high-test": {"run": "the run", "change": "an edit"}}}
    table = benchmarks_doc.render("<!-- dirty: records -->\n<!-- /dirty -->", benchmarks_doc.BENCHMARKS, index, tmp_path)
    assert "| the run | 95.00 | 80.00 | an edit |" in table
    loop = tmp_path / "a-loop"  # a simulation's records: each round a row, its F1s where the loop writes them
    loop.mkdir()
    (loop / "results.jsonl").write_text(json.dumps({"unit": "span", "seed": 1, "round": 2, "test_f1": 0.5,
                                                    "dev_f1": 0.25, "git_dirty": True}) + "\n", encoding="utf-8")
    index["dirty"]["a-loop"] = {"run": "a loop", "change": "another edit"}
    table = benchmarks_doc.render("<!-- dirty: records -->\n<!-- /dirty -->", benchmarks_doc.BENCHMARKS, index, tmp_path)
    assert "| a loop: span, seed 1, round 2 | 50.00 | 25.00 | another edit |" in table


def write_speed(bench: Path, name: str, runs: dict[str, float]) -> None:
    """A `nerkit bench predict` record of each run: its slowest round at the given chars/s."""
    (bench / name).mkdir(parents=True)
    lines = [json.dumps({"name": run, "kind": "predict", "spread": {"chars_per_s": {"min": low, "median": low + 1}}})
             for run, low in runs.items()]
    (bench / name / "results.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_a_target_is_judged_on_the_dev_best_student_and_its_slowest_round(tmp_path):
    write_record(tmp_path, "teacher", "t_s1", test=0.90, dev=0.91)
    write_record(tmp_path, "gold", "g_s1", test=0.85, dev=0.86)
    write_record(tmp_path, "high-test", "a_s1", test=0.95, dev=0.80)  # best on test: never the student
    write_record(tmp_path, "high-dev", "b_s1", test=0.89, dev=0.90)   # exactly `gap` below the teacher
    write_speed(tmp_path, "speed", {"a_int8": 200_000.0, "b_int8": 79_999.0})
    row = {"label": "D", "teacher": ["teacher/t_s1"], "gold": ["gold/g_s1"], "students": ["high-test/a_s1",
           "high-dev/b_s1"], "speed": {"a_s1": "speed/a_int8", "b_s1": "speed/b_int8"}}
    index = {"targets": {"t": {"gap": 1.0, "speed": 80000, "rows": [row]}}}
    table = benchmarks_doc.render("<!-- targets: t -->\n<!-- /targets -->", benchmarks_doc.BENCHMARKS, index, tmp_path)
    assert "| D | 90.00 | 85.00 | 89.00 `b_s1` (dev-best of 2) | -1.00 | yes | 79,999 | no |" in table
    del row["speed"]["b_s1"]  # no speed record: unmeasured, not fast
    table = benchmarks_doc.render("<!-- targets: t -->\n<!-- /targets -->", benchmarks_doc.BENCHMARKS, index, tmp_path)
    assert "| -1.00 | yes | not measured | – |" in table
    write_record(tmp_path, "higher-dev", "c_s1", test=0.88, dev=0.95)
    row["students"].append("higher-dev/c_s1")
    table = benchmarks_doc.render("<!-- targets: t -->\n<!-- /targets -->", benchmarks_doc.BENCHMARKS, index, tmp_path)
    assert "88.00 `c_s1` (dev-best of 3) | -2.00 | no |" in table


def test_the_readme_names_everything_a_model_directory_holds(tiny_model_dir):
    """Each file and directory a training run leaves in its --out (checkpoint/ was missing: most of
    the demo's size), and what FLAT and language-model directories add: docs/model-directory.md's
    table, where the README's section moved."""
    page = (REPO / "docs" / "model-directory.md").read_text(encoding="utf-8")
    section = page.split("## What it holds", 1)[1].split("\n## ", 1)[0]
    entries = [p.name + ("/" if p.is_dir() else "") for p in tiny_model_dir.iterdir()]
    assert "checkpoint/" in entries
    missing = [name for name in entries + ["lexicon.txt", "lm/"] if f"`{name}`" not in section]
    assert not missing


def test_every_script_imports():
    """Each scripts/*.py loads as a module (its imports run, its `__main__` block does not): a helper moved by a
    refactoring breaks `make vectors` or a documented benchmark command here rather than for a user."""
    scripts = sorted((REPO / "scripts").glob("*.py"))
    assert len(scripts) > 5
    for path in scripts:
        script = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
        module = importlib.util.module_from_spec(script)
        script.loader.exec_module(module)


def test_the_nesting_table_reads_the_split_of_each_record():
    nested = {"precision": 0.5, "recall": 0.25, "f1": 1 / 3}
    record = {"name": "span", "status": "ok", "config": "c.yaml", "best_epoch": 3, "epochs": 4, "dev": {"f1": 0.7},
              "test": {"f1": 0.6, "nesting": {"nested": nested, "flat": {"f1": 0.65}}}}
    chosen = {**record, "name": "chosen", "span_threshold": {"threshold": 0.35, "before": {"threshold": 0.5},
                                                             "test_before": {"f1": 0.55}}}
    table = benchmarks_doc.nesting_table([record, {"name": "failed", "status": "failed"}, chosen])
    assert table.splitlines()[2] == "| span | `c.yaml` | 60.00 | 50.00 / 25.00 / 33.33 | 65.00 | 70.00 | - | 3 / 4 |"
    assert table.splitlines()[3] == ("| chosen | `c.yaml` | 60.00 | 50.00 / 25.00 / 33.33 | 65.00 | 70.00 "
                                     "| 0.35 / 55.00 at 0.5 | 3 / 4 |")
    assert len(table.splitlines()) == 4


def test_the_lexicon_table_reads_each_lattice_runs_coverage_of_dev_and_test():
    def coverage(held: int, exact: int, crossing: int) -> dict:
        return {"sentences": 5, "characters": 200, "entities": {"total": 40, "held": held},
                "matches": {"total": 80, "exact": exact, "crossing": crossing}}

    lexicon = {"source": "lexicons/cmeee_train.words", "sha256": "7fe597e1db0cd322" + "0" * 48, "words": 11598,
               "coverage": {"dev": coverage(20, 8, 1), "test": coverage(10, 4, 2)}}
    record = {"name": "cmeee_flat_mined", "status": "ok", "lexicon": lexicon, "dev": {"f1": 0.7}, "test": {"f1": 0.6}}
    no_lexicon = {"name": "cmeee_bilstm_crf", "status": "ok", "dev": {"f1": 0.7}, "test": {"f1": 0.6}}
    table = benchmarks_doc.lexicon_table([record, no_lexicon, {"name": "failed", "status": "failed"}])
    assert table.splitlines()[2] == ("| cmeee_flat_mined | `lexicons/cmeee_train.words` | 11,598 | `7fe597e1db0c` "
                                     "| 50.00 / 25.00 | 10.00 / 5.00 | 1.25 / 2.50 | 0.40 / 0.40 | 60.00 | 70.00 |")
    assert len(table.splitlines()) == 3
    assert "lexicon" in benchmarks_doc.RECORD_BLOCK.pattern
