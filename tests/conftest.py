"""Shared test helpers: the benchmark data root and a writer for small files in `tmp_path`."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest

# Tests run many small nerkit processes side by side: one torch thread each by default, whatever
# cores each finds free when it starts (nerkit/cores.py); tests of that choice set their own.
os.environ.setdefault("NERKIT_FREE_CORES", "1")

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The benchmark data (NERKIT_DATA, else the repo's ../shared/data); skips when it is absent."""
    root = Path(os.environ.get("NERKIT_DATA") or REPO.parent / "shared" / "data")
    if not root.is_dir():
        pytest.skip(f"benchmark data not found at {root} (set NERKIT_DATA)")
    return root


@pytest.fixture
def write_file(tmp_path):
    """`write_file(content, name)` writes str (as UTF-8, exactly as given) or bytes; returns the path."""

    def write(content: str | bytes, name: str = "corpus.bio") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        return path

    return write


# ----------------------------------------------------------------------- tiny models (model tests)

TINY_TRAIN = FIXTURES / "tiny_train.bio"
TINY_DEV = FIXTURES / "tiny_dev.bio"


def tiny_raw_config() -> dict:
    """A config dict for a model that trains in a second or two on the tiny fixture corpus."""
    return {
        "data": {"train": str(TINY_TRAIN), "dev": str(TINY_DEV), "max_len": 250},
        "embeddings": {"char_dim": 16, "bichar_dim": 8, "dropout": 0.0},
        "encoder": {"name": "bilstm", "hidden_size": 16},
        "train": {"epochs": 6, "batch_size": 8, "lr": 0.02, "patience": 0, "seed": 1, "device": "cpu"},
    }


@pytest.fixture(scope="session")
def tiny_config():
    """`tiny_config("train.epochs=2", ...)`: the tiny config with `--set`-style overrides applied."""
    from nerkit.config import build_config

    def make(*overrides: str):
        return build_config(tiny_raw_config(), "<tiny config>", list(overrides))

    return make


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on shared cores a second thread makes each
    step several times slower. The count is process-wide (a config's train.threads changes it too),
    so the original is restored when the session ends."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A model directory trained once per session on the tiny corpus (dev F1 well above zero)."""
    from nerkit.config import build_config
    from nerkit.training.loop import train

    out = tmp_path_factory.mktemp("tiny_model") / "model"
    metrics = train(build_config(tiny_raw_config(), "<tiny config>"), out=out)
    assert metrics["dev"]["f1"] > 0.5, metrics
    return out


# ----------------------------------------------------------------------- the command line in-process

class CliRun(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def nerkit(monkeypatch, capfd):
    """`nerkit(*args, check=True)`: the command line through its real entry point (`main`, which
    maps a UserError to exit code 2), in this process, where a matplotlib warning (a glyph missing
    from the fonts) is an error."""
    from nerkit.cli.app import main

    def run(*args: str, check: bool = True) -> CliRun:
        monkeypatch.setattr(sys, "argv", ["nerkit", *args])
        with pytest.raises(SystemExit) as info:
            main()
        out, err = capfd.readouterr()
        result = CliRun(info.value.code or 0, out, err)
        if check:
            assert result.returncode == 0, result.stderr
        return result

    return run


# ----------------------------------------------------------------------- processes that serve on a port

def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(process, url: str, seconds: float, log: Path) -> None:
    """Poll `url` until it answers 200, failing with the process's log if the process ends first or
    `seconds` pass: a server started by a test is up before the test talks to it."""
    import time

    import httpx

    deadline = time.monotonic() + seconds
    while True:
        output = log.read_text(encoding="utf-8", errors="replace")[-3000:] if log.exists() else ""
        assert process.poll() is None, f"{url}: the server ended ({process.returncode}):\n{output}"
        assert time.monotonic() < deadline, f"no answer from {url} after {seconds} s:\n{output}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)


def stop(process, seconds: float = 30) -> None:
    """SIGTERM, then SIGKILL if the process has not ended `seconds` later."""
    import signal
    import subprocess

    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Server(NamedTuple):
    process: object  # subprocess.Popen
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


SERVER_STARTUP = 120  # seconds a server may take to start on a busy machine


@contextmanager
def serving(model_dir: Path, log_dir: Path, *options: str) -> Iterator[Server]:
    """`python -m nerkit serve` on a free port of 127.0.0.1, ready (its /health answers); SIGTERM,
    then SIGKILL if it has not ended 30 s later, when the block ends."""
    import subprocess

    port = free_port()
    log = log_dir / f"serve-{port}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "nerkit", "serve", "--model", str(model_dir),
                                    "--host", "127.0.0.1", "--port", str(port), "--threads", "1", *options],
                                   cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    server = Server(process, f"http://127.0.0.1:{port}", log)
    try:
        wait_until_up(process, f"{server.url}/health", SERVER_STARTUP, log)
        yield server
    finally:
        stop(process)
