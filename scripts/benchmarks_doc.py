"""Splice the tables that `nerkit bench` wrote into the benchmark pages (docs/BENCHMARKS.md and
docs/benchmarks-notebook.md, where the blocks are today).

Each recorded run lives in docs/bench/NAME/ (its results.jsonl, as `nerkit bench` wrote it). In
either page a block

    <!-- bench: docs/bench/NAME configs/bench/full.yaml -->
    ...
    <!-- /bench -->

is replaced by the table `nerkit bench --matrix MATRIX --out docs/bench/NAME --markdown-only` builds
from those records (its title line dropped); `<!-- loop: docs/bench/NAME -->` ... `<!-- /loop -->` by
the table `nerkit bench loop` prints, and `<!-- calibration: docs/bench/NAME -->` ... `<!-- /calibration -->`
by `nerkit.tools.calibrate.calibration_table` of those records. `--check` changes nothing and exits 1 when a page is
out of date (the test suite runs it).

    python scripts/benchmarks_doc.py [--check]
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from nerkit.tools.bench import load_matrix, read_results, render_markdown

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "docs" / "BENCHMARKS.md", REPO / "docs" / "benchmarks-notebook.md", REPO / "docs" / "confidence.md"]
DOC = PAGES[1]  # the page that holds the blocks (tests/test_docs.py checks its tables)
BLOCK = re.compile(r"(<!-- bench: (\S+) (\S+) -->\n)(.*?)(<!-- /bench -->)", re.S)
# The records of `nerkit bench loop` and of calibration runs, rendered by their own modules.
RECORD_BLOCK = re.compile(r"(<!-- (loop|calibration): (\S+) -->\n)(.*?)(<!-- /\2 -->)", re.S)


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
    from nerkit.files import read_json_lines
    from nerkit.tools.bench.loop import summary
    from nerkit.tools.calibrate import calibration_table

    records = [r for _, r in read_json_lines(REPO / out / "results.jsonl", f"a {kind} record")]
    return (summary if kind == "loop" else calibration_table)(records)


def render(doc: str) -> str:
    doc = BLOCK.sub(lambda m: m.group(1) + table(m.group(2), m.group(3)) + m.group(5), doc)
    return RECORD_BLOCK.sub(lambda m: m.group(1) + record_table(m.group(2), m.group(3)) + m.group(5), doc)


def main(argv: list[str]) -> int:
    stale = 0
    for page in PAGES:
        doc = page.read_text(encoding="utf-8")
        new = render(doc)
        if new == doc:
            continue
        if "--check" in argv:
            print(f"{page} is out of date: run python scripts/benchmarks_doc.py", file=sys.stderr)
            stale = 1
        else:
            page.write_text(new, encoding="utf-8")
    return stale


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
