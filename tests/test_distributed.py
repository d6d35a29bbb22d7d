"""Data-parallel training (nerkit.training.distributed) in real processes on gloo: a run of two processes
writes what a run of one does, once; its weights after the same steps equal those of one process
with the same global batch (BiLSTM, Transformer, a fine-tuned tiny BERT); Ctrl-C stops every rank
at one step and the run resumes exactly, on two processes or on one; a rank that is killed or
falls silent ends the job in bounded time, with a message that says so.

The processes are started by torchrun, through `nerkit train --nproc 2` or `python -m
torch.distributed.run` on a free port; they take one thread each.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import bert_config, checkpoint_step, fixture_lm_vocab, free_port, tiny_raw_config, wait_for_step, write_lm
from helpers import nerkit_command
from safetensors.torch import load_file

import nerkit
from nerkit.config import build_config
from nerkit.errors import ConfigError, UserError
from nerkit.training.distributed import (
    World,
    check_batch_size,
    resume_command,
    without_nproc,
)

pytestmark = pytest.mark.slow  # every test here starts torchrun or trains several processes

REPO = Path(__file__).resolve().parent.parent
# The package's own directory, exactly: a checkout named `nerkit` (a clone's default name) has
# `/nerkit/` in every path under it, torchrun's own through `<clone>/.venv` included.
PACKAGE_DIR = str(Path(nerkit.__file__).parent) + os.sep
# A run of one epoch is 8 steps of 8 sentences (60 sentences: the last batch has 4); a checkpoint
# every 3 steps. The BiLSTM's output dropout (0.3) is on: each rank draws its own.
TINY = ["train.epochs=3", "train.checkpoint_every=3", "train.threads=1"]
# Dropout off, for runs whose weights are compared across world sizes, and how close they must be.
NO_DROPOUT = ["embeddings.dropout=0", "encoder.dropout=0"]
CLOSE = {"rtol": 1e-5, "atol": 1e-6}

# Runs `nerkit` as a torchrun worker after arranging a fault on rank 1: FAULT N, then the nerkit
# arguments. sigint: Ctrl-C reaches rank 1 alone as it assembles its Nth batch; hang: rank 1 stops
# answering there (a process that is alive but stuck); data: rank 1 reads a training file of other
# contents (its checksum), as a node with its own copy of the data might.
FAULTS = r"""
import os, signal, sys, time
fault, n = sys.argv[1], int(sys.argv[2])
sys.argv = ["nerkit", *sys.argv[3:]]
import nerkit.training.loop as T
if os.environ["RANK"] == "1":
    calls, collate = [0], T.collate
    def patched(examples):
        calls[0] += 1
        if calls[0] == n and fault == "sigint":
            os.kill(os.getpid(), signal.SIGINT)
        if calls[0] == n and fault == "hang":
            time.sleep(600)
        return collate(examples)
    T.collate = patched
    if fault == "data":
        read_splits = T.read_splits
        def other_data(config):
            splits = read_splits(config)
            splits.checksums = {**splits.checksums, "train": "0" * 64}
            return splits
        T.read_splits = other_data
from nerkit.cli.app import main
main()
"""

# Trains each (out, config, overrides) of a JSON file in turn, every rank of one process group.
SEVERAL_RUNS = r"""
import json, sys
import torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo")
from nerkit.config import build_config
from nerkit.training.loop import train
for out, raw, overrides in json.load(open(sys.argv[1])):
    train(build_config(raw, "<test>", overrides), out=out, progress_bar=False)
dist.destroy_process_group()
"""


def environment() -> dict:
    """The tests' processes import this checkout's nerkit and use one thread each."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def torchrun(*args) -> list[str]:
    """The command that starts two processes of `args` on this machine, as a user would."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=localhost:{free_port()}", *map(str, args)]


def run(command: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=REPO, env=environment(), capture_output=True, text=True, errors="replace",
                          timeout=timeout)


def start(command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=REPO, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace")


def sets(overrides: list[str]) -> list[str]:
    return [a for s in overrides for a in ("--set", s)]


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("config") / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_raw_config(), allow_unicode=True), encoding="utf-8")
    return path


def train_cli(config_file: Path, out: Path, overrides: list[str]) -> list[str]:
    return ["train", "--config", config_file, "--out", out, *sets(TINY + overrides)]


def rank_pid(launcher: int, rank: int) -> int:
    """The process of `rank` among the workers a `nerkit train --nproc` process started."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == launcher and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    raise AssertionError(f"no rank {rank} among the children of {launcher}")


