"""The terms a pretrained part comes with. A language model's directory says them in a LICENSE file,
a model card's `license:` front matter (Hugging Face's README.md), or the SOURCE.json that
scripts/fetch_lm.py writes (m3e-small: research use only); LAC is Apache-2.0. They are carried into
a model directory's lm/ (nerkit_licence.json beside the upstream files), and read back, torch-free,
for the model card, the export and the server's /info. What nothing says is said to be unknown."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from nerkit.pretrained.vocab import LM_DIR

LICENCE_FILE = "nerkit_licence.json"

UNKNOWN = "unknown: see the source"

# Upstream files carried into lm/ as they are: licence texts, the model card, fetch_lm's record.
CARRIED = ("LICENSE", "LICENSE.txt", "LICENSE.md", "LICENCE", "LICENCE.txt", "LICENCE.md", "COPYING", "NOTICE",
           "README.md", "SOURCE.json")

LAC_LICENCE = "Apache-2.0 (Baidu's LAC, as jieba bundles it)"

JIEBA_LICENCE = "MIT (jieba's dictionary)"


@dataclass
class Terms:
    """What one pretrained part is and under which terms: `licence` a licence's name or UNKNOWN,
    `terms` further words of its source, `files` the upstream files carried with it (name -> bytes)."""

    model: str
    licence: str = UNKNOWN
    terms: str | None = None
    files: dict[str, bytes] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict:
        return {"model": self.model, "licence": self.licence, "terms": self.terms, "files": sorted(self.files)}

    def said(self) -> str:
        """One line: the licence, then the terms when there are any."""
        return self.licence + (f"; {self.terms}" if self.terms and self.terms != self.licence else "")


def read_terms(directory: str | Path, default: str | None = None) -> Terms:
    """The terms of a language model's directory: nerkit's own record when it holds one (a model
    directory's lm/), else the model card's `license:`, SOURCE.json's `licence` or `terms`, `default`
    (what nerkit knows of the kind), a LICENSE file's name, or UNKNOWN, in that order."""
    directory = Path(directory)
    files = {name: (directory / name).read_bytes() for name in CARRIED if (directory / name).is_file()}
    record = _json(directory / LICENCE_FILE)
    if record:
        return Terms(str(record.get("model") or directory.name), str(record.get("licence") or UNKNOWN),
                     record.get("terms"), files)
    source = _json(directory / "SOURCE.json")
    terms = source.get("terms") if isinstance(source.get("terms"), str) else None
    text_file = next((name for name in files if name not in ("README.md", "SOURCE.json")), None)
    licence = (_card_licence(files.get("README.md")) or source.get("licence") or terms or default
               or (f"see {text_file}" if text_file else UNKNOWN))
    return Terms(directory.name, str(licence), terms, files)


def write_terms(directory: str | Path, terms: Terms | None) -> None:
    """Carry `terms` into `directory` (an lm/ being written): the upstream files and nerkit's record."""
    from nerkit.files import atomic_write_bytes, atomic_write_text

    directory = Path(directory)
    terms = terms or Terms(directory.name)
    for name, data in terms.files.items():
        atomic_write_bytes(directory / name, data)
    atomic_write_text(directory / LICENCE_FILE, json.dumps(terms.to_dict(), indent=2, ensure_ascii=False) + "\n")


def model_terms(model_dir: str | Path) -> list[dict]:
    """The terms of every language model a model directory (or its export) holds, in the order of
    its config (lm/, or lm/0/, lm/1/, ...); [] without one."""
    lm = Path(model_dir) / LM_DIR
    if not lm.is_dir():
        return []
    stacked, k = [], 0
    while (lm / str(k)).is_dir():
        stacked.append(lm / str(k))
        k += 1
    return [read_terms(d).to_dict() for d in (stacked or [lm])]


def file_terms(path: str | Path) -> Terms:
    """The terms of a vector file or a word list: its folder's nerkit_licence.json or licence file."""
    path = Path(path)
    found = read_terms(path.parent)
    return Terms(path.name, found.licence, found.terms)


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _card_licence(card: bytes | None) -> str | None:
    """A Hugging Face model card's `license:` (and `license_name:` for "other"), from its front matter."""
    if not card or not card.startswith(b"---"):
        return None
    head = card.decode("utf-8", "replace").split("\n---", 1)[0].removeprefix("---")
    try:
        meta = yaml.safe_load(head)
    except yaml.YAMLError:
        return None
    if not isinstance(meta, dict) or not meta.get("license"):
        return None
    licence = meta["license"]
    licence = ", ".join(map(str, licence)) if isinstance(licence, list) else str(licence)
    name = meta.get("license_name")
    return f"{licence} ({name})" if licence == "other" and name else licence
