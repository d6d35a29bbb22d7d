"""The package's import rule, as a test: every module's imports (function-level ones included) run
down the layers of docs/architecture.md and never in a circle.

    cli -> anything; tools -> training, inference, pretrained, features, model, data, base;
    training -> inference, model, pretrained, features, data, base; inference -> model, pretrained,
    features, data, base; model -> features, data, base; pretrained -> data, base;
    features -> data, base; data -> base.

The base is the top-level modules (config, errors, files, log, device, version); `nerkit` itself
(`__init__`: `load`, `__version__`) is the public front and is imported by nobody inside.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "nerkit"

BASE = "base"
MAY_IMPORT = {
    "cli": {"cli", "tools", "training", "inference", "model", "pretrained", "features", "data", BASE, "front"},
    "tools": {"tools", "training", "inference", "pretrained", "features", "model", "data", BASE},
    "training": {"training", "inference", "model", "pretrained", "features", "data", BASE},
    "inference": {"inference", "model", "pretrained", "features", "data", BASE},
    "model": {"model", "features", "data", BASE},
    "pretrained": {"pretrained", "data", BASE},
    "features": {"features", "data", BASE},
    "data": {"data", BASE},
    BASE: {BASE},
    "front": {"cli", "inference", BASE},  # __init__ (load) and __main__ (the CLI)
}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> str:
    """The layer a module belongs to: its subpackage, `base` for the top-level modules, `front` for
    the package itself and `__main__`."""
    parts = module.split(".")
    if module in ("nerkit", "nerkit.__main__"):
        return "front"
    if len(parts) == 2 and not (PACKAGE / parts[1]).is_dir():
        return BASE
    return parts[1]


def imports(path: Path, package: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, module) of every nerkit module `path` imports, at any depth of the file; `from X import
    Y` where X.Y is a module counts as importing X.Y."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "nerkit"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "nerkit":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                as_path = package.parent.joinpath(*sub.split("."))
                found.append((node.lineno, sub if as_path.with_suffix(".py").is_file() or as_path.is_dir() else node.module))
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}:{node.lineno}: relative import; write the absolute module")
    return found


def graph(package: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {imported module: line}."""
    edges = {}
    for path in sorted(package.rglob("*.py")):
        edges[module_name(path, package)] = {target: line for line, target in imports(path, package)}
    return edges


def violations(edges: dict[str, dict[str, int]], package: Path = PACKAGE) -> list[str]:
    bad = []
    for source, targets in edges.items():
        for target, line in targets.items():
            src, dst = layer(source), layer(target)
            if dst not in MAY_IMPORT[src]:
                bad.append(f"{source}:{line} imports {target} ({src} -> {dst})")
    return bad


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Every circle of imports between modules (strongly connected components of more than one
    module, or a module importing itself). A package's `__init__` importing its own members is an
    edge like any other."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, {}):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_import_runs_down_the_layers():
    assert violations(graph()) == []


def test_no_import_circles():
    assert cycles(graph()) == []


def test_every_subpackage_says_what_it_owns():
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and "TODO" not in doc, init


def test_every_module_opens_with_a_docstring():
    for path in PACKAGE.rglob("*.py"):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        assert doc and "TODO" not in doc, path


@pytest.mark.parametrize("source, line, expected", [
    ("nerkit/data/tags.py", "from nerkit.training.loop import train", "data -> training"),
    ("nerkit/inference/pipeline.py", "    from nerkit.training.build import build_pipeline", "inference -> training"),
    ("nerkit/pretrained/base.py", "from nerkit.features.featurizer import Vocab", "pretrained -> features"),
    ("nerkit/features/lexicon.py", "import nerkit.pretrained.vectors", "features -> pretrained"),
    ("nerkit/config.py", "from nerkit.cli.app import app", "base -> cli"),
    ("nerkit/model/crf.py", "from nerkit import load", "model -> front"),
])
def test_the_rule_catches_an_upward_import(tmp_path, source, line, expected):
    """The checks fail on a copy of the package with one import against the rule added (a function-
    level one included), so a passing run means something."""
    import shutil

    copy = tmp_path / "nerkit"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / source
    text = path.read_text(encoding="utf-8")
    body = f"\n\ndef _probe():\n{line if line.startswith(' ') else '    ' + line}\n" if line.startswith(" ") else f"\n{line}\n"
    path.write_text(text + body, encoding="utf-8")
    found = violations(graph(copy), copy)
    assert len(found) == 1 and expected in found[0], found


def test_the_rule_catches_a_circle(tmp_path):
    import shutil

    copy = tmp_path / "nerkit"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    path = copy / "data" / "tags.py"  # tags is imported by data.corpus: importing it back closes a circle
    path.write_text(path.read_text(encoding="utf-8") + "\n\ndef _probe():\n    from nerkit.data.corpus import Corpus\n",
                    encoding="utf-8")
    # The circle holds both (and the other modules on a path between them: data.records, data.annotation).
    assert any({"nerkit.data.corpus", "nerkit.data.tags"} <= set(circle) for circle in cycles(graph(copy)))


def test_the_console_script_is_the_cli_function():
    """`nerkit` on the PATH runs `nerkit.cli:main`: the package's `main`, not its `app` module."""
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "nerkit"]
    assert script.value == "nerkit.cli:main" and callable(script.load()) and script.load().__module__ == "nerkit.cli.app"
