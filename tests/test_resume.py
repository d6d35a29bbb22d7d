"""Crash safety of training, as users meet it: a run killed with SIGKILL at any instant, or stopped
with SIGINT or SIGTERM, continues with `nerkit train --resume` to exactly the model an uninterrupted run makes
(bit-identical weights, equal metrics); a disk that fills up or an output directory that turns
read-only ends the run with a one-line error (exit 2) and leaves the last checkpoint loadable.

Interrupted runs are real `python -m nerkit` processes. The exact instants (inside a checkpoint's
renames, at an epoch boundary, during an evaluation) are reached by a small wrapper that sends the
signal to its own process from inside the code; one SIGKILL, one SIGINT and one SIGTERM come from outside at
whatever step the run has reached. Resumes run in this process (one through the CLI's entry point).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import nerkit_command, wait_for_step
from reliability_report import Section

pytestmark = pytest.mark.slow  # these tests start, interrupt and resume training processes

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "configs" / "demo.yaml"
SAMPLE = REPO / "data" / "sample"
# 160 sentences in batches of 16: 10 steps an epoch, so the step-10 checkpoint falls exactly on the
# end of epoch 1 (its batches done, its dev evaluation not yet). lr 0.1 makes dev F1 move each epoch.
TINY = [f"data.train={SAMPLE / 'train.bio'}", f"data.dev={SAMPLE / 'dev.bio'}", f"data.test={SAMPLE / 'test.bio'}",
        "data.limit=160", "embeddings.char_dim=8", "embeddings.bichar_dim=8", "encoder.hidden_size=8",
        "train.lr=0.1", "train.epochs=3", "train.checkpoint_every=5", "train.threads=1", "train.device=cpu"]
# A run that a limit stops inside epoch 3, whose evaluation there beats epochs 1 and 2: the
# stopped run's model is the one where it stopped.
MAX_STEPS = ["train.max_steps=25"]

# Runs `nerkit` after arranging a fault: FAULT N, then the nerkit arguments.
FAULTS = r"""
import os, signal, sys
from pathlib import Path
fault, n = sys.argv[1], int(sys.argv[2])
sys.argv = ["nerkit", *sys.argv[3:]]
import nerkit.training.loop as T
calls = [0]

def count():
    calls[0] += 1
    return calls[0] == n

if fault == "sigkill_before_step":  # as batch N of this session is assembled
    collate = T.collate
    def patched(examples):
        if count():
            os.kill(os.getpid(), signal.SIGKILL)
        return collate(examples)
    T.collate = patched
elif fault == "sigkill_mid_rename":  # the old checkpoint moved aside, the new one not yet renamed in
    replace = os.replace
    def patched(src, dst):
        replace(src, dst)
        if Path(dst).name == ".checkpoint.old" and count():
            os.kill(os.getpid(), signal.SIGKILL)
    os.replace = patched
elif fault == "sigint_in_evaluation":  # Ctrl-C while epoch N is evaluated on dev
    evaluate = T.Pipeline.evaluate
    def patched(self, *args, **kwargs):
        if count():
            os.kill(os.getpid(), signal.SIGINT)
        return evaluate(self, *args, **kwargs)
    T.Pipeline.evaluate = patched
