"""The training side of `nerkit serve --label-studio --models DIR` (docs/label-studio-loop.md):
Label Studio's events become training requests, coalesced into one job at a time (`queue`), each
job a process of its own (`job`); a finished job's model is served in place of the current one when
it is not worse on the held-out tasks (`promote`), the choice recorded on disk (`versions`) so
that a restart serves it again. The server hands `Trainer` its way of serving a model (`attach`)
and passes it Label Studio's training calls (`event`, `train_call`); nothing here touches HTTP.

Faults: a job that fails or is killed leaves the served model as it was; it is reported in the log,
in /health's `training` and to Label Studio (the next training request is answered with the
failure, which Label Studio shows as the model's error), and it runs again on the next event or
when the server restarts (`MODELS/.jobs/pending.json` holds the request until a job for it ends well).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from nerkit.ending import stop_child
from nerkit.errors import UserError, killed_by
from nerkit.files import atomic_write_text
from nerkit.tools.loop.job import API_KEY, ERROR, RESULT
from nerkit.tools.loop.queue import CoalescingQueue
from nerkit.tools.loop.versions import Served, VersionStore

log = logging.getLogger(__name__)

PENDING = "pending.json"
TRAINING_ACTIONS = ("START_TRAINING",)  # the "Start training" button, and Label Studio's own auto-training
ANNOTATION_ACTIONS = ("ANNOTATION_CREATED", "ANNOTATION_UPDATED")
STOP_WAIT = 30  # seconds a job has to stop on SIGTERM when the server stops


@dataclass
class LoopOptions:
    """How the loop trains (the `nerkit serve` options of docs/label-studio-loop.md)."""

    models: Path  # where versions and jobs live
    label_studio_url: str
    api_key: str
    train_config: Path | None = None  # None: the served model's own config.yaml
    train_every: int = 10  # annotations (created or updated) that start a job; 0: the button only
    keep: int = 5  # versions kept on disk (the served one always)
    holdout: float = 0.2  # share of completely annotated tasks held out to score versions on
    seed: int = 13  # of the held-out choice
    overrides: tuple[str, ...] = ()  # --set on the training config


class JobFailed(Exception):
    """A job ended without a model: its one-line reason."""


def not_worse(new_f1: float, served_f1: float) -> bool:
    """The policy: a new version is served when its micro-F1 on the held-out tasks is at least the
    served model's on the same tasks (a tie goes to the model that saw more annotations)."""
    return new_f1 >= served_f1