def model_tensors(path: Path) -> dict:
    return load_file(str(path))


def assert_same_weights(got: Path, want: Path, **tolerance) -> None:
    a, b = model_tensors(got), model_tensors(want)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], msg=lambda m: f"{key}: {m}", **tolerance)


def history(out: Path) -> list[dict]:
    timing = ("chars_per_s", "elapsed_s")
    return [{k: v for k, v in json.loads(line).items() if k not in timing}
            for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


# ------------------------------------------------------------------------------ in one process


@pytest.mark.parametrize("n, size", [(8, 2), (7, 2), (3, 4), (1, 2), (10, 3)])
def test_each_rank_takes_its_slice_of_a_global_batch_with_weights_that_restore_the_global_mean(n, size):
    batch = list(range(100, 100 + n))
    slices = [World(rank, rank, size).slice(batch) for rank in range(size)]
    taken = [i for mine, weight in slices if weight for i in mine]
    assert sorted(taken) == batch  # every sentence once, on one rank
    assert max(len(m) for m, w in slices if w) - min(len(m) if w else 0 for m, w in slices) <= 1
    assert all(mine for mine, _ in slices)  # a rank without a sentence still runs one (weight 0)
    # DDP averages the ranks' gradients: (1/size) * sum of weight_r * mean_r is the mean over the batch
    values = {i: float(i) ** 2 for i in batch}
    mean = sum(values.values()) / n
    ddp = sum(w * sum(values[i] for i in m) / len(m) for m, w in slices) / size
    assert ddp == pytest.approx(mean)


def test_the_weighted_rank_losses_average_to_the_gradient_of_the_global_batch(tiny_config):
    """The model's loss is a mean over its batch: uneven slices (4 and 3 sentences) weighted by
    World.slice give, averaged, the gradient of the 7 sentences together."""
    from nerkit.data.splits import read_splits
    from nerkit.features.batch import collate
    from nerkit.training.build import build_pipeline

    config = tiny_config(*NO_DROPOUT)
    splits = read_splits(config)
    pipe = build_pipeline(config, splits)
    examples = [pipe.featurizer.training_example(s) for s in splits.train[:7]]
    model = pipe.model

    def gradients(indices, weight=1.0):
        model.zero_grad()
        (model.loss(collate([examples[i] for i in indices])) * weight).backward()
        return [p.grad.clone() for p in model.parameters()]

    whole = gradients(list(range(7)))
    ranks = [gradients(*World(r, r, 2).slice(list(range(7)))) for r in range(2)]
    for g, g0, g1 in zip(whole, *ranks):
        torch.testing.assert_close((g0 + g1) / 2, g, rtol=1e-5, atol=1e-6)
    unweighted = [gradients(World(r, r, 2).slice(list(range(7)))[0]) for r in range(2)]
    assert any(not torch.allclose((g0 + g1) / 2, g, rtol=1e-5, atol=1e-6) for g, g0, g1 in zip(whole, *unweighted))


def test_a_global_batch_that_does_not_split_evenly_is_a_one_line_error(config_file, tmp_path, monkeypatch, capsys):
    with pytest.raises(UserError, match=r"train.batch_size = 8 does not split evenly over 3 processes") as info:
        check_batch_size(8, 3)
    assert "--set train.batch_size=9" in info.value.fix
    check_batch_size(8, 4)
    from nerkit.cli.app import main

    monkeypatch.setattr(sys, "argv", ["nerkit", "train", "--config", str(config_file), "--out", str(tmp_path / "m"),
                                      "--nproc", "3"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "train.batch_size = 8" in err and "multiple of 3" in err
    assert not (tmp_path / "m").exists()
    # --dry-run checks it too, for --nproc and under torchrun (its WORLD_SIZE)
    for extra, env in ((["--nproc", "3"], {}), ([], {"WORLD_SIZE": "3"})):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(sys, "argv", ["nerkit", "train", "--config", str(config_file), "--out",
                                          str(tmp_path / "m"), "--dry-run", *extra])
        with pytest.raises(SystemExit) as exit_info:
            main()
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and "does not split evenly over 3 processes" in err, (extra, env, err)


def test_a_rank_of_torchrun_checks_the_global_batch_and_the_rendezvous_before_it_joins(tiny_config, tmp_path, monkeypatch):
    """Under torchrun every rank checks it (no rendezvous is attempted: MASTER_ADDR is unset)."""
    from nerkit.training.loop import train

    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(UserError, match="does not split evenly over 3 processes"):
        train(tiny_config(), out=tmp_path / "m")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match="MASTER_ADDR or MASTER_PORT is not set"):
        train(tiny_config(), out=tmp_path / "m")


def test_nproc_under_torchrun_and_the_resume_command_of_each_launch(monkeypatch, tmp_path):
    assert without_nproc(["--quiet", "train", "--nproc", "2", "--set", "a=1", "--nproc=3"]) == \
        ["--quiet", "train", "--set", "a=1"]
    assert resume_command("runs/x") == "nerkit train --resume runs/x"
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert resume_command("runs/x") == "torchrun --nproc_per_node 4 -m nerkit train --resume runs/x"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert "with this run's options" in resume_command("runs/x")
    monkeypatch.setenv("NERKIT_NPROC", "4")
    assert resume_command("runs/x") == "nerkit train --resume runs/x --nproc 4"
    from nerkit.training.distributed import launch

    with pytest.raises(UserError, match="already one of torchrun's"):
        launch(2, ["train"], tmp_path)


@pytest.mark.parametrize("failures, code, words", [
    ({0: (1, 5), 1: (-signal.SIGKILL, 5)}, None, "rank 1 (pid 1001) was killed by SIGKILL; then rank 0 (pid 1000) "
                                                 "ended with exit code 1, and torchrun stopped the others"),
    ({0: (-signal.SIGTERM, 6), 1: (3, 5)}, None, "training process rank 1 (pid 1001) ended with exit code 3, and"),
    ({0: (-signal.SIGTERM, 6), 1: (2, 5)}, 2, None),  # rank 1's user error, which it printed
    ({0: (130, 5), 1: (130, 5)}, 130, None),  # Ctrl-C on a rank: rank 0 printed how to resume
])
def test_nproc_names_the_rank_that_failed_first_not_those_it_took_down(monkeypatch, tmp_path, failures, code, words):
    """What torchrun reports (failures seen in one poll share a timestamp), as `--nproc` says it."""
    import torch.distributed.run
    from torch.distributed.elastic.multiprocessing.errors import (
        ChildFailedError,
        ProcessFailure,
    )

    from nerkit.errors import JobError
    from nerkit.training.distributed import launch

    def failed(args):
        reported = {}
        for rank, (exitcode, when) in failures.items():
            reported[rank] = ProcessFailure(rank, 1000 + rank, exitcode, "<N/A>")
            reported[rank].timestamp = when
        raise ChildFailedError("nerkit", reported)

    monkeypatch.setattr(torch.distributed.run, "main", failed)
    monkeypatch.setenv("NERKIT_NPROC", "")  # launch sets it; monkeypatch puts it back
    if code is not None:
        assert launch(2, ["train"], tmp_path) == code
        return
    with pytest.raises(JobError) as info:
        launch(2, ["train"], tmp_path)
    assert words in str(info.value) and f"nerkit train --resume {tmp_path} --nproc 2" in str(info.value)


@pytest.mark.parametrize("value, seconds", [("90s", 90), ("20m", 1200), (5, 5)])
def test_dist_timeout_is_a_duration(value, seconds):
    assert build_config({"train": {"dist_timeout": value}}).train.dist_timeout == seconds
    assert build_config({}).train.dist_timeout == 1800


def test_a_dist_timeout_of_zero_is_refused():
    with pytest.raises(ConfigError, match=r"train.dist_timeout = 0.0 must be positive"):
        build_config({"train": {"dist_timeout": 0}})


# ------------------------------------------------------------------------------ two processes


@pytest.fixture(scope="module")
def two_process_run(config_file, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """`nerkit train --nproc 2` of the tiny config, uninterrupted."""
    out = tmp_path_factory.mktemp("two") / "run"
    result = run(nerkit_command(*train_cli(config_file, out, []), "--nproc", "2"))
    assert result.returncode == 0, result.stderr
    return out, result


@pytest.mark.slow
def test_two_processes_train_and_rank_0_alone_reports_and_writes(two_process_run):
    from nerkit import load

    out, result = two_process_run
    summary = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(summary) == 1 and json.loads(summary[0])["epochs"] == 3, result.stdout
    assert result.stderr.count("epoch 1/3") == 1 and result.stderr.count("model saved to") == 1, result.stderr
    assert "2 processes (4 sentences each a step)" in result.stderr
    assert [r["epoch"] for r in history(out)] == [1, 2, 3]
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["processes"] == 2 and metrics["steps"] == 24
    for weights in (out / "model.safetensors", out / "last" / "model.safetensors"):
        assert not [k for k in model_tensors(weights) if "module." in k or "_orig_mod" in k]
    checkpoint = model_tensors(out / "checkpoint" / "state.safetensors")
    assert "rng.rank1" in checkpoint and not [k for k in checkpoint if "module." in k]
    pipeline = load(out)  # the model directory does not know how it was trained
    assert pipeline.predict(["张三在北京大学读书。"]) is not None
    assert not list(out.parent.glob("*/.*.tmp")) and not list(out.glob(".*"))


@pytest.mark.slow
def test_sigint_on_one_rank_stops_both_at_one_step_and_the_run_resumes_exactly(config_file, two_process_run,
                                                                               tmp_path):
    """Ctrl-C reaches rank 1 alone, as it assembles its 5th batch: the ranks agree to stop after
    step 5, rank 0 writes the checkpoint and says how to go on. Resumed on two processes the run is
    byte for byte the uninterrupted one (each rank's dropout stream is restored); resumed on one,
    it goes through the same global batches to the end."""
    reference, _ = two_process_run
    out = tmp_path / "run"
    result = run(torchrun("--no-python", sys.executable, "-c", FAULTS, "sigint", 5, *train_cli(config_file, out, [])))
    assert result.returncode != 0
    assert f"Continue with: torchrun --nproc_per_node 2 -m nerkit train --resume {out}" in result.stderr, result.stderr
    assert result.stderr.count("training interrupted at epoch 1, step 5") == 1
    assert checkpoint_step(out) == 5
    one = tmp_path / "one"
    shutil.copytree(out, one)

    resumed = run(nerkit_command("train", "--resume", out, "--nproc", "2"))
    assert resumed.returncode == 0, resumed.stderr
    for name in ("model.safetensors", "last/model.safetensors"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    assert history(out) == history(reference)

    from nerkit.training.loop import train
    from nerkit.training.run_dir import resume_config

    metrics = train(resume_config(one), out=one, resume=True, progress_bar=False)
    assert (metrics["steps"], metrics["epochs"], metrics["processes"]) == (24, 3, 1)
    assert [r["step"] for r in history(one)] == [8, 16, 24]
    assert (one / "model.safetensors").read_bytes() != (reference / "model.safetensors").read_bytes()  # dropout


@pytest.mark.slow
def test_ctrl_c_on_nproc_stops_the_run_with_a_checkpoint_and_exit_130(config_file, tmp_path):
    out = tmp_path / "run"
    process = start(nerkit_command(*train_cli(config_file, out, ["train.epochs=1000"]), "--nproc", "2"))
    try:
        wait_for_step(process, out, 3)
        process.send_signal(signal.SIGINT)  # as a terminal's Ctrl-C: torchrun passes it to the ranks
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert stderr.count(f"Continue with: nerkit train --resume {out} --nproc 2") == 1, stderr
    assert "Traceback" not in stderr
    assert checkpoint_step(out) >= 3


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    """A tiny BERT without dropout (helpers.write_lm) whose vocabulary has the fixtures' characters."""
    pytest.importorskip("transformers")
    vocab = fixture_lm_vocab()
    config = bert_config(len(vocab))
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    return write_lm(tmp_path_factory.mktemp("lm") / "tiny-lm", vocab=vocab, config=config)


def equivalence_runs(lm_dir) -> dict[str, list[str]]:
    """Runs whose weights are compared across world sizes: 59 sentences make a last batch of 3
    (slices of 2 and 1), 57 one of 1 (rank 1 runs it with weight 0); 10 steps cross an epoch end,
    and clipping acts on the all-reduced gradients. SGD, because Adam divides each gradient by its
    own running size, which turns float noise in a gradient near zero into a step of its own
    (1e-4 apart after 20 steps, where SGD's weights stay within 1e-7)."""
    common = NO_DROPOUT + ["train.max_steps=10", "train.threads=1", "train.clip_norm=1", "train.optimizer=sgd",
                           "train.lr=0.05"]
    runs = {"bilstm": common + ["data.limit=57"],
            "transformer": common + ["data.limit=59", "encoder.name=transformer", "encoder.n_heads=2",
                                     "encoder.head_dim=8", "encoder.attn_dropout=0"]}
    if lm_dir is not None:
        lm = common + ["data.limit=59", f"embeddings.lm.path={lm_dir}", "embeddings.bichar_dim=0"]
        runs["lm"] = lm + ["embeddings.lm.finetune=true", "embeddings.lm.lr=0.001"]
        # frozen: both ranks miss its feature cache at once; the scalar mix learns
        runs["frozen_lm"] = lm + ["embeddings.lm.layers=mix", f"embeddings.lm.cache={lm_dir.parent / 'cache'}"]
    return runs


@pytest.fixture(scope="module")
def equivalent_runs(tmp_path_factory, request) -> tuple[Path, dict]:
    """Each of `equivalence_runs` trained by two processes of one torchrun job."""
    import importlib.util

    lm = request.getfixturevalue("lm_dir") if importlib.util.find_spec("transformers") else None
    runs = equivalence_runs(lm)
    tmp = tmp_path_factory.mktemp("equivalence")
    jobs = tmp / "jobs.json"
    jobs.write_text(json.dumps([[str(tmp / name), tiny_raw_config(), overrides] for name, overrides in runs.items()]),
                    encoding="utf-8")
    result = run(torchrun("--no-python", sys.executable, "-c", SEVERAL_RUNS, jobs))
    assert result.returncode == 0, result.stderr
    return tmp, runs


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bilstm", "transformer", "lm", "frozen_lm"])
def test_two_processes_make_the_weights_of_one_with_the_same_global_batch(equivalent_runs, tmp_path, name):
    """After the same 10 steps (an uneven last batch among them, gradients clipped), the weights of
    the two-process run equal those of one process, to float tolerance."""
    from nerkit.training.loop import train

    two, runs = equivalent_runs
    if name not in runs:
        pytest.skip("transformers is not installed")
    metrics = train(build_config(tiny_raw_config(), "<test>", runs[name]), out=tmp_path / "one", progress_bar=False)
    assert metrics["steps"] == 10
    assert_same_weights(two / name / "model.safetensors", tmp_path / "one" / "model.safetensors", **CLOSE)
    assert json.loads((two / name / "metrics.json").read_text())["processes"] == 2
    untrained = build_config(tiny_raw_config(), "<test>", runs[name] + ["train.max_steps=1"])
    train(untrained, out=tmp_path / "short", progress_bar=False)
    with pytest.raises(AssertionError):  # the comparison can fail: one step is not ten
        assert_same_weights(two / name / "model.safetensors", tmp_path / "short" / "model.safetensors", **CLOSE)


@pytest.mark.slow
def test_a_two_process_run_resumed_on_one_process_goes_on_as_one_process_would(equivalent_runs, tmp_path):
    """The world size may change on a resume: the global batches stay the same (without dropout, so
    do the weights, to float tolerance)."""
    from nerkit.training.loop import train
    from nerkit.training.run_dir import resume_config

    two, runs = equivalent_runs
    out = tmp_path / "resumed"
    shutil.copytree(two / "bilstm", out)
    metrics = train(resume_config(out, ["train.max_steps=20"]), out=out, resume=True, progress_bar=False)
    assert (metrics["steps"], metrics["processes"]) == (20, 1)
    train(build_config(tiny_raw_config(), "<test>", runs["bilstm"] + ["train.max_steps=20"]), out=tmp_path / "one",
          progress_bar=False)
    assert_same_weights(out / "model.safetensors", tmp_path / "one" / "model.safetensors", **CLOSE)


# ------------------------------------------------------------------------------ failures


@pytest.mark.slow
def test_a_rank_killed_mid_training_ends_the_job_at_once_with_a_clear_message(config_file, tmp_path):
    if not Path("/proc/self/stat").exists():
        pytest.skip("finding the rank's process needs /proc")
    out = tmp_path / "run"
    process = start(nerkit_command(*train_cli(config_file, out, ["train.epochs=1000"]), "--nproc", "2"))
    try:
        wait_for_step(process, out, 3)
        os.kill(rank_pid(process.pid, 1), signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = process.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        process.kill()
    assert process.returncode == 1, stderr
    assert took < 20, f"the job took {took:.0f} s to end"
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("nerkit: error: training process rank 1 (pid ") and "was killed by SIGKILL" in last, stderr
    assert f"nerkit train --resume {out} --nproc 2" in last
    assert "Traceback" not in stderr
    step = checkpoint_step(out)  # what was saved is whole, and goes on (here on one process)
    from nerkit.training.loop import train
    from nerkit.training.run_dir import resume_config

    metrics = train(resume_config(out, [f"train.max_steps={step + 2}"]), out=out, resume=True, progress_bar=False)
    assert metrics["steps"] == step + 2


def package_traceback_lines(stderr: str) -> list[str]:
    """The lines of a Python traceback that point into nerkit's own code (not torch's, wherever the
    virtual environment lives)."""
    return [line for line in stderr.splitlines() if "File" in line and PACKAGE_DIR in line]


def test_the_traceback_check_sees_the_package_alone_in_a_checkout_named_nerkit():
    """Issue 33: the check matched `/nerkit/` anywhere, so torchrun's own traceback through a clone
    in a directory named `nerkit` (`/tmp/x/nerkit/.venv/...`) failed the test above."""
    clone = Path(PACKAGE_DIR).parent
    torchrun = (f'  File "{clone}/.venv/lib/python3.11/site-packages/torch/distributed/run.py", line 9, in main\n'
                f'  File "/tmp/x/nerkit/.venv/lib/python3.11/site-packages/torch/distributed/elastic/api.py", line 1\n')
    ours = f'  File "{PACKAGE_DIR}training/loop.py", line 5, in train\n'
    assert package_traceback_lines(torchrun) == []
    assert package_traceback_lines(torchrun + ours) == [ours.rstrip("\n")]
    assert package_traceback_lines("nerkit: error: the corpora and vocabularies of rank 1 differ\n") == []


@pytest.mark.slow
def test_ranks_that_read_different_data_end_with_a_one_line_error_before_training(config_file, tmp_path):
    out = tmp_path / "run"
    result = run(torchrun("--no-python", sys.executable, "-c", FAULTS, "data", 0, *train_cli(config_file, out, [])))
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("nerkit: error:")]
    assert lines and "the corpora and vocabularies of rank 1 differ from rank 0's" in lines[0], result.stderr
    assert "same files at the same paths" in lines[0]
    # each rank says it in one line; the only traceback is torchrun's own report of failed workers
    assert not package_traceback_lines(result.stderr), result.stderr
    assert "epoch 1/" not in result.stderr and not (out / "checkpoint").exists()


@pytest.mark.slow
def test_a_rank_that_stops_answering_ends_the_job_after_dist_timeout(config_file, tmp_path):
    """Rank 1 hangs (alive, silent) at its 4th batch: rank 0 gives up after train.dist_timeout
    (3 s) and says why; torchrun then stops rank 1."""
    out = tmp_path / "run"
    started = time.monotonic()
    result = run(torchrun("--no-python", sys.executable, "-c", FAULTS, "hang", 4,
                          *train_cli(config_file, out, ["train.dist_timeout=3"])), timeout=120)
    took = time.monotonic() - started
    assert result.returncode != 0
    lost = [line for line in result.stderr.splitlines() if "lost the other training processes" in line]
    assert len(lost) == 1 and lost[0].startswith("nerkit: error: rank 0 "), result.stderr
    assert "Timed out" in lost[0] and "did not answer within train.dist_timeout = 3 s" in lost[0]
    assert took < 60, f"the job took {took:.0f} s to end"


# ------------------------------------------------------------------------- prediction across ranks

@pytest.mark.parametrize("lines, fmt", [(1800, "jsonl"), (1300, "label-studio")])
def test_torchrun_predict_writes_what_one_process_writes(tiny_model_dir, tmp_path, lines, fmt):
    """Two gloo processes each predict every other chunk (20,000 characters each) and rank 0 writes
    them in input order: 1,800 lines of 40 characters are four chunks (two full rounds), 1,300 lines
    three (the last round half full); the file is byte-identical to one process's."""
    sentences = ["张三在北京大学读书。", "新华社记者在上海报道。", "李四来自广州。", "上"]
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(sentences[i % 4] * (4 if i % 4 < 3 else 40) + "\n" for i in range(lines)), encoding="utf-8")
    one, two = tmp_path / f"one.{fmt}", tmp_path / f"two.{fmt}"
    done = run(nerkit_command("predict", "--model", tiny_model_dir, texts, "--format", fmt, "--output", one))
    assert done.returncode == 0, done.stderr
    both = run(torchrun("-m", "nerkit", "predict", "--model", tiny_model_dir, texts, "--format", fmt,
                        "--output", two))
    assert both.returncode == 0, both.stderr
    assert two.read_bytes() == one.read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_torchrun_predict_needs_a_file_in_and_out(tiny_model_dir, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("张三在北京。\n", encoding="utf-8")
    done = run(torchrun("-m", "nerkit", "predict", "--model", tiny_model_dir, texts))
    assert done.returncode != 0 and "nerkit: error: with several processes (torchrun) the output must be a file" in done.stderr
    assert not package_traceback_lines(done.stderr)  # torchrun reports the failure; nerkit printed one line
