"""The docs pages stay true to the code: the config reference (docs/config.md) and the command-line
reference (docs/cli.md and its page per command, docs/cli/) are what their scripts generate from nerkit/config.py and `--help`, every
config key has a description, every link between the pages (the notebook's included) resolves, and
the README stays short. The result tables are tests/test_docs.py's."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md")), *sorted((DOCS / "notebook").glob("*.md")),
         *sorted((DOCS / "cli").glob("*.md"))]
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


# ------------------------------------------------------------------------------- recipes beside figures

# `<!-- recipe: SOURCE NAME ... -->` right above a code block: the block's training commands (those
# that take a config and `--set`: nerkit train, distill, bench loop), in order, are how the runs NAME
# of SOURCE were made, SOURCE a benchmark matrix (configs/bench/X.yaml, NAME a run such as
# pd2k_lm_crf_s1) or a record (docs/bench/DIR, NAME a record's name or its config).
# `<!-- recipe: none -->` marks a block that trains but that no figure comes from (a usage example).
RECIPE = re.compile(r"^<!-- recipe: (.+?) -->\n```[^\n]*\n(.*?)^```", re.S | re.M)
CODE_BLOCK = re.compile(r"^(<!-- recipe: .+? -->\n)?```[^\n]*\n(.*?)^```", re.S | re.M)


def nerkit_commands(block: str) -> list[tuple[str, dict]]:
    """Each `nerkit` command line of a code block as (its command path, e.g. "bench loop", and the
    options the CLI itself parses from it); lines without nerkit, or that shlex cannot split, are
    left out."""
    from typer.main import get_command

    from nerkit.cli.app import app

    out = []
    for line in re.sub(r"\\\n", " ", block).splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if "nerkit" not in words:
            continue
        words = words[words.index("nerkit") + 1:]
        command, path = get_command(app), []
        parent = command.context_class(command, info_name="nerkit")
        while hasattr(command, "list_commands") and words and words[0] in command.list_commands(parent):
            path.append(words[0])  # a group's command (typer brings click of its own: no isinstance)
            command = command.get_command(parent, words.pop(0))
            parent = command.context_class(command, info_name=path[-1], parent=parent)
        params = command.make_context(" ".join(path), words, resilient_parsing=True).params
        out.append((" ".join(path), params))
    return out


def training_steps(block: str) -> list[tuple[str, dict]]:
    """The commands of a block that train from a config with overrides (nerkit train, distill,
    bench loop: every command with --config and --set)."""
    return [(path, params) for path, params in nerkit_commands(block)
            if {"config", "set_"} <= params.keys() and params["config"] is not None]


def made_by(source: str, names: list[str]) -> list[dict]:
    """What made each named run: its config, overrides, teachers, text and train_text, from the
    matrix (as `nerkit bench` expands it) or from the recorded results."""
    from nerkit.tools.bench.matrix import load_matrix

    if source.endswith((".yaml", ".yml")):
        runs = {r.name: r for r in load_matrix(REPO / source).runs}
        missing = [n for n in names if n not in runs]
        assert not missing, f"{source} has no run {missing}; its runs: {sorted(runs)}"
        return [{"config": r.config, "overrides": r.overrides, "teachers": r.teachers, "text": r.texts,
                 "train_text": r.train_text} for r in (runs[n] for n in names)]
    records = [json.loads(line) for line in (REPO / source / "results.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip()]
    out = []
    for name in names:
        chosen = {json.dumps([r["config"], r["overrides"], r.get("teachers") or [], r.get("text") or [],
                              bool(r.get("train_text"))]) for r in records if name in (r.get("name"), r.get("config"))}
        assert len(chosen) == 1, f"{source}: {len(chosen)} different records named {name}"
        config, overrides, teachers, text, train_text = json.loads(chosen.pop())
        out.append({"config": config, "overrides": overrides, "teachers": teachers, "text": text,
                    "train_text": train_text})
    return out


def config_differences(a, b) -> list[str]:
    """`key: A -> B` for every resolved setting in which two configs differ (the output directory
    aside)."""
    from nerkit.config import config_to_dict

    def flat(tree: dict, prefix: str = "") -> dict:
        out = {}
        for key, value in tree.items():
            out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
        return out

    fa, fb = (flat({k: v for k, v in config_to_dict(c).items() if k != "output_dir"}) for c in (a, b))
    return [f"{key}: {fa.get(key)!r} -> {fb.get(key)!r}" for key in sorted(fa.keys() | fb.keys())
            if fa.get(key) != fb.get(key)]


def recipe_problems(page: str, source: str, names: list[str], block: str) -> list[str]:
    """How the training commands of a recipe's block differ from the runs that made its figures:
    every resolved setting the same, each distilled student taught by the block's own commands of its
    teachers, on the same text."""
    from nerkit.config import load_config

    steps = training_steps(block)
    if len(steps) != len(names):
        return [f"{page}: the recipe of {source} {' '.join(names)} has {len(steps)} training commands, not {len(names)}"]
    problems, outs = [], {}
    for name, run, (command, params) in zip(names, made_by(source, names), steps):
        where = f"{page}: nerkit {command} --config {params['config']} (the recipe of {source} {name})"
        shown = load_config(REPO / params["config"], list(params["set_"]))
        problems += [f"{where}: {d} (the page -> the run)"
                     for d in config_differences(shown, load_config(REPO / run["config"], run["overrides"]))]
        teachers = [outs.get(str(t), f"{t} (no command of the block)") for t in params.get("teacher") or []]
        if sorted(teachers) != sorted(run["teachers"]):
            problems.append(f"{where}: taught by {teachers}, the run by {run['teachers']}")
        if [str(t) for t in params.get("text") or []] != run["text"] or run["train_text"]:
            problems.append(f"{where}: reads the text {[str(t) for t in params.get('text') or []]}, the run "
                            f"{run['text']}{' and its own training text' if run['train_text'] else ''}")
        if params.get("out") is not None:
            outs[str(params["out"])] = name
    return problems


def test_every_recipe_is_the_command_of_the_runs_beside_it(monkeypatch):
    """Issue 55: the few-labels recipe trained its teacher at the config's 3 epochs and rate 0.001
    while the figures beside it came from 10 epochs at 0.01, about 3 F1 lower when followed. Each
    marked recipe's commands resolve to the very configs of the runs that made its figures."""
    monkeypatch.chdir(REPO)  # the matrices name their anchors and texts from the repository root
    problems, recipes = [], 0
    for page in PAGES:
        for marker, block in RECIPE.findall(page.read_text(encoding="utf-8")):
            if marker == "none":
                continue
            source, *names = marker.split()
            problems += recipe_problems(str(page.relative_to(REPO)), source, names, block)
            recipes += 1
    assert recipes >= 4 and not problems, "\n".join(problems)


