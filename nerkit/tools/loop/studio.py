"""A Label Studio of one's own on 127.0.0.1 (the `label-studio` package, which `make label-studio`
installs into .venv-ls), and the calls of its API that drive a project as its people do: create
it, import tasks, connect a model, annotate, press "Start training", retrieve predictions.
`nerkit bench label-studio` measures the loop with it and the tests check the loop against it.

Label Studio refuses a model on a loopback address unless told (ML_BLOCK_LOCAL_IP, and
SSRF_PROTECTION_ENABLED for the webhook it adds when a model connects): the instance started here
is told, and listens on 127.0.0.1 only. Every request has a timeout."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from nerkit.data.annotation import LABEL_STUDIO_DATA_KEY, LABEL_STUDIO_FROM_NAME, LABEL_STUDIO_TO_NAME
from nerkit.errors import UserError

STARTUP_S = 300  # its first start migrates a fresh database: minutes on a busy machine
TIMEOUT = 60  # seconds a request may take
INSTALL_FIX = "run `make label-studio` (it installs Label Studio into .venv-ls), or set LABEL_STUDIO to its command"


def label_studio_command() -> str | None:
    """Label Studio's command: $LABEL_STUDIO, else the checkout's .venv-ls, else one on the PATH."""
    found = os.environ.get("LABEL_STUDIO") or str(Path(__file__).resolve().parents[3] / ".venv-ls" / "bin" / "label-studio")
    return found if Path(found).is_file() else shutil.which("label-studio")


def ner_config(types) -> str:
    """A labelling config for named entities of `types`, with the names nerkit's Label Studio
    reader and writer use (Label Studio's own NER template)."""
    labels = "".join(f'<Label value="{t}"/>' for t in types)
    return (f'<View>\n  <Labels name="{LABEL_STUDIO_FROM_NAME}" toName="{LABEL_STUDIO_TO_NAME}">{labels}</Labels>\n'
            f'  <Text name="{LABEL_STUDIO_TO_NAME}" value="${LABEL_STUDIO_DATA_KEY}"/>\n</View>')


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabelStudio:
    """A Label Studio's API at `url`, called with the token `token`."""

    def __init__(self, url: str, token: str):
        self.url = url.rstrip("/")
        self.token = token

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Token {self.token}"}

    def call(self, method: str, path: str, params: dict | None = None, body=None, timeout: float = TIMEOUT):
        """`method path` with `body` as JSON: the answer's JSON (None when empty). An answer other
        than 2xx is a UserError with its status and the start of its text."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        data = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        request = urllib.request.Request(f"{self.url}{path}{query}", data=data, method=method,
                                         headers={**self.headers, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                text = answer.read().decode("utf-8")
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", errors="replace")[:300]
            raise UserError(f"Label Studio answered {e.code} to {method} {path}: {detail}", where=self.url) from None
        except (urllib.error.URLError, OSError) as e:
            raise UserError(f"cannot reach Label Studio ({getattr(e, 'reason', e)}) for {method} {path}",
                            where=self.url, fix="check the Label Studio URL") from None
        return json.loads(text) if text.strip() else None

    # ------------------------------------------------------------------ a project, as its people drive it

    def version(self) -> str:
        return str((self.call("GET", "/api/version") or {}).get("release", "unknown"))

    def create_project(self, title: str, label_config: str) -> int:
        return self.call("POST", "/api/projects", body={"title": title, "label_config": label_config})["id"]

    def update_project(self, project: int, **fields) -> dict:
        """Change a project's settings: its `label_config`, or `min_annotations_to_start_training`
        (Label Studio's own auto-training: "Start model training on annotation submission")."""
        return self.call("PATCH", f"/api/projects/{project}", body=fields)

    def delete_project(self, project: int) -> None:
        self.call("DELETE", f"/api/projects/{project}")

    def import_tasks(self, project: int, data: list[dict]) -> list[dict]:
        """Import tasks (each a task's `data`): the project's tasks, in the order of their ids."""
        self.call("POST", f"/api/projects/{project}/import", body=data)
        return self.tasks(project)

    def tasks(self, project: int) -> list[dict]:
        tasks, page = [], 1
        while True:
            answer = self.call("GET", "/api/tasks", params={"project": project, "page": page, "page_size": 100})
            tasks += answer["tasks"]
            if len(tasks) >= answer["total"] or not answer["tasks"]:
                return sorted(tasks, key=lambda t: t["id"])
            page += 1

    def connect(self, project: int, backend_url: str, title: str = "nerkit") -> dict:
        """Connect a model (an ML backend) to the project, as Settings > Model > Connect model does;
        Label Studio adds a webhook to the backend's /webhook as it does so. The model's record."""
        model = self.call("POST", "/api/ml", body={"url": backend_url, "project": project, "title": title})
        if model.get("readable_state") != "Connected":
            raise UserError(f"Label Studio could not connect the model at {backend_url}: {model.get('error_message') or model}",
                            where=self.url)
        return model

    def annotate(self, task: int, result: list[dict]) -> dict:
        """Submit an annotation of a task, as an annotator's Submit does."""
        return self.call("POST", f"/api/tasks/{task}/annotations", body={"result": result, "was_cancelled": False})

    def train(self, model: int) -> None:
        """The "Start training" button: Label Studio sends START_TRAINING to the model's /webhook."""
        self.call("POST", f"/api/ml/{model}/train", body={})

    def retrieve_predictions(self, project: int, tasks: list[int] | None = None) -> None:
        """The data manager's "Retrieve predictions" on `tasks` (None: all): Label Studio asks the
        model for a prediction of every task that has none by the version the model's /setup names."""
        selected = {"all": True, "excluded": []} if tasks is None else {"all": False, "included": list(tasks)}
        self.call("POST", "/api/dm/actions", params={"id": "retrieve_tasks_predictions", "project": project},
                  body={"selectedItems": selected})

    def predictions(self, project: int | None = None, task: int | None = None) -> list[dict]:
        params = {k: v for k, v in (("project", project), ("task", task)) if v is not None}
        return self.call("GET", "/api/predictions", params=params)


@contextmanager
def started(root: Path, startup_s: float = STARTUP_S) -> Iterator[tuple[LabelStudio, subprocess.Popen, Path]]:
    """A fresh Label Studio (its database and files under `root`) on a free port of 127.0.0.1, up:
    (its API, its process, its log). Stopped (SIGTERM, then SIGKILL) when the block ends. Not
    installed, or not up in `startup_s` seconds: a UserError (the latter with the end of its log)."""
    command = label_studio_command()
    if command is None:
        raise UserError("Label Studio is not installed", fix=INSTALL_FIX)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    port, token = free_port(), secrets.token_hex(20)
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "ML_BLOCK_LOCAL_IP": "false", "SSRF_PROTECTION_ENABLED": "false",
           "LABEL_STUDIO_BASE_DATA_DIR": str(root), "SENTRY_DSN": "", "FRONTEND_SENTRY_DSN": ""}
    log = root / "label-studio.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([command, "start", "--no-browser", "--port", str(port), "--host", url,
                                    "--internal-host", "127.0.0.1", "--data-dir", str(root / "data"),
                                    "--username", "nerkit@example.com", "--password", secrets.token_hex(8),
                                    "--user-token", token, "--enable-legacy-api-token"],
                                   cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        wait_until_up(process, f"{url}/health", startup_s, log)
        yield LabelStudio(url, token), process, log
    finally:
        stop(process)


def wait_until_up(process: subprocess.Popen, url: str, seconds: float, log: Path) -> None:
    """Poll `url` until it answers 200; a process that ends first, or `seconds` passing, is a
    UserError with the end of its log."""
    deadline = time.monotonic() + seconds
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            tail = " | ".join(log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-5:])
            state = f"ended with exit code {process.returncode}" if process.poll() is not None else \
                f"did not answer in {seconds:g} s"
            raise UserError(f"Label Studio {state}: {tail}", where=str(log))
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)


def stop(process: subprocess.Popen, seconds: float = 30) -> None:
    """SIGTERM to its session (Label Studio's server runs in a child process), SIGKILL after `seconds`."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
