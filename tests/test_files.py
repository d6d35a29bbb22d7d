"""Tests for the atomic writers of nerkit/files.py: what they leave behind when the write fails, and
the permissions of what they create (the umask's, as any tool's)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nerkit.files import atomic_directory, atomic_write_bytes, atomic_write_text


@pytest.fixture
def umask():
    """`umask(0o027)` sets the process umask for the rest of the test; the old one comes back after."""
    before = os.umask(0o022)
    os.umask(before)
    yield lambda mask: os.umask(mask)
    os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077, 0o002])
def test_written_files_and_directories_honour_the_umask(tmp_path, umask, mask):
    """Another account can read a trained model when the umask lets it (tempfile's 0600/0700 did not)."""
    umask(mask)
    atomic_write_text(tmp_path / "a.txt", "x")
    atomic_write_bytes(tmp_path / "b.bin", b"x")
    with atomic_directory(tmp_path / "model") as tmp:
        atomic_write_text(tmp / "config.yaml", "x")
    assert mode(tmp_path / "a.txt") == mode(tmp_path / "b.bin") == 0o666 & ~mask
    assert mode(tmp_path / "model") == 0o777 & ~mask
    assert mode(tmp_path / "model" / "config.yaml") == 0o666 & ~mask


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path, error):
    from nerkit.files import atomic_file

    target = tmp_path / "out.jsonl"
    target.write_text("old\n")
    with pytest.raises(error):
        with atomic_file(target) as f:
            f.write(b"half a record")
            raise error()
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def test_atomic_file_replaces_the_target_when_the_block_ends(tmp_path):
    from nerkit.files import atomic_file

    target = tmp_path / "sub" / "out.jsonl"
    with atomic_file(target) as f:
        f.write(b"new\n")
        assert not target.exists()
    assert target.read_bytes() == b"new\n"
    assert [p.name for p in target.parent.iterdir()] == ["out.jsonl"]


def test_a_device_or_a_pipe_is_written_as_it_is_never_replaced(tmp_path):
    """`--output /dev/null` (what `nerkit bench predict` passes) renamed over made /dev/null a regular
    file for every program on the machine; a named pipe stands in for it here."""
    import stat
    import threading

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    received = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_bytes()), daemon=True)
    reader.start()
    atomic_write_text(pipe, "written through\n")
    reader.join(timeout=10)
    assert stat.S_ISFIFO(os.stat(pipe).st_mode) and received == [b"written through\n"]
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]  # no temporary sibling left
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
