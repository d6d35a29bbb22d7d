"""A teacher's targets on an unlabelled text, cached on disk for `nerkit distill`: per sequence, the
teacher's best path (Viterbi) and, where they are read (`TargetOptions.marginals`), its marginals
(float16, (length, K)), in safetensors shards with a JSON manifest. One cache per (teacher, text)
pair, in a directory named by its key: the sha256 of the teacher's files, of the text file, and of
the reading options (`TargetOptions`). An unchanged pair reuses its cache; a changed teacher or text
gets a new key, so a new cache. A killed build continues at its first missing shard.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from nerkit.errors import UserError
from nerkit.data.stats import sha256_file
from nerkit.files import atomic_write_bytes, atomic_write_text
from nerkit.inference.model_dir import CONFIG_FILE, META_FILE, VOCAB_FILE, WEIGHTS_FILE
from nerkit.log import progress_display

log = logging.getLogger(__name__)

CACHE_FORMAT = 1  # bump when what a shard holds changes: old caches then get new keys
SHARD_UNITS = 4096  # sequences per shard: what a killed build scores again at most
MANIFEST = "manifest.json"
TEACHER_FILES = (WEIGHTS_FILE, META_FILE, CONFIG_FILE, VOCAB_FILE)


def default_cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nerkit" / "distill"


def teacher_sha256(directory: Path) -> str:
    """One checksum of what makes a teacher's predictions: its weights, nerkit.json, config and vocabulary."""
    digest = hashlib.sha256()
    for name in TEACHER_FILES:
        path = directory / name
        digest.update(f"{name}:{sha256_file(path) if path.is_file() else '-'}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class TargetOptions:
    """How a teacher's targets on one text are made: the text's sequences of `window` characters,
    less the lines taken out (`lines_sha256`, of the lines kept); its best paths, and with
    `marginals` its marginals at `temperature` (`nerkit.training.distill.marginals_read` says
    when they are read: soft targets, or several teachers)."""
    window: int
    temperature: float = 1.0
    lines_sha256: str = ""
    marginals: bool = True

    def keyed(self) -> dict:
        """What the cache key and the manifest hold: what changes the targets. With marginals, the
        keys caches had before `marginals` existed (so those are still found); without, no
        temperature (a best path does not depend on it) and `marginals: false`."""
        if self.marginals:
            return {"window": self.window, "temperature": self.temperature, "lines_sha256": self.lines_sha256}
        return {"window": self.window, "lines_sha256": self.lines_sha256, "marginals": False}


def cache_key(teacher_sha: str, text_sha: str, options: TargetOptions) -> str:
    reading = json.dumps({"format": CACHE_FORMAT, **options.keyed()}, sort_keys=True)
    return hashlib.sha256(f"{teacher_sha}\n{text_sha}\n{reading}".encode()).hexdigest()


@dataclass
class TeacherTargets:
    """A teacher's targets on one text's sequences: `marginals` (total characters, K) float16, or
    None where they were not asked for, and `paths` (total characters,) in the teacher's tag order
    `tags`, sequence i at offsets[i]:offsets[i+1]."""
    tags: list[str]
    marginals: torch.Tensor | None
    paths: torch.Tensor
    offsets: list[int]
    key: str
    directory: Path
    scored: int  # sequences the teacher scored in this call (0: the cache was complete)

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.directory.iterdir() if p.is_file())


