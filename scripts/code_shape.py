"""How the package is shaped, for the restructuring notes: the longest functions, the largest
modules, and how a command flows through the modules (`--trace`).

    python scripts/code_shape.py                      # longest functions and largest modules
    python scripts/code_shape.py --trace -- train --config configs/demo.yaml --out /tmp/x --force

The trace runs the nerkit command in this process with a profiler hook and records every call from
one nerkit module into another. A call is "back up" when the module it enters is already on the
call stack below the caller: data that went down into a layer and comes back up to a layer above;
calls "both ways" join two modules that each call the other (neither is below the other).
"""

from __future__ import annotations

import ast
import inspect
import sys
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "nerkit"


def functions(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def shape(top: int = 5) -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    rel = {m: str(m.relative_to(PACKAGE.parent)) for m in modules}
    sizes = sorted(((len(m.read_text(encoding="utf-8").splitlines()), rel[m]) for m in modules), reverse=True)
    funcs = sorted(((n, f"{rel[m]}:{line} {name}") for m in modules for name, line, n in functions(m)), reverse=True)
    print(f"{len(modules)} modules, {sum(s for s, _ in sizes):,} lines")
    print("largest modules:", ", ".join(f"{name} ({n})" for n, name in sizes[:top]))
    print("longest functions:", ", ".join(f"{name} ({n} lines)" for n, name in funcs[:top]))


def trace(argv: list[str]) -> None:
    root = str(PACKAGE)
    stack: list[str | None] = []  # the nerkit module of each active frame (None: outside nerkit)
    entered: Counter = Counter()  # module -> distinct call sites from other modules
    edges: set[tuple[str, str, str, str]] = set()
    upward: set[tuple[str, str, str, str]] = set()

    def module_of(code) -> str | None:
        name = code.co_filename
        return name[len(root) - len("nerkit"):] if name.startswith(root) else None

    def hook(frame, event, arg):
        if event == "call":
            # Module and class bodies (run at import) are not the command's flow: only functions count.
            callee = module_of(frame.f_code) if frame.f_code.co_flags & inspect.CO_OPTIMIZED else None
            caller_frames = [m for m in stack if m is not None]
            if callee is not None and caller_frames and caller_frames[-1] != callee:
                caller = caller_frames[-1]
                edge = (caller, frame.f_back.f_code.co_name if frame.f_back else "?", callee, frame.f_code.co_name)
                if edge not in edges:
                    edges.add(edge)
                    entered[callee] += 1
                    if callee in caller_frames[:-1]:
                        upward.add(edge)
            stack.append(callee)
        elif event == "return" and stack:
            stack.pop()

    from nerkit.cli.app import main

    sys.argv = ["nerkit", *argv]
    sys.setprofile(hook)
    try:
        main()
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
    modules = sorted({m for e in edges for m in (e[0], e[2])})
    print(f"modules passed through: {len(modules)} ({', '.join(modules)})")
    print(f"distinct cross-module calls: {len(edges)}; entries per module: "
          + ", ".join(f"{m} {n}" for m, n in entered.most_common()))
    print(f"calls back up to a module already on the stack: {len(upward)}")
    for caller, fn, callee, target in sorted(upward):
        print(f"  {caller}:{fn} -> {callee}:{target}")
    pairs = {(a, b) for a, _, b, _ in edges}
    both_ways = sorted(e for e in edges if (e[2], e[0]) in pairs)
    print(f"calls between two modules that call each other: {len(both_ways)}")
    for caller, fn, callee, target in both_ways:
        print(f"  {caller}:{fn} -> {callee}:{target}")


if __name__ == "__main__":
    if "--trace" in sys.argv:
        trace(sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else [])
    else:
        shape()
