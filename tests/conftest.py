"""The tests' shared fixtures: the benchmark data root, a writer for small files in `tmp_path`, the tiny
config and model, the command line in this process. Plain helpers are in helpers.py."""

from __future__ import annotations

import os

# Tests run many small nerkit processes side by side: one torch thread each by default, whatever
# cores each finds free when it starts (nerkit/cores.py); tests of that choice set their own. Set
# before anything imports nerkit (helpers does), which decides when it is first imported.
os.environ.setdefault("NERKIT_FREE_CORES", "1")

from pathlib import Path

import pytest
from hypothesis import settings
from helpers import REPO, fixture_lm_vocab, run_cli, tiny_raw_config, write_lm

# Hypothesis's per-example deadline (200 ms) times the machine, not the code: on two cores shared
# with the other test worker, a first example that imports or warms a cache took 909 ms once and
# 2 ms when hypothesis ran it again, failing a correct test. The examples' count bounds the time.
settings.register_profile("nerkit", deadline=None)
settings.load_profile("nerkit")


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


@pytest.fixture(autouse=True)
def one_torch_thread_per_test(one_torch_thread):
    """Each test starts with one thread: whatever ran before it (a module's fixture that trains with
    train.threads 0, a command given --threads) may have set the count to the cores nerkit found free,
    which is 1 on a busy machine and 2 on an idle one, so a test that compares bytes across thread
    counts would pass or fail by the load of the machine it ran on."""
    import torch

    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A model directory trained once per session on the tiny corpus (dev F1 well above zero)."""
    from nerkit.config import build_config
    from nerkit.training.loop import train

    out = tmp_path_factory.mktemp("tiny_model") / "model"
    metrics = train(build_config(tiny_raw_config(), "<tiny config>"), out=out)
    assert metrics["dev"]["f1"] > 0.5, metrics
    return out


@pytest.fixture
def lm_dir(tmp_path) -> Path:
    """A tiny random BERT (helpers.write_lm) whose vocabulary has every character of the tiny corpora
    (test_lm, test_lm_adapt and test_distributed each ask for one of their own)."""
    pytest.importorskip("transformers")
    return write_lm(tmp_path / "tiny-lm", vocab=fixture_lm_vocab())


# ----------------------------------------------------------------------- the command line in-process

@pytest.fixture
def nerkit(monkeypatch, capfd):
    """`nerkit(*args, check=True)`: the command line through its real entry point (helpers.run_cli), in
    this process, where a matplotlib warning (a glyph missing from the fonts) is an error."""

    def run(*args: str, check: bool = True):
        result = run_cli(monkeypatch, capfd, *args)
        if check:
            assert result.returncode == 0, result.stderr
        return result

    return run
