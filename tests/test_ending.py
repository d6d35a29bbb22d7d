"""nerkit.ending: a process ended without the interpreter's teardown still gives what its exit gave:
the exit code, stdout and stderr flushed, logging's files written, the atexit functions run, and
the interpreter's own exit where it still matters (a message as the code, a thread still running)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout buffered, as in a pipe
    env.update(PYTHONPATH=str(ROOT), OMP_WAIT_POLICY="PASSIVE", NERKIT_FREE_CORES="1")
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)


def test_what_the_exit_gave_is_kept(tmp_path):
    done = run(
        "import atexit, logging, sys\n"
        "from nerkit.ending import end_process\n"
        "handler = logging.FileHandler('log.txt'); logging.getLogger('x').addHandler(handler)\n"
        "logging.getLogger('x').warning('logged')\n"
        "atexit.register(lambda: open('atexit.txt', 'w').write('ran'))\n"
        "print('out', end=''); print('err', end='', file=sys.stderr)\n"
        "end_process(3)\n"
        "print('not reached')\n", tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out", "err")
    assert (tmp_path / "log.txt").read_text() == "logged\n" and (tmp_path / "atexit.txt").read_text() == "ran"
    assert run("from nerkit.ending import end_process\nend_process(None)", tmp_path).returncode == 0


def test_the_interpreter_exits_where_its_teardown_matters(tmp_path):
    message = run("from nerkit.ending import end_process\nend_process('a message')", tmp_path)
    assert (message.returncode, message.stderr.strip()) == (1, "a message")
    waited = run(
        "import threading, time\n"
        "from nerkit.ending import end_process\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread done', flush=True))).start()\n"
        "end_process(0)\n", tmp_path)
    assert (waited.returncode, waited.stdout) == (0, "thread done\n")
    profiled = run(
        "import sys\n"
        "from nerkit.ending import end_process\n"
        "sys.setprofile(lambda *args: None)\n"
        "try:\n"
        "    end_process(0)\n"
        "except SystemExit:\n"
        "    sys.setprofile(None); print('the profiler writes its results')\n", tmp_path)
    assert (profiled.returncode, profiled.stdout) == (0, "the profiler writes its results\n")
