"""The docs pages stay true to the code: the config reference (docs/config.md) and the command-line
reference (docs/cli.md) are what their scripts generate from nerkit/config.py and `--help`, every
config key has a description, every link between the pages (the notebook's included) resolves, and
the README stays short. The result tables are tests/test_docs.py's."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md")), *sorted((DOCS / "notebook").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def script(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_script_{name}", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation but - and _ dropped, spaces as
    -, a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(text).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


# ------------------------------------------------------------------------------- config reference

def test_the_config_reference_is_what_config_py_generates():
    reference = script("config_reference")
    assert reference.DOC.read_text(encoding="utf-8") == reference.render(), \
        "docs/config.md is stale: run python scripts/config_reference.py"


def rows(page: str) -> dict[str, str]:
    """`key` -> its meaning cell, for every table row of a page section."""
    out = {}
    for line in page.splitlines():
        m = re.match(r"\| `([^`]+)` \|(.*)\|\s*$", line)
        if m:
            out[m.group(1)] = m.group(2).rsplit("|", 1)[-1].strip()
    return out


def test_every_config_key_has_a_described_row():
    """Walks the dataclasses itself (not the generator's list): a key added to config.py without a
    comment, or left out of the page, fails here."""
    from nerkit import config

    page = (DOCS / "config.md").read_text(encoding="utf-8")
    sections = re.split(r"^### encoder\.name: ", page, flags=re.M)
    undocumented = []
    top = rows(page)  # keys outside `encoder` are unique on the page
    for section in dataclasses.fields(config.Config):
        if section.name == "encoder":
            continue
        if not dataclasses.is_dataclass(section.default_factory) and section.default_factory is dataclasses.MISSING:
            keys = [section.name]
        else:
            keys = []
            for f in dataclasses.fields(section.default_factory):
                nested = f.default_factory if dataclasses.is_dataclass(f.default_factory) else None
                keys += ([f"{section.name}.{f.name}.{g.name}" for g in dataclasses.fields(nested)]
                         if nested else [f"{section.name}.{f.name}"])
        undocumented += [k for k in keys if not top.get(k)]
    if not top.get("encoder.name"):
        undocumented.append("encoder.name")
    encoders = {part.split("\n", 1)[0].strip(): rows(part.split("\n## ", 1)[0]) for part in sections[1:]}
    for name, options in config.ENCODER_OPTIONS.items():
        assert name in encoders, f"docs/config.md has no section for encoder {name}"
        undocumented += [f"{name}: encoder.{f.name}" for f in dataclasses.fields(options)
                         if not encoders[name].get(f"encoder.{f.name}")]
    assert not undocumented, f"keys without a description in docs/config.md: {undocumented}"


def test_every_config_key_has_its_comment_in_config_py():
    """The reference's descriptions come from config.py's comments alone: a new key without one is
    caught here, where it is written, not only on the generated page."""
    assert script("config_reference").undocumented() == []


# ------------------------------------------------------------------------------- CLI reference

@pytest.mark.slow
def test_the_cli_reference_is_what_help_prints():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "cli_reference.py"), "--check"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr


def test_the_cli_reference_has_every_exit_code_the_cli_uses():
    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    section = page.split("## Exit codes", 1)[1]
    assert all(f"| {code} |" in section for code in (0, 1, 2, 130, 143))


# ------------------------------------------------------------------------------- pages and links

def test_the_readme_is_a_front_door():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    linked = {m.group(1) for m in LINK.finditer(readme)}
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if f"docs/{p.name}" not in linked]
    assert not unlinked, f"docs pages the README's table does not link: {unlinked}"


def test_every_link_between_the_pages_resolves():
    broken = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for target in LINK.findall(prose(text)):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text(encoding="utf-8")):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