def cached_targets(pipe, teacher_dir: Path, teacher_sha: str, text_sha: str, units: list[list[str]],
                   options: TargetOptions, root: Path, batch_size: int = 128, progress_bar: bool | None = None,
                   shard_units: int = SHARD_UNITS) -> TeacherTargets:
    """The targets of teacher `pipe` (loaded from `teacher_dir`) on `units`, from the cache under
    `root` where it has them, scoring the missing shards (and writing each as it is done)."""
    key = cache_key(teacher_sha, text_sha, options)
    directory = root / key[:32]
    manifest = read_manifest(directory, key)
    if manifest is None:
        manifest = {"key": key, "teacher": str(teacher_dir), "teacher_sha256": teacher_sha, "text_sha256": text_sha,
                    "options": options.keyed(), "tags": list(pipe.tags), "units": len(units),
                    "characters": sum(map(len, units)), "marginals_dtype": "float16" if options.marginals else None,
                    "shards": []}
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot create the distillation cache ({e.strerror})", where=str(directory),
                            fix="set distill.cache to a writable directory") from None
    done = {shard["first"] for shard in manifest["shards"] if (directory / shard["file"]).is_file()}
    manifest["shards"] = [shard for shard in manifest["shards"] if shard["first"] in done]
    todo = [first for first in range(0, len(units), shard_units) if first not in done]
    scored = 0
    if todo:
        left = sum(min(shard_units, len(units) - first) for first in todo)
        log.info(f"teacher {teacher_dir}: scoring {left:,} of {len(units):,} sequences into {directory}")
        bar = progress_display(f"teacher {teacher_dir.name}", len(units), "seq", initial=len(units) - left,
                               shown=progress_bar)
        try:
            for first in todo:
                chunk = units[first:first + shard_units]
                write_shard(directory, manifest, first, score(pipe, chunk, options, batch_size, bar))
                scored += len(chunk)
        finally:
            bar.close()
    return load_targets(directory, manifest, scored)


def read_manifest(directory: Path, key: str) -> dict | None:
    path = directory / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # a damaged manifest: the cache is built again
    return manifest if manifest.get("key") == key else None


def score(pipe, units: list[list[str]], options: TargetOptions, batch_size: int, bar) -> dict:
    """The teacher's best paths of `units`, concatenated, and with `options.marginals` its marginals
    (at options.temperature): a forward-backward per batch that a run reading none does not pay."""
    marginals: list = [None] * len(units)
    paths: list = [None] * len(units)
    for rows, emissions, mask, best in pipe.decoded_windows(units, batch_size, window=options.window):
        for (i, _), path in zip(rows, best):
            paths[i] = torch.tensor(path, dtype=torch.int16)
        if options.marginals:
            probs = pipe.model.head.crf.marginals(emissions, mask, options.temperature)  # (B, T, K) float64
            for (i, _), row, path in zip(rows, probs, best):
                marginals[i] = row[:len(path)].to(torch.float16).cpu()
        bar.update(len(rows))
    found = {"paths": torch.cat(paths), "lengths": torch.tensor([len(u) for u in units], dtype=torch.int32)}
    if options.marginals:
        found["marginals"] = torch.cat(marginals)
    return found


def write_shard(directory: Path, manifest: dict, first: int, tensors: dict) -> None:
    """The shard's file, then the manifest that lists it: a kill between the two costs the shard alone."""
    name = f"shard-{first:09d}.safetensors"
    atomic_write_bytes(directory / name, safetensors_bytes({k: v.contiguous() for k, v in tensors.items()}))
    manifest["shards"] = sorted(manifest["shards"] + [{"file": name, "first": first, "count": len(tensors["lengths"])}],
                                key=lambda shard: shard["first"])
    atomic_write_text(directory / MANIFEST, json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")


def load_targets(directory: Path, manifest: dict, scored: int) -> TeacherTargets:
    parts = [load_file(str(directory / shard["file"])) for shard in manifest["shards"]]
    lengths = [int(n) for part in parts for n in part["lengths"]]
    if len(lengths) != manifest["units"]:
        raise UserError("the distillation cache is incomplete", where=str(directory),
                        fix="delete that directory and run again")
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    num_tags = len(manifest["tags"])
    marginals = None
    if manifest["marginals_dtype"] is not None:
        marginals = torch.cat([p["marginals"] for p in parts]) if parts else torch.zeros(0, num_tags, dtype=torch.float16)
    paths = torch.cat([p["paths"] for p in parts]) if parts else torch.zeros(0, dtype=torch.int16)
    return TeacherTargets(manifest["tags"], marginals, paths, offsets, manifest["key"], directory, scored)
