"""Atomic file and directory writes: a reader (or a crash) sees the old version or the new one,
never a half-written file. New files and directories get the permissions the umask allows, as
any tool's do (tempfile's would be 0600 and 0700 whatever the umask)."""

from __future__ import annotations

import errno
import glob
import json
import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator

from nerkit.errors import UserError

# Failures the user fixes on their side: a full disk, a quota, a file size limit, permissions.
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS)
# The directory inside a training run's output directory that holds its checkpoint (written by
# `nerkit train`, read by `--resume` and by `nerkit bench --resume`).
CHECKPOINT = "checkpoint"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _new_sibling(path: Path, create: Callable[[Path], None]) -> Path:
    """Create a new temporary sibling `.NAME.RANDOM.tmp` of `path` with `create`, which must fail
    with FileExistsError when the name is taken."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            create(tmp)
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path.parent))


def _create_file(tmp: Path) -> None:
    # Mode 0o666 as open() uses: the kernel takes the umask off.
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))


@contextmanager
def atomic_file(path: str | Path) -> Iterator[BinaryIO]:
    """Yield a new file beside `path` to write into; when the block ends it is fsynced and renamed
    over `path`, and when the block raises anything (Ctrl-C included) it is removed. A `path` that
    is there and is no regular file (/dev/null, /dev/stdout, a named pipe) is written as it is:
    renamed over, a device would become a file (as root, /dev/null for every program)."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():
        with open(path, "wb") as f:
            yield f
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_sibling(path, _create_file)
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether `a` and `b` name one existing file, however spelt: another path, a symbolic or a hard link."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_writable(path: str | Path) -> None:
    """Raise a UserError now if a file could not be written at `path` (its directory missing, not
    a directory or not writable, or `path` itself a directory): a long job looks before it starts."""
    path = Path(path)
    parent = path.parent
    if path.is_dir():
        raise UserError("is a directory", where=str(path), fix="name a file to write")
    if not parent.exists():
        raise UserError(f"the directory {parent} does not exist", where=str(path), fix="create it first")
    if not parent.is_dir():
        raise UserError(f"{parent} is not a directory", where=str(path), fix="name a file inside a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"the directory {parent} is not writable", where=str(path),
                        fix="write somewhere else, or change the directory's permissions")


def check_input(path: str, key: str, missing: str, directory: bool = False, fix: str | None = None) -> None:
    """Raise a UserError now unless `path`, the value of the config key `key`, is a readable file
    (a directory, with `directory`): `KEY: MISSING` when nothing is there, saying where a relative
    path was looked for (the current directory; a config's paths are not relative to its file)."""
    kind = "directory" if directory else "file"
    if not os.path.exists(path):
        where = "" if os.path.isabs(path) else \
            f" in {os.getcwd()} (relative paths are read from the current directory, not the config file's)"
        raise UserError(f"{key}: {missing}{where}", where=path, fix=fix or "check the path")
    if not (os.path.isdir(path) if directory else os.path.isfile(path)):
        raise UserError(f"{key}: not a {kind}", where=path, fix=fix or f"give {key} the path of a {kind}")
    if not os.access(path, os.R_OK | (os.X_OK if directory else 0)):
        raise UserError(f"{key}: cannot read the {kind} (permission denied)", where=path)


def check_output(output: str | Path, *inputs: str | Path) -> None:
    """Raise a UserError now if a file could not be written at `output` (`check_writable`) or if
    `output` is one of the `inputs` the command reads, by any path or link: a command that writes
    a file looks before its work, and never writes over what it reads."""
    check_writable(output)
    for source in inputs:
        if same_file(source, output):
            raise UserError("is the input file: the output would replace it", where=str(output),
                            fix="write to another file")


def _inside(path: Path, directory: Path) -> bool:
    """Whether `path` is `directory` or lies somewhere under it (both resolved)."""
    return path == directory or directory in path.parents


def check_output_directory(out: str | Path, force: bool = False, own: Callable[[Path], bool] | None = None,
                           inputs: Iterable[str | Path] = (), option: str = "--out",
                           what: str = "an output of this command") -> Path:
    """Raise a UserError now unless a command may write the directory `out`; return it resolved.

    A directory that holds anything is written only with `force`, and then only if it is the
    command's own earlier output (`own` says so from its files; None: never). Whatever the flags,
    `out` is never a file, the current directory or one above it, nor one that holds (or is) an
    input the command reads: replacing it would delete the input. `inputs` may name files or
    directories; `what` says in a message what `own` recognises."""
    given, out = str(out), Path(out).resolve()
    if out.exists() and not out.is_dir():
        raise UserError(f"{option} is a file, not a directory", where=given, fix=f"choose a directory for {option}")
    if _inside(Path.cwd().resolve(), out):
        raise UserError(f"{option} is the current directory or holds it: writing it would replace everything there",
                        where=given, fix=f"name a new directory for {option}, e.g. {option} {Path(given) / 'out'}")
    for source in inputs:
        if _inside(Path(source).resolve(), out):
            raise UserError(f"{option} holds the input {source}: writing it would delete that input", where=given,
                            fix=f"choose a {option} outside {source}")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise UserError(f"{option} is a directory that is not empty", where=given,
                            fix=f"choose a new {option}, or pass --force to replace {what}")
        if own is None or not own(out):
            raise UserError(f"{option} is not empty and is not {what}: nerkit replaces only its own output",
                            where=given, fix=f"choose a new {option}, or empty that directory yourself")
    existing = next(p for p in (out, *out.parents) if p.exists())  # where the command creates what is missing
    if not existing.is_dir():
        raise UserError(f"{existing} is not a directory", where=given, fix=f"choose another {option}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"cannot write in {existing} (permission denied)", where=given, fix=f"choose another {option}")
    return out


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, fsync it, then rename it over `path`."""
    with atomic_file(path) as f:
        f.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


@contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory beside `path`; on success it replaces `path` in one rename.

    An existing `path` is first moved aside and removed only after the new one is in place, so a
    crash at any instant leaves a complete old or a complete new directory: the old one may be
    left only as the `.old` sibling, which `recover_directory` (run first here, and by readers
    that can afford to write) renames back. Stray `.tmp` siblings of crashed writes are removed.
    """
    path = Path(path).resolve()  # `.` or `..` has no name to put a sibling beside
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_directory(path)
    for stray in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        shutil.rmtree(stray, ignore_errors=True)
    tmp = _new_sibling(path, lambda p: os.mkdir(p, 0o777))  # the kernel takes the umask off
    try:
        yield tmp
        for child in tmp.rglob("*"):
            if child.is_file():
                with open(child, "rb") as f:
                    os.fsync(f.fileno())
        old = path.with_name(f".{path.name}.old")
        if old.exists():
            shutil.rmtree(old)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        if old.exists():
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def recover_directory(path: str | Path) -> None:
    """Undo a crash between `atomic_directory`'s two renames: `path` is gone but its old version
    waits as the `.old` sibling, so put it back."""
    path = Path(path)
    old = path.with_name(f".{path.name}.old")
    if not path.exists() and old.is_dir():
        os.replace(old, path)
        _fsync_dir(path.parent)


def read_json_lines(path: str | Path, what: str, fix: str | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSON-lines file that nerkit wrote (metrics,
    results); a line that is not a JSON object is a UserError naming the file and line. Whether the
    object holds the right keys is the caller's to check."""
    path = Path(path)
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            raise UserError(f"not {what}", where=f"{path}:{number}", fix=fix)
        yield number, record
