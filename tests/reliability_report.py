"""What the reliability tests (test_reliability.py, test_resume.py) tried and what happened, written
into docs/RELIABILITY.md only when NERKIT_WRITE_RELIABILITY=1 (a normal test run writes nothing).

Each test module owns one section of the document, between `<!-- begin KEY -->` and
`<!-- end KEY -->`, so the modules can be run together or one at a time.
"""

from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "RELIABILITY.md"
HEADER = """# Reliability

What nerkit was put through, and what happened. This file is written by the tests themselves:

    NERKIT_WRITE_RELIABILITY=1 .venv/bin/python -m pytest tests/test_reliability.py tests/test_resume.py

Every row below is a check that ran and passed in that run (a failing check fails the test run, and
a failed run is not meant to be committed). Do not edit by hand.
"""


class Section:
    """Tables and counts gathered while one test module runs."""

    def __init__(self, key: str, title: str, intro: str):
        self.key, self.title, self.intro = key, title, intro
        self.tables: dict[str, tuple[list[str], list[list]]] = {}
        self.facts: list[str] = []

    def table(self, name: str, columns: list[str]) -> None:
        self.tables.setdefault(name, (columns, []))

    def row(self, name: str, *cells) -> None:
        self.tables[name][1].append([str(c) for c in cells])

    def fact(self, text: str) -> None:
        self.facts.append(text)

    def render(self) -> str:
        out = [f"<!-- begin {self.key} -->", f"## {self.title}", "", self.intro.strip(), ""]
        out += [f"- {f}" for f in self.facts]
        if self.facts:
            out.append("")
        for name, (columns, rows) in self.tables.items():
            if not rows:
                continue
            out += [f"### {name} ({len(rows)})", "", "| " + " | ".join(columns) + " |",
                    "|" + "---|" * len(columns)]
            out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in sorted(rows, key=lambda r: r[0])]
            out.append("")
        stamp = time.strftime("%Y-%m-%d", time.gmtime())
        out += [f"_{stamp}, Python {platform.python_version()}, {os.cpu_count()} CPUs._", f"<!-- end {self.key} -->"]
        return "\n".join(out)

    def write_if_asked(self) -> None:
        if os.environ.get("NERKIT_WRITE_RELIABILITY") != "1":
            return
        from nerkit.files import atomic_write_text

        text = DOC.read_text(encoding="utf-8") if DOC.exists() else HEADER
        block = re.compile(rf"<!-- begin {re.escape(self.key)} -->.*?<!-- end {re.escape(self.key)} -->", re.S)
        rendered = self.render()
        text = block.sub(lambda m: rendered, text) if block.search(text) else text.rstrip("\n") + "\n\n" + rendered
        atomic_write_text(DOC, text.rstrip("\n") + "\n")


def _cell(text: str) -> str:
    """A table cell: one line, no pipes, and paths shown from the test's temporary directory (or
    the repository) down, so that messages keep their point."""
    text = re.sub(r"\S*/pytest-\d+/[^/\s]+/", "", text).replace(f"{REPO}/", "")
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 180 else text[:177] + "..."