class Trainer:
    """Training requests in, versions out. `initial` is the model the server was started with,
    served until a version replaces it."""

    def __init__(self, options: LoopOptions, initial: Served):
        if not options.label_studio_url or not options.api_key:
            raise UserError("training from Label Studio reads the project's annotations through its API",
                            fix="pass --label-studio-url and --label-studio-api-key (or set LABEL_STUDIO_URL and "
                                "LABEL_STUDIO_API_KEY)")
        if options.train_config is not None and not Path(options.train_config).is_file():
            raise UserError("no such file", where=str(options.train_config), fix="pass --train-config a YAML config")
        self.options = options
        self.store = VersionStore(options.models)
        self.initial = initial
        self.served = self.store.served(initial)
        self.queue = CoalescingQueue(self._run, self._finished)
        self.serve: Callable[[Served], None] | None = None
        self.process: subprocess.Popen | None = None
        self.job: dict | None = None  # the job running: its id, version and directory
        self.last: dict | None = None  # the last job's outcome, for /health and Label Studio
        self.since: dict[str, int] = {}  # per project: annotation events since its last training request
        self._lock = threading.Lock()
        self._result: dict = {}  # the job just finished, from the training thread's `_run` to `_finished`

    @classmethod
    def for_model(cls, model: Path, options: LoopOptions) -> "Trainer":
        """The loop of a server started with `--model model`: that model is served until a version is."""
        from nerkit.inference.formats import directory_version

        return cls(options, Served(directory_version(model), Path(model)))

    # ------------------------------------------------------------------------------ the server's side

    def attach(self, serve: Callable[[Served], None]) -> None:
        """`serve(served)` loads and serves a version (called on the training thread); a request
        left by a job that did not end well (killed with the server, say) runs again now."""
        self.serve = serve
        pending = self.store.jobs / PENDING
        if pending.is_file():
            request = json.loads(pending.read_text(encoding="utf-8"))
            log.warning(f"a training job for project {request['project']} did not finish before the server stopped: "
                        "it runs again now")
            self.queue.submit(request)

    def stop(self) -> None:
        """Start no job; a running one is stopped (SIGTERM, then SIGKILL) and runs again on restart."""
        self.queue.stop(timeout=0)
        if self.process is not None:
            stop_child(self.process, STOP_WAIT)

    def event(self, payload: dict) -> tuple[int, dict]:
        """Label Studio's webhook (POST /webhook): (HTTP status, body). START_TRAINING asks for a
        job; an annotation created or updated counts towards `train_every`, and restarts a job that
        did not end well; other events are acknowledged."""
        action = payload.get("action")
        project = payload.get("project") if isinstance(payload.get("project"), dict) else {}
        if action in TRAINING_ACTIONS:
            return self.request(project.get("id"), project.get("label_config"), "the training button")
        if action not in ANNOTATION_ACTIONS:
            return 200, {"status": "ignored", "action": action}
        key = str(project.get("id"))
        with self._lock:
            self.since[key] = self.since.get(key, 0) + 1
            due = 0 < self.options.train_every <= self.since[key]
        retry = (self.store.jobs / PENDING).is_file() and not self.queue.busy
        if due or retry:
            why = f"{self.since[key]} new annotations" if due else "a job that did not end well, again"
            status, body = self.request(project.get("id"), project.get("label_config"), why)
            return (200 if status == 500 else status), body  # Label Studio ignores a webhook's answer
        return 200, {"status": "counted", "action": action, "annotations": self.since[key],
                     "train_every": self.options.train_every}

    def train_call(self, payload: dict) -> tuple[int, dict]:
        """The older protocol's POST /train (`project` as "ID.TIMESTAMP", the labelling config beside it)."""
        project = str(payload.get("project") or "").split(".")[0] or None
        return self.request(project, payload.get("label_config"), "POST /train")

    def request(self, project, label_config, reason: str) -> tuple[int, dict]:
        """Queue a job for `project`. Answered 200 with the job's place, or, when the last job failed,
        500 with its reason (the job queued all the same): Label Studio shows a failed training
        request as its model's error, the only place its protocol has for a backend's fault."""
        if project is None or not isinstance(label_config, str) or not label_config.strip():
            return 422, {"status": "error", "error": "the training request names no project and labelling config"}
        request = {"project": project, "label_config": label_config, "reason": reason,
                   "requested": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        with self._lock:
            self.since[str(project)] = 0
            atomic_write_text(self.store.jobs / PENDING, json.dumps(request, ensure_ascii=False) + "\n")
            state = self.queue.submit(request)
        log.info(f"training requested for project {project} ({reason}): {state}")
        body = {"status": "ok", "job": state, "model_version": self.served.version}
        last = self.last
        if last is not None and last["status"] == "failed":
            return 500, {"status": "error", "error": f"the last training job ({last['job']}) failed: {last['error']}; "
                                                      "it was queued again", "job": state}
        return 200, body

    def status(self) -> dict:
        """For /health: the served version, the job running (its pid) and the last job's outcome."""
        job, process = self.job, self.process
        return {"served": self.served.version, "state": "training" if job else "idle",
                "job": {**job, "pid": process.pid} if job and process else job,
                "next_waiting": self.queue.waiting, "jobs": self.queue.jobs, "coalesced": self.queue.coalesced,
                "train_every": self.options.train_every, "last": self.last}

    def versions(self) -> list[str]:
        """Every version on disk, the served one included (the server's first model, too, while served)."""
        found = self.store.versions()
        return found if self.served.version in found else [self.served.version, *found]

    # ------------------------------------------------------------------------------ the training thread

    def _run(self, request: dict) -> None:
        started = time.time()
        job_id = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started)) + f"-{self.queue.jobs + 1}"
        directory = self.store.jobs / job_id
        directory.mkdir(parents=True, exist_ok=True)
        version = self.store.next_name(started)
        served = self.served
        spec = {"job": job_id, "version": version, "directory": str(directory), "versions": str(self.store.root),
                "project": request["project"], "label_config": request["label_config"],
                "label_studio_url": self.options.label_studio_url, "current": str(served.path),
                "current_version": served.version, "holdout": self.options.holdout, "seed": self.options.seed,
                "train_config": str(self.options.train_config) if self.options.train_config else None,
                "overrides": list(self.options.overrides)}
        atomic_write_text(directory / "spec.json", json.dumps(spec, ensure_ascii=False, indent=2) + "\n")
        env = {**os.environ, API_KEY: self.options.api_key}
        job_log = directory / "job.log"
        self.job = {"id": job_id, "version": version, "project": request["project"], "log": str(job_log),
                    "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))}
        try:
            with open(job_log, "wb") as out:
                self.process = subprocess.Popen([sys.executable, "-m", "nerkit.tools.loop.job", str(directory / "spec.json")],
                                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            log.info(f"training job {job_id} started (pid {self.process.pid}): version {version} from {served.version}; "
                     f"its log: {job_log}")
            code = self.process.wait()
            if (directory / RESULT).is_file() and code == 0:
                self._result = json.loads((directory / RESULT).read_text(encoding="utf-8"))
                self._result["seconds"] = round(time.time() - started, 1)
                return
            if (directory / ERROR).is_file():
                raise JobFailed(json.loads((directory / ERROR).read_text(encoding="utf-8"))["error"])
            raise JobFailed(f"the job's process ended {killed_by(code) if code < 0 else f'with exit code {code}'} "
                            f"before it finished (its log: {job_log})")
        finally:
            self.process, self.job = None, None

    def _finished(self, request: dict, error: BaseException | None) -> None:
        if error is not None:
            reason = str(error) if isinstance(error, JobFailed) else f"{type(error).__name__}: {error}"
            self.last = {"status": "failed", "job": request.get("job") or self._last_job_id(), "error": reason}
            log.error(f"training job for project {request['project']} failed: {reason}; the served model stays "
                      f"{self.served.version}, and the job runs again on the next event or restart")
            return
        result = self._result
        served_before = self.served
        promoted = not_worse(result["f1"], result["served_f1"])
        new = Served(result["version"], Path(result["path"]))
        if promoted:
            try:
                self.serve(new)
            except Exception as e:  # noqa: BLE001 - a model that does not load is not served, and said
                self.last = {"status": "failed", "job": result["job"], "error": f"version {new.version} did not load: {e}"}
                log.exception(f"version {new.version} did not load; {served_before.version} is still served")
                return
            self.store.serve(new, {"f1": result["f1"], "previous": served_before.version,
                                   "previous_f1": result["served_f1"]})
            self.served = new
        outcome = "served" if promoted else "kept, not served"
        self.last = {"status": "finished", "job": result["job"], "version": new.version, "served": promoted,
                     "f1": result["f1"], "served_f1": result["served_f1"], "seconds": result["seconds"],
                     "tasks": result["tasks"]}
        log.info(f"training job {result['job']}: version {new.version}, held-out F1 {100 * result['f1']:.2f} against "
                 f"{served_before.version}'s {100 * result['served_f1']:.2f} on the same {result['tasks']['heldout']} "
                 f"tasks: {outcome} ({result['seconds']} s)")
        removed = self.store.prune(self.options.keep, self.served)
        if removed:
            log.info(f"removed old versions {', '.join(removed)} (--keep {self.options.keep})")
        shutil.rmtree(self.store.jobs / result["job"], ignore_errors=True)
        with self._lock:  # a request made meanwhile wrote its own pending.json: keep it
            if not self.queue.waiting:
                (self.store.jobs / PENDING).unlink(missing_ok=True)

    def _last_job_id(self) -> str | None:
        jobs = sorted(p.name for p in self.store.jobs.iterdir() if p.is_dir())
        return jobs[-1] if jobs else None