def test_every_guide_block_that_trains_a_shipped_config_says_which_runs_it_made():
    """A guide's command that trains one of configs/ is either the recipe of the figures beside it
    (marked with their runs, and checked above) or marked `<!-- recipe: none -->`: a new command
    next to a figure cannot go unchecked by being left unmarked."""
    unmarked = []
    for page in sorted(DOCS.glob("*.md")):
        for marker, block in CODE_BLOCK.findall(page.read_text(encoding="utf-8")):
            if marker or not re.search(r"\bnerkit (train|distill|bench loop)\b", block):
                continue
            shipped = [f"nerkit {c} --config {p['config']}" for c, p in training_steps(block)
                       if Path(p["config"]).parts[0] == "configs"]
            unmarked += [f"{page.relative_to(REPO)}: {s}" for s in shipped]
    assert not unmarked, "blocks without <!-- recipe: SOURCE RUN ... --> or <!-- recipe: none -->:\n" + "\n".join(unmarked)


# ------------------------------------------------------------------------------- guides hold no records

# A guide says how; what a dated run found is a record, kept in docs/notebook/ (by topic, conclusions
# first) and docs/bench/. The guides are docs/*.md but the two results pages: BENCHMARKS.md, which
# lists every run's record by design, and RELIABILITY.md, which the tests write and date. A guide may
# quote a figure, show a table that scripts/benchmarks_doc.py generates from a record, and link a
# notebook entry or a record; a date or a commit in its own text is a record left behind.
RESULT_PAGES = {"BENCHMARKS.md", "RELIABILITY.md"}
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
COMMIT = re.compile(r"`(?=[0-9a-f]*\d)[0-9a-f]{7,40}`|\bcommits? (?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")
GENERATED = re.compile(r"^<!-- ([\w-]+): .*? -->\n.*?^<!-- /\1 -->$", re.S | re.M)
RECORD_LINK = re.compile(r"\[[^\]]*\]\((?:\.\./)*(?:notebook|bench)/[^)]*\)")


def dated_records(text: str) -> list[str]:
    """The lines of a guide that name a date or a commit outside its generated blocks, its markers
    and its links to the notebook or a record."""
    text = GENERATED.sub("", text)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = RECORD_LINK.sub("", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)  # another link's target (an anchor may hold a date)
    return [line.strip() for line in text.splitlines() if DATE.search(line) or COMMIT.search(line)]


def test_a_dated_record_is_caught_and_a_generated_table_or_a_link_to_one_is_not():
    assert dated_records("## MSRA, whole (2026-11-28)\n") == ["## MSRA, whole (2026-11-28)"]
    assert dated_records("The student reaches 91.24 at\n`672e923`, the teacher 92.17.\n") == ["`672e923`, the teacher 92.17."]
    assert dated_records("measured at commit 52f93a2, one thread") != []
    allowed = ("<!-- nesting: docs/bench/cpu-cmeee-bilstm-2026-11-27 -->\n| a | 58.81 |\n- host vm; 2026-11-27\n"
               "<!-- /nesting -->\n<!-- recipe: docs/bench/gpu-loop-2026-11-27 configs/x.yaml -->\n"
               "the runs: [notebook](notebook/nested.md#2026-11-28-msra-whole), "
               "[cpu-distill-pd-2026-11-28](bench/cpu-distill-pd-2026-11-28/results.jsonl), "
               "[elsewhere](encoders.md#a-2026-11-27-heading), 1,097 lines, 20,864 sentences\n")
    assert dated_records(allowed) == []


def test_no_guide_holds_a_dated_record():
    """Issue 56: dated records had grown to most of docs/distillation.md, docs/nested.md and
    docs/confidence.md (the guides' how-to between runs' dates, commits and bench tables)."""
    found = [f"{page.name}: {line}" for page in sorted(DOCS.glob("*.md")) if page.name not in RESULT_PAGES
             for line in dated_records(page.read_text(encoding="utf-8"))]
    assert not found, "dated records in a guide (move them to docs/notebook/, leave a line and a link):\n" + "\n".join(found)
