"""Label Studio's training loop without Label Studio (nerkit.tools.loop): the queue that runs one job
at a time and folds the requests that come meanwhile into one next job, the version store (names,
the served record that a restart reads, pruning that keeps the served version), the held-out choice
that stays put as a project grows, and the promotion policy. The loop against a real Label Studio is
in test_label_studio.py."""

from __future__ import annotations

import json
import threading

import pytest

from nerkit.errors import UserError
from nerkit.tools.loop.backend import not_worse
from nerkit.tools.loop.job import held_out
from nerkit.tools.loop.queue import CoalescingQueue
from nerkit.tools.loop.versions import VERSION_NAME, Served, VersionStore, version_name


def test_requests_made_while_a_job_runs_become_one_next_job():
    release, started, ran, done = threading.Event(), threading.Event(), [], []

    def run(request):
        ran.append(request)
        started.set()
        release.wait(10)

    queue = CoalescingQueue(run, lambda request, error: done.append((request, error)))
    assert queue.submit("a") == "started"
    assert started.wait(10)
    assert queue.submit("b") == "queued"
    assert queue.submit("c") == "coalesced" and queue.submit("d") == "coalesced"
    release.set()
    assert queue.wait_idle(10)
    assert ran == ["a", "d"] and queue.coalesced == 2 and queue.jobs == 2
    assert done == [("a", None), ("d", None)]
    queue.stop(10)


def test_a_failed_job_is_reported_and_the_next_one_still_runs():
    def run(request):
        if request == "bad":
            raise RuntimeError("boom")

    done = []
    queue = CoalescingQueue(run, lambda request, error: done.append((request, str(error) if error else None)))
    queue.submit("bad")
    assert queue.wait_idle(10)
    queue.submit("good")
    assert queue.wait_idle(10)
    assert done == [("bad", "boom"), ("good", None)]
    queue.stop(10)


def test_versions_are_numbered_and_the_served_one_survives_a_new_store(tmp_path):
    store = VersionStore(tmp_path / "models")
    initial = Served("nerkit 0.1.0 demo", tmp_path / "demo")
    assert store.served(initial) == initial and store.next_name(0).startswith("v1-19700101T")
    for n in (1, 2, 3):
        (store.root / version_name(n, n * 3600)).mkdir()
    assert [VERSION_NAME.match(v).group(1) for v in store.versions()] == ["1", "2", "3"]
    assert store.next_name().startswith("v4-")
    second = Served(store.versions()[1], store.root / store.versions()[1])
    store.serve(second, {"f1": 0.5})
    assert VersionStore(tmp_path / "models").served(initial) == second  # a restart reads it back
    assert json.loads((store.root / "served.json").read_text())["path"] == second.path.name  # the directory may move
    oldest = store.versions()[0]
    assert store.prune(1, second) == [oldest]  # the newest kept, and the served one beyond it
    assert [v.split("-")[0] for v in store.versions()] == ["v2", "v3"]


def test_a_served_record_that_names_no_directory_is_refused_with_the_fix(tmp_path):
    store = VersionStore(tmp_path)
    (tmp_path / "served.json").write_text(json.dumps({"version": "v9-20260101T000000", "path": "v9-20260101T000000"}))
    with pytest.raises(UserError, match="not there") as info:
        store.served(Served("x", tmp_path))
    assert "served.json" in str(info.value) and "remove" in str(info.value)


def test_held_out_tasks_stay_held_out_as_the_project_grows():
    first = held_out(list(range(1, 41)), 0.2, 13)
    later = held_out(list(range(1, 201)), 0.2, 13)
    assert first and first <= later  # a task held out once is never trained on later
    assert 0.1 < len(later) / 200 < 0.3
    assert len(held_out([1, 2, 3], 0.2, 13)) == 1  # tiny projects: one held out, two left to train on
    assert held_out(list(range(1, 41)), 0.2, 14) != first  # the seed chooses them


def test_a_new_version_is_served_when_it_is_not_worse():
    assert not_worse(0.8, 0.8) and not_worse(0.81, 0.8) and not not_worse(0.79, 0.8)
