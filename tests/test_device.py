"""Where torch runs: the device names, the thread count, and OpenMP's wait policy that nerkit sets
before torch loads (so that two nerkit processes on shared cores do not spin against each other)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nerkit.errors import UserError


def policy_seen_by_a_new_process(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_value is not None:
        env["OMP_WAIT_POLICY"] = env_value
    code = "import nerkit.training.loop, os; print(os.environ['OMP_WAIT_POLICY'])"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_nerkit_makes_openmp_wait_passively_unless_told_otherwise():
    assert policy_seen_by_a_new_process(None) == "PASSIVE"
    assert policy_seen_by_a_new_process("ACTIVE") == "ACTIVE"


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