else:  # something happens right after checkpoint N is in place
    save = T.save_checkpoint
    def patched(out, *args, **kwargs):
        save(out, *args, **kwargs)
        if not count():
            return
        if fault == "sigkill_after_checkpoint":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault == "file_size_limit":  # later writes of more than 64 kB fail with EFBIG
            import resource
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (64_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        elif fault == "read_only":
            os.chmod(out, 0o500)
            if os.geteuid() == 0:  # root ignores the mode: fail as the kernel would for anyone else
                import errno
                mkdir = os.mkdir
                def refuse(path, *args, **kwargs):  # the temporary directory of the next checkpoint
                    if str(path).endswith(".tmp"):
                        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
                    return mkdir(path, *args, **kwargs)
                os.mkdir = refuse
    T.save_checkpoint = patched
from nerkit.cli.app import main
main()
"""

REPORT = Section("resume", "Interrupted training (tests/test_resume.py)", """
Tiny BiLSTM-CRF runs on the demo data (3 epochs of 10 steps, a checkpoint every 5 steps and at each
epoch end, dropout on). Each run is interrupted, resumed with `nerkit train --resume` (or its
in-process equivalent), and compared with an uninterrupted run of the same seed: `model.safetensors`
and `last/model.safetensors` byte for byte, `metrics.json` (best epoch, steps, dev and test figures)
and every `metrics.jsonl` record except timings.
""")
REPORT.table("Kill points", ["interruption", "checkpoint found on disk", "resumed run"])
REPORT.table("Write failures", ["failure", "exit", "message", "checkpoint afterwards"])


@pytest.fixture(scope="module", autouse=True)
def report():
    yield REPORT
    REPORT.write_if_asked()


def overrides(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def train_cli(out: Path, sets: list[str]) -> list[str]:
    return ["train", "--config", str(DEMO), "--out", str(out), *overrides(sets)]


def run(args: list[str], fault: str | None = None, n: int = 0, **kwargs) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", FAULTS, fault, str(n)] if fault else nerkit_command()
    return subprocess.run(command + [str(a) for a in args], cwd=REPO, capture_output=True, text=True,
                          errors="replace", timeout=180, **kwargs)


def train_here(out: Path, sets: list[str]) -> dict:
    from nerkit.config import load_config
    from nerkit.training.loop import train

    return train(load_config(DEMO, sets), out=out)


def resume_here(out: Path) -> dict:
    """What `nerkit train --resume OUT` does, without starting a process."""
    from nerkit.training.loop import train
    from nerkit.training.run_dir import resume_config

    return train(resume_config(out), out=out, resume=True)


def checkpoint_position(out: Path) -> str:
    """Where the checkpoint on disk stands, e.g. `epoch 2, batch 0, step 10`."""
    for name in ("checkpoint", ".checkpoint.old"):
        state = out / name / "state.json"
        if state.is_file():
            p = json.loads(state.read_text(encoding="utf-8"))["progress"]
            where = f"epoch {p['epoch']}, batch {p['batch']}, step {p['step']}"
            return where if name == "checkpoint" else f"{where} (only as .checkpoint.old)"
    return "none"


def assert_same_run(reference: Path, out: Path) -> None:
    for name in ("model.safetensors", "last/model.safetensors"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), f"{name} differs"
    got, want = (json.loads((d / "metrics.json").read_text(encoding="utf-8")) for d in (out, reference))
    for key in ("best_epoch", "epochs", "steps", "stopped", "dev", "test"):
        assert got[key] == want[key], key
    timing = ("chars_per_s", "elapsed_s")
    got, want = ([{k: v for k, v in json.loads(line).items() if k not in timing}
                  for line in (d / "metrics.jsonl").read_text(encoding="utf-8").splitlines()] for d in (out, reference))
    assert got == want


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run every interrupted one must reproduce."""
    out = tmp_path_factory.mktemp("reference") / "run"
    metrics = train_here(out, TINY)
    assert metrics["steps"] == 30 and metrics["epochs"] == 3  # 10 steps an epoch, as the kill points assume
    return out


@pytest.fixture(scope="module")
def reference_max_steps(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference_max_steps") / "run"
    metrics = train_here(out, TINY + MAX_STEPS)
    assert (metrics["steps"], metrics["stopped"], metrics["best_epoch"]) == (25, "max_steps", 3)
    # the best model is the state where the limit stopped the run, which last/ holds too
    assert (out / "model.safetensors").read_bytes() == (out / "last" / "model.safetensors").read_bytes()
    return out


# ------------------------------------------------------------------------------------- SIGKILL

# (id, fault, N, extra overrides, what is on disk when the process dies)
KILL_POINTS = [
    ("mid-epoch", "sigkill_before_step", 8, [], "epoch 1, batch 5, step 5"),
    ("at the epoch boundary", "sigkill_after_checkpoint", 3, [], "epoch 2, batch 0, step 10"),
    ("inside a checkpoint write, between its two renames", "sigkill_mid_rename", 3, [],
     "epoch 2, batch 0, step 10 (only as .checkpoint.old)"),
    ("after the last checkpoint of a max_steps run, before its final model", "sigkill_after_checkpoint", 8, MAX_STEPS,
     "epoch 3, batch 5, step 25"),
]
# Other faults: (id, fault, N)
OTHER_FAULTS = [("file size limit", "file_size_limit", 1), ("read-only", "read_only", 1),
                ("SIGINT during evaluation", "sigint_in_evaluation", 1)]


@pytest.fixture(scope="module")
def faulted_runs(tmp_path_factory) -> dict:
    """Every run of KILL_POINTS and OTHER_FAULTS, started together (each is mostly start-up)."""
    from concurrent.futures import ThreadPoolExecutor

    tmp = tmp_path_factory.mktemp("faulted")
    jobs = {name: (tmp / f"run{i}", fault, n, extra)
            for i, (name, fault, n, extra) in enumerate([k[:4] for k in KILL_POINTS] + [(*f, []) for f in OTHER_FAULTS])}

    def start(job):
        out, fault, n, extra = job
        try:
            return out, run(train_cli(out, TINY + extra), fault, n)
        finally:
            if out.exists():
                os.chmod(out, 0o755)  # the read-only run

    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        return dict(zip(jobs, pool.map(start, jobs.values())))


@pytest.mark.slow
@pytest.mark.parametrize("name, extra, position", [(k[0], k[3], k[4]) for k in KILL_POINTS],
                         ids=[k[0] for k in KILL_POINTS])
def test_sigkill_then_resume_gives_the_uninterrupted_model(faulted_runs, name, extra, position, request):
    reference = request.getfixturevalue("reference_max_steps" if extra else "reference")
    out, killed = faulted_runs[name]
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    found = checkpoint_position(out)
    assert found == position
    resume_here(out)
    assert_same_run(reference, out)
    assert not list(out.glob(".checkpoint*")), "a stray temporary checkpoint is left behind"
    REPORT.row("Kill points", f"SIGKILL {name}", found, "identical to the uninterrupted run")


def start_training(out: Path, sets: list[str]) -> subprocess.Popen:
    return subprocess.Popen(nerkit_command(*train_cli(out, sets)), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")


@pytest.mark.slow
def test_sigkill_from_outside_at_whatever_step_then_resume(reference, tmp_path):
    out = tmp_path / "run"
    process = start_training(out, TINY)
    wait_for_step(process, out, 15)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    found = checkpoint_position(out)
    resume_here(out)
    assert_same_run(reference, out)
    REPORT.row("Kill points", "SIGKILL from another process once step 15 was checkpointed", found,
               "identical to the uninterrupted run")


# ----------------------------------------------------------------------------- SIGINT and SIGTERM


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_epoch_saves_a_checkpoint_and_resumes_identically(reference, tmp_path, monkeypatch, capfd,
                                                                        signum, code):
    """Ctrl-C, and SIGTERM as `kill` or a batch scheduler's preemption sends it: exit 128 + signal."""
    out = tmp_path / "run"
    process = start_training(out, TINY)
    wait_for_step(process, out, 5)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code, stderr
    assert f"nerkit train --resume {out}" in stderr
    assert "Traceback" not in stderr
    found = checkpoint_position(out)
    assert found != "none"
    from nerkit.cli.app import main

    monkeypatch.setattr(sys, "argv", ["nerkit", "train", "--resume", str(out)])  # the command it printed
    with pytest.raises(SystemExit) as info:
        main()
    assert not info.value.code, capfd.readouterr().err
    assert_same_run(reference, out)
    REPORT.row("Kill points", f"{signal.Signals(signum).name} from another process once step 5 was checkpointed "
               f"(exit {code})", found, "identical (resumed with the printed `nerkit train --resume` command)")


def test_sigint_during_the_dev_evaluation_still_says_how_to_resume(faulted_runs, reference):
    out, interrupted = faulted_runs["SIGINT during evaluation"]
    assert interrupted.returncode == 130, interrupted.stderr
    assert f"nerkit train --resume {out}" in interrupted.stderr
    assert "Traceback" not in interrupted.stderr
    found = checkpoint_position(out)
    assert found == "epoch 2, batch 0, step 10"  # the evaluation finished and its epoch was saved
    resume_here(out)
    assert_same_run(reference, out)
    REPORT.row("Kill points", "SIGINT during epoch 1's dev evaluation (exit 130)", found,
               "identical to the uninterrupted run")


# ------------------------------------------------------------------------------ write failures


def assert_one_line_error(result: subprocess.CompletedProcess, words: str) -> str:
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("nerkit: error: ") and words in last, result.stderr
    assert "Traceback" not in result.stderr
    return last


@pytest.mark.slow
def test_file_size_limit_mid_run_is_a_user_error_and_keeps_the_checkpoint(faulted_runs, reference):
    """RLIMIT_FSIZE makes the kernel refuse the step-10 checkpoint (EFBIG), as a full disk would."""
    out, result = faulted_runs["file size limit"]
    message = assert_one_line_error(result, os.strerror(errno.EFBIG))
    assert str(out) in message and "--resume" in message
    found = checkpoint_position(out)
    assert found == "epoch 1, batch 5, step 5"
    assert not list(out.glob(".checkpoint*")), "the failed write left a temporary directory"
    resume_here(out)
    assert_same_run(reference, out)
    REPORT.row("Write failures", "file size limit (EFBIG) from the step-10 checkpoint on", 2, message,
               f"{found}: resumed to the identical model")


@pytest.fixture
def disk(tmp_path, reference):
    """A tmpfs with room for the run's first files and one checkpoint, not for the next one beside it."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    first_files = sum((reference / name).stat().st_size for name in ("nerkit.json", "config.yaml", "vocab.json"))
    checkpoint = sum(f.stat().st_size for f in (reference / "checkpoint").iterdir())
    size_kb = (first_files + 3 * 4096 + checkpoint * 3 // 2) // 1024
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.slow
def test_disk_full_mid_run_is_a_user_error_and_keeps_the_checkpoint(reference, disk, tmp_path):
    out = disk / "run"
    result = run(train_cli(out, TINY))
    message = assert_one_line_error(result, os.strerror(errno.ENOSPC))
    found = checkpoint_position(out)
    assert found == "epoch 1, batch 5, step 5"
    assert not list(out.glob(".checkpoint*")), "the failed write left a temporary directory"
    moved = tmp_path / "run"
    shutil.copytree(out, moved)
    resume_here(moved)  # the config names the old directory only as output_dir, which --resume replaces
    assert_same_run(reference, moved)
    REPORT.row("Write failures", "disk full (a tmpfs with room for one checkpoint, ENOSPC) at the step-10 checkpoint", 2, message,
               f"{found}: resumed (on another disk) to the identical model")


@pytest.mark.slow
def test_output_dir_turning_read_only_is_a_user_error_and_keeps_the_checkpoint(faulted_runs):
    """chmod 0o500 on the run directory after its first checkpoint. Root ignores file modes, so
    under root the next directory creation is made to fail with EACCES instead."""
    out, result = faulted_runs["read-only"]
    message = assert_one_line_error(result, os.strerror(errno.EACCES))
    found = checkpoint_position(out)
    assert found == "epoch 1, batch 5, step 5"
    from safetensors.torch import load_file

    assert any(k.startswith("model.") for k in load_file(out / "checkpoint" / "state.safetensors"))
    how = "simulated for root: creating its temporary directory raises EACCES" if os.geteuid() == 0 else "chmod 0o500"
    REPORT.row("Write failures", f"run directory made read-only after step 5 ({how})", 2, message,
               f"{found}: intact, loads")


def test_a_benchmarks_run_continues_from_its_checkpoint_and_a_new_one_starts_clean(reference, tmp_path, monkeypatch):
    """train_or_continue (nerkit bench grow's steps, bench audit's folds and reviews): a run stopped
    midway goes on from its checkpoint to the uninterrupted run's model; a run's directory without
    one is trained from the start."""
    import nerkit.training.loop as loop
    from nerkit.config import load_config

    out = tmp_path / "run"
    stopped = train_here(out, TINY + ["train.max_steps=13"])
    assert stopped["steps"] == 13
    resumed, train = [], loop.train
    monkeypatch.setattr(loop, "train", lambda config, out, **options: resumed.append(options["resume"])
                        or train(config, out, **options))
    loop.train_or_continue(load_config(DEMO, TINY), out)
    assert resumed == [True]
    assert_same_run(reference, out)
    fresh = tmp_path / "fresh"
    shutil.copytree(out, fresh)
    shutil.rmtree(fresh / "checkpoint")  # an earlier run's directory with nothing to continue from
    (fresh / "model.safetensors").write_bytes(b"not these weights")
    loop.train_or_continue(load_config(DEMO, TINY), fresh)
    assert resumed == [True, False]
    assert_same_run(reference, fresh)


@pytest.mark.parametrize("first, then", [
    (["train.max_steps=13"], ["train.max_steps=0"]),
    (["train.time_budget=0.001"], ["train.time_budget=0"]),  # the first step alone outlasts 1 ms
], ids=["max_steps", "time_budget"])
def test_a_run_stopped_by_a_limit_goes_on_when_the_resume_lifts_it(reference, tmp_path, first, then):
    """The epoch the limit cut short is evaluated and logged as partial; the resume finishes that
    epoch (none of its batches is skipped) and ends with exactly the run that was never cut."""
    from nerkit.training.loop import train
    from nerkit.training.run_dir import resume_config

    out = tmp_path / "run"
    stopped = train_here(out, TINY + first)
    assert stopped["stopped"] in ("max_steps", "time_budget") and stopped["steps"] < 30
    cut = json.loads((out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[-1])
    assert cut["partial"] is True and cut["batches"] == (stopped["steps"] - 1) % 10 + 1 and cut["of_batches"] == 10
    assert json.loads((out / "last" / "metrics.json").read_text(encoding="utf-8"))["partial"] is True
    metrics = train(resume_config(out, then), out=out, resume=True)
    assert stopped["partial_epoch"] and not metrics["partial_epoch"]
    assert metrics["stopped"] == "epochs" and metrics["epochs"] == 3 and metrics["steps"] == 30
    assert_same_run(reference, out)
