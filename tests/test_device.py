"""Where torch runs: the device names, the thread count, and OpenMP's wait policy that nerkit sets
before torch loads (so that two nerkit processes on shared cores do not spin against each other)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nerkit.errors import UserError


def seen_by_a_new_process(**env_values: str) -> tuple[str, str, int]:
    """OMP_WAIT_POLICY, NERKIT_FREE_CORES and torch's threads after `set_threads(0)` in a new process."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "NERKIT_FREE_CORES", "OMP_NUM_THREADS")}
    env.update(env_values)
    code = ("import nerkit.training.loop, os, torch; from nerkit.device import set_threads; set_threads(0); "
            "print(os.environ['OMP_WAIT_POLICY'], os.environ['NERKIT_FREE_CORES'], torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    policy, free, threads = out.split()
    return policy, free, int(threads)


@pytest.mark.slow
def test_a_policy_or_thread_count_the_user_set_wins():
    assert seen_by_a_new_process(OMP_WAIT_POLICY="ACTIVE")[0] == "ACTIVE"
    assert seen_by_a_new_process(OMP_WAIT_POLICY="PASSIVE")[0] == "PASSIVE"
    assert seen_by_a_new_process(OMP_WAIT_POLICY="PASSIVE", NERKIT_FREE_CORES="1")[2] == 1


@pytest.mark.slow
def test_beside_a_busy_process_nerkit_waits_passively_and_takes_the_free_cores():
    """A process that keeps every core busy is running when nerkit starts: no spinning, one thread."""
    cores = os.cpu_count() or 1
    spin = "import time\nend = time.time() + 20\nwhile time.time() < end: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(cores)]
    try:
        import time
        time.sleep(0.3)  # the hogs are running
        policy, free, threads = seen_by_a_new_process()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert policy == "PASSIVE" and free == "1" and threads == 1


def test_the_choice_from_what_the_cores_do():
    from nerkit.cores import choose

    assert choose({}, 0.1, 2) == {"OMP_WAIT_POLICY": "ACTIVE", "NERKIT_FREE_CORES": "2"}
    assert choose({}, 1.0, 2) == {"OMP_WAIT_POLICY": "PASSIVE", "NERKIT_FREE_CORES": "1"}
    assert choose({}, 3.7, 2) == {"OMP_WAIT_POLICY": "PASSIVE", "NERKIT_FREE_CORES": "1"}  # never below one
    assert choose({}, None, 4) == {"OMP_WAIT_POLICY": "PASSIVE", "NERKIT_FREE_CORES": "4"}  # nothing to measure
    assert choose({"OMP_WAIT_POLICY": "ACTIVE"}, 1.0, 2) == {"NERKIT_FREE_CORES": "1"}


def test_busy_cores_reads_the_kernels_counters(tmp_path, monkeypatch):
    """Busy cores = the non-idle share of the CPU time that passed, times the cores."""
    import nerkit.cores as cores

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 100 800 0 0 0 0 0 0\n")

    def one_core_busy(_seconds):  # 100 ticks pass: 50 user, 50 idle
        stat.write_text("cpu  150 0 100 850 0 0 0 0 0 0\n")

    monkeypatch.setattr(cores.time, "sleep", one_core_busy)
    monkeypatch.setattr(cores.os, "cpu_count", lambda: 2)
    assert cores.busy_cores(stat=str(stat)) == 1.0
    assert cores.busy_cores(stat=str(tmp_path / "missing")) is None


def test_device_names_and_their_errors():
    from nerkit.device import resolve_device

    assert resolve_device("cpu").type == "cpu"
    with pytest.raises(UserError, match="not one of"):
        resolve_device("gpu")
    if not __import__("torch").cuda.is_available():
        with pytest.raises(UserError, match="--set train.device=cpu"):
            resolve_device("cuda", "train.device")
        with pytest.raises(UserError, match="use --device cpu"):
            resolve_device("cuda")


def test_runtime_threads_read_omp_num_threads_or_the_free_cores(monkeypatch):
    """ONNX Runtime does not read OMP_NUM_THREADS itself: nerkit gives it the first number there, else
    the cores found free."""
    from nerkit.cores import FREE_CORES, runtime_threads

    monkeypatch.setenv(FREE_CORES, "3")
    for setting, expected in (("2", 2), ("4,2", 4), (" 1 ", 1), ("0", 1), ("", 3), ("many", 3)):
        monkeypatch.setenv("OMP_NUM_THREADS", setting)
        assert runtime_threads() == expected, setting


def test_the_suite_gives_nerkit_one_free_core_whatever_the_machine_is_doing():
    """conftest sets NERKIT_FREE_CORES before nerkit is first imported: when helpers imported nerkit
    first, an idle CI machine measured 2 free cores, every command a test ran took 2 threads beside
    the other test worker, and the suite ran at half speed with byte comparisons failing."""
    import nerkit.cores

    assert os.environ[nerkit.cores.FREE_CORES] == "1"
