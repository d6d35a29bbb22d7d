"""docs/BENCHMARKS.md's result tables are the ones `nerkit bench` builds from the recorded
results.jsonl files (scripts/benchmarks_doc.py splices them in); the README describes what a
model directory holds."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("benchmarks_doc", REPO / "scripts" / "benchmarks_doc.py")
benchmarks_doc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(benchmarks_doc)


def test_benchmark_tables_are_what_bench_builds_from_the_records():
    doc = benchmarks_doc.DOC.read_text(encoding="utf-8")
    blocks = benchmarks_doc.BLOCK.findall(doc)
    assert blocks, "no <!-- bench: ... --> block in docs/BENCHMARKS.md"
    for _, out, matrix, _, _ in blocks:
        assert (REPO / out / "results.jsonl").is_file() and (REPO / matrix).is_file()
    assert benchmarks_doc.render(doc) == doc, "run python scripts/benchmarks_doc.py"


def test_a_hand_edited_figure_is_caught():
    doc = benchmarks_doc.DOC.read_text(encoding="utf-8")
    first = benchmarks_doc.BLOCK.search(doc)
    edited = doc[: first.start(4)] + re.sub(r"\d+\.\d\d", "99.99", first.group(4), count=1) + doc[first.end(4):]
    assert edited != doc and benchmarks_doc.render(edited) == doc


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


def test_the_confidence_page_tables_are_what_the_records_give():
    page = REPO / "docs" / "confidence.md"
    doc = page.read_text(encoding="utf-8")
    assert "<!-- loop: docs/bench/" in doc and "<!-- calibration: docs/bench/" in doc
    assert benchmarks_doc.render(doc) == doc, "run python scripts/benchmarks_doc.py"
