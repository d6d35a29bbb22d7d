"""The model versions of Label Studio's training loop on disk: one directory a finished job
(`MODELS/v3-20261130T101500`), and `MODELS/served.json`, written atomically, naming the one the
server serves, so that a restart serves it again. The model the server started with is served
until a job's model replaces it. `prune` keeps the newest versions and never the served one's."""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from nerkit.errors import UserError
from nerkit.files import atomic_write_text

SERVED = "served.json"
JOBS = ".jobs"  # a job's working directory lives here until its model is a version
VERSION_NAME = re.compile(r"^v(\d+)-\d{8}T\d{6}$")


def version_name(number: int, when: float | None = None) -> str:
    """`v3-20261130T101500`: the version's number and the time (UTC) its job finished."""
    return f"v{number}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime(when))}"


@dataclass(frozen=True)
class Served:
    """The model being served: its version's name and its directory."""

    version: str
    path: Path


class VersionStore:
    """The versions under `root` (a directory of its own, made if absent)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise UserError("not a directory", where=str(self.root), fix="pass --models a directory for the model versions")
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / JOBS).mkdir(exist_ok=True)

    @property
    def jobs(self) -> Path:
        return self.root / JOBS

    def versions(self) -> list[str]:
        """The version directories, oldest first."""
        found = [p.name for p in self.root.iterdir() if p.is_dir() and VERSION_NAME.match(p.name)]
        return sorted(found, key=lambda name: int(VERSION_NAME.match(name).group(1)))

    def next_name(self, when: float | None = None) -> str:
        """The name of the next version: one more than the highest number on disk."""
        numbers = [int(VERSION_NAME.match(v).group(1)) for v in self.versions()]
        return version_name(max(numbers, default=0) + 1, when)

    def served(self, initial: Served) -> Served:
        """The version served.json names, or `initial` (the server's --model) before any was."""
        path = self.root / SERVED
        if not path.is_file():
            return initial
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            served = Served(record["version"], Path(record["path"]))
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(f"not the record of a served version ({e})", where=str(path),
                            fix="remove it to serve --model again, or restore it") from None
        if not served.path.is_absolute():
            served = Served(served.version, self.root / served.path)
        if not served.path.is_dir():
            raise UserError(f"the served version {served.version} is not there ({served.path})", where=str(path),
                            fix="remove served.json to serve --model again")
        return served

    def serve(self, served: Served, scores: dict | None = None) -> None:
        """Record `served` as the served version (atomically: a crash leaves the old record or the new)."""
        path = served.path.name if served.path.parent.resolve() == self.root.resolve() else str(served.path.resolve())
        record = {"version": served.version, "path": path, "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  **({"scores": scores} if scores else {})}
        atomic_write_text(self.root / SERVED, json.dumps(record, ensure_ascii=False, indent=2) + "\n")

    def prune(self, keep: int, served: Served) -> list[str]:
        """Remove all but the `keep` newest versions (the served one is always kept, beyond them);
        the names removed."""
        versions = self.versions()
        old = versions[:-keep] if keep > 0 else versions
        removed = [v for v in old if (self.root / v).resolve() != served.path.resolve()]
        for name in removed:
            shutil.rmtree(self.root / name, ignore_errors=True)
        return removed
