"""A language model named as on the Hugging Face hub (`embeddings.lm.path: org/name`) is read from
the local Hugging Face cache, where `huggingface-cli download` or transformers put it; nerkit never
downloads. Torch-free: a dry run resolves the name too."""

from __future__ import annotations

import os
import re
from pathlib import Path

from nerkit.errors import UserError
from nerkit.files import check_input

# A hub model id: a name, or an owner and a name (letters, digits, '-', '_', '.'), not a path.
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def hub_cache() -> Path:
    """The Hugging Face cache's `hub` folder, found as huggingface_hub finds it: HF_HUB_CACHE (or
    the older HUGGINGFACE_HUB_CACHE), else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub, else
    ~/.cache/huggingface/hub."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.environ[variable]).expanduser()
    home = os.environ.get("HF_HOME") or \
        os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def cached_snapshot(name: str) -> Path | None:
    """The snapshot directory of hub model `name` in the local cache: the one `refs/main` names, or
    the only one there is; None when the name is not a hub id or the model is not cached."""
    if not HUB_NAME.fullmatch(name):
        return None
    repo = hub_cache() / f"models--{name.replace('/', '--')}"
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        commit = ref.read_text(encoding="utf-8", errors="replace").strip()
        if commit and (snapshots / commit).is_dir():
            return snapshots / commit
    found = [p for p in snapshots.iterdir() if p.is_dir()] if snapshots.is_dir() else []
    return found[0] if len(found) == 1 else None


def lm_directory(path: str | Path, key: str, fix: str) -> Path:
    """The directory of a language model given as `path` (the value of `key`): the path itself when
    something is there, else the cached snapshot of a hub model of that name. A UserError says
    where both were looked for, and how to point at a snapshot."""
    path = str(path)
    snapshot = None if os.path.exists(path) else cached_snapshot(path)
    if snapshot is not None:
        return snapshot
    if not os.path.exists(path) and HUB_NAME.fullmatch(path):
        cache = hub_cache()
        raise UserError(
            f"{key}: no directory {path} in {os.getcwd()}, and no Hugging Face model {path} in the local "
            f"cache {cache} (HF_HUB_CACHE, else HF_HOME/hub)", where=path,
            fix=f"nerkit never downloads: fetch it once (`huggingface-cli download {path}`) and give its name "
                f"again, or give the directory that holds it, such as its snapshot "
                f"{cache / ('models--' + path.replace('/', '--'))}/snapshots/<commit>; or {fix}")
    check_input(path, key, "language-model directory not found", directory=True, fix=fix)
    return Path(path)
