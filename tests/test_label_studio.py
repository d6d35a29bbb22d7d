"""`nerkit serve --label-studio` against a real Label Studio (the `label-studio` package, installed
by `make label-studio` into .venv-ls, or wherever LABEL_STUDIO names its command), started on a free
port of 127.0.0.1 with a fresh database: a project with Label Studio's NER config, tasks imported,
nerkit connected as its model through Label Studio's API, and the pre-annotations read back through
that API, each region's offsets, label and score, and each prediction's score, exactly what
`nerkit predict` gives, nested and overlapping ones included (a span-head model). Skipped, saying
so, when Label Studio is not installed.

Label Studio refuses a model on a loopback address unless told (ML_BLOCK_LOCAL_IP, and
SSRF_PROTECTION_ENABLED for the webhook it adds): this instance is told, and listens on 127.0.0.1 only.
Every request has a timeout; the test sends a few dozen at most."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from helpers import NESTED_SENTENCES, REPO, TINY_TRAIN, free_port, serving, stop, train_nested_span_model, wait_until_up

from nerkit.data.annotation import label_studio_result

pytestmark = pytest.mark.slow

LABEL_STUDIO_STARTUP = 300  # seconds: its first start migrates a fresh database
TIMEOUT = 60
NER_CONFIG = """<View>
  <Labels name="label" toName="text">
    <Label value="PER"/><Label value="LOC"/><Label value="ORG"/>
  </Labels>
  <Text name="text" value="$text"/>
</View>"""
TEXTS = ["张三在北京大学读书。", "李四去了上海，王五留在武汉。", "今天天气很好", "赵六和华中科技大学的老师见面。"]


def label_studio_command() -> str | None:
    found = os.environ.get("LABEL_STUDIO") or str(REPO / ".venv-ls" / "bin" / "label-studio")
    return found if Path(found).is_file() else shutil.which("label-studio")


@pytest.fixture(scope="module")
def label_studio(tmp_path_factory):
    """A Label Studio on a free port of 127.0.0.1: (its URL, the headers of its API)."""
    command = label_studio_command()
    if command is None:
        pytest.skip("Label Studio is not installed (`make label-studio` installs it into .venv-ls)")
    root = tmp_path_factory.mktemp("label_studio")
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
                                   cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until_up(process, f"{url}/health", LABEL_STUDIO_STARTUP, log)
        yield url, {"Authorization": f"Token {token}"}
    finally:
        stop(process)


@pytest.fixture(scope="module")
def backend(tiny_model_dir, tmp_path_factory):
    """`nerkit serve --label-studio` on a free port of 127.0.0.1: its URL."""
    with serving(tiny_model_dir, tmp_path_factory.mktemp("backend"), "--label-studio") as server:
        yield server.url


def api(label_studio, method: str, path: str, **kwargs) -> dict | list:
    url, headers = label_studio
    answer = httpx.request(method, f"{url}{path}", headers=headers, timeout=TIMEOUT, **kwargs)
    assert answer.status_code in (200, 201), f"{method} {path}: {answer.status_code} {answer.text[:500]}"
    return answer.json()


def pre_annotated(label_studio, backend: str, label_config: str, texts: list[str]) -> tuple[dict, dict]:
    """A project of `texts` under `label_config`, `backend` connected as its model, every task's
    prediction retrieved through Label Studio: ({text: the prediction it keeps}, the model it lists)."""
    project = api(label_studio, "POST", "/api/projects", json={"title": "nerkit", "label_config": label_config})
    api(label_studio, "POST", f"/api/projects/{project['id']}/import", json=[{"text": t} for t in texts])
    model = api(label_studio, "POST", "/api/ml", json={"url": backend, "project": project["id"], "title": "nerkit"})
    assert model["readable_state"] == "Connected", model
    done = api(label_studio, "POST", "/api/dm/actions", params={"id": "retrieve_tasks_predictions",
                                                                 "project": project["id"]},
               json={"selectedItems": {"all": True, "excluded": []}})
    assert done["processed_items"] == len(texts), done
    tasks = {t["id"]: t["data"]["text"] for t in api(label_studio, "GET", "/api/tasks",
                                                       params={"project": project["id"]})["tasks"]}
    predictions = {p["task"]: p for p in api(label_studio, "GET", "/api/predictions", params={"project": project["id"]})}
    assert set(predictions) == set(tasks)
    return {text: predictions[task] for task, text in tasks.items()}, model


def test_a_label_studio_project_is_pre_annotated_with_scores(label_studio, backend, tiny_model_dir):
    from nerkit.inference.pipeline import Pipeline

    predictions, model = pre_annotated(label_studio, backend, NER_CONFIG, TEXTS)
    assert model["model_version"].startswith("nerkit ")
    expected = dict(zip(TEXTS, Pipeline.load(tiny_model_dir).predict(TEXTS, scores=True)))
    assert any(expected.values()), "the tiny model finds no entity: the test would check nothing"
    for text, prediction in predictions.items():
        entities = expected[text]
        regions = [(r["value"]["start"], r["value"]["end"], r["value"]["labels"], r["value"]["text"]) for r in prediction["result"]]
        assert regions == [(e["start"], e["end"], [e["type"]], e["text"]) for e in entities]
        assert all(text[start:end] == shown for start, end, _, shown in regions)
        assert [r["score"] for r in prediction["result"]] == pytest.approx([e["score"] for e in entities], abs=1e-6)
        assert prediction["model_version"] == model["model_version"]
        if entities:
            assert prediction["score"] == pytest.approx(min(e["score"] for e in entities), abs=1e-6)
        else:
            assert prediction["score"] is None


def test_nested_predictions_of_a_span_model_reach_label_studio_as_overlapping_regions(label_studio, tmp_path):
    """A span-head model (nested entities) as Label Studio's model: the regions Label Studio keeps
    overlap and nest as the model's spans do, each with its offsets, label and score."""
    from nerkit.inference.pipeline import Pipeline

    model_dir, _ = train_nested_span_model(tmp_path)
    texts = [t for t, _ in NESTED_SENTENCES]
    expected = dict(zip(texts, Pipeline.load(model_dir).predict(texts, scores=True)))
    assert any(a["end"] > b["start"] and b["end"] > a["start"] for found in expected.values()
               for a, b in zip(found, found[1:])), "no overlapping prediction: the test would check nothing"
    with serving(model_dir, tmp_path, "--label-studio") as server:
        predictions, _ = pre_annotated(label_studio, server.url, NER_CONFIG, texts)  # the nested corpus' types too
    for text, prediction in predictions.items():
        regions = [(r["value"]["start"], r["value"]["end"], r["value"]["labels"]) for r in prediction["result"]]
        assert regions == [(e["start"], e["end"], [e["type"]]) for e in expected[text]]
        assert [r["score"] for r in prediction["result"]] == pytest.approx([e["score"] for e in expected[text]], abs=1e-6)


def test_the_backend_answers_what_label_studio_sends(backend):
    """Label Studio's other calls, as it makes them: a training request is refused with what to do
    instead; other events are acknowledged; a config without <Labels> is refused with the reason."""
    training = httpx.post(f"{backend}/webhook", json={"action": "START_TRAINING", "project": {"id": 1}},
                          timeout=TIMEOUT)
    assert training.status_code == 501 and "nerkit train" in training.json()["error"]
    assert httpx.post(f"{backend}/train", json={}, timeout=TIMEOUT).status_code == 501
    event = httpx.post(f"{backend}/webhook", json={"action": "ANNOTATION_CREATED"}, timeout=TIMEOUT)
    assert event.status_code == 200 and event.json()["status"] == "ignored"
    choices = "<View><Choices name='c' toName='text'><Choice value='a'/></Choices><Text name='text' value='$text'/></View>"
    refused = httpx.post(f"{backend}/setup", json={"project": "9.1", "schema": choices}, timeout=TIMEOUT)
    assert refused.status_code == 422 and "<Labels" in refused.json()["detail"]
    other_key = NER_CONFIG.replace('value="$text"', 'value="$sentence"')
    answer = httpx.post(f"{backend}/predict", json={"tasks": [{"id": 5, "data": {"sentence": TEXTS[0]}}],
                                                    "label_config": other_key}, timeout=TIMEOUT)
    assert answer.status_code == 200 and len(answer.json()["results"]) == 1
    missing = httpx.post(f"{backend}/predict", json={"tasks": [{"id": 5, "data": {"text": TEXTS[0]}}],
                                                     "label_config": other_key}, timeout=TIMEOUT)
    assert missing.status_code == 422 and "data.sentence" in missing.json()["detail"]


def test_the_documented_start_command_uses_options_label_studio_has(tmp_path):
    """Issue 55: docs/confidence.md did not say how to start Label Studio; the command its set-up
    gives takes only options of this Label Studio's `start` (--host, for one, is not the address
    it listens on: --internal-host is)."""
    command = label_studio_command()
    if command is None:
        pytest.skip("Label Studio is not installed (`make label-studio` installs it into .venv-ls)")
    page = (REPO / "docs" / "confidence.md").read_text(encoding="utf-8")
    started = re.search(r"\.venv-ls/bin/label-studio start ([^\n`]*)", page)
    assert started, "docs/confidence.md does not say how to start Label Studio"
    options = re.findall(r"--[a-z-]+", started.group(1))
    env = {**os.environ, "LABEL_STUDIO_BASE_DATA_DIR": str(tmp_path)}
    usage = subprocess.run([command, "start", "--help"], capture_output=True, text=True, env=env, timeout=TIMEOUT * 2).stdout
    assert "--internal-host" in options and all(re.search(rf"{option}\b", usage) for option in options), (options, usage)


# ----------------------------------------------------------------------- the training loop (--models)

LOOP_TASKS = 12  # tiny-corpus sentences annotated in the project; a job trains 2 epochs on them (a few seconds)
JOB_TIMEOUT = 240  # seconds a training job may take on a busy machine (a fresh process importing torch)


def loop_config(directory: Path) -> Path:
    """Each job's training config: the tiny model's recipe, 2 epochs."""
    import yaml

    from helpers import tiny_raw_config

    raw = tiny_raw_config()
    raw["train"]["epochs"] = 2
    path = directory / "loop.yaml"
    path.write_text(yaml.safe_dump({"data": {"max_len": 250}, "train": raw["train"]}), encoding="utf-8")
    return path


def annotated_project(label_studio) -> tuple[int, list[int]]:
    """A project of tiny-corpus sentences, the last one partial (data.unknown over a region without an
    entity): (its id, its task ids). Annotated later, through the API, as an annotator would."""
    from nerkit.data.corpus import read_corpus

    sentences = read_corpus(TINY_TRAIN).sentences[:LOOP_TASKS]
    project = api(label_studio, "POST", "/api/projects", json={"title": "loop", "label_config": NER_CONFIG})
    data = [{"text": s.text} for s in sentences]
    last = sentences[-1]
    free = next(i for i in range(len(last.text) - 1, 0, -1) if not any(sp.start <= i < sp.end for sp in last.spans()))
    data[-1]["unknown"] = [[free, free + 1]]
    api(label_studio, "POST", f"/api/projects/{project['id']}/import", json=data)
    tasks = api(label_studio, "GET", "/api/tasks", params={"project": project["id"]})["tasks"]
    by_text = {s.text: s for s in sentences}
    ids = []
    for task in sorted(tasks, key=lambda t: t["id"]):
        sentence = by_text[task["data"]["text"]]
        spans = [sp for sp in sentence.spans() if not any(a <= sp.start < b for a, b in task["data"].get("unknown", []))]
        ids.append((task["id"], label_studio_result(sentence.text, spans)))
    return project["id"], ids


def health(server) -> dict:
    return httpx.get(f"{server.url}/health", timeout=TIMEOUT).json()["training"]


def wait_for_job(server, jobs_before: int, deadline: float = JOB_TIMEOUT) -> dict:
    """The outcome of the next job to end (`/health`'s training.last), polled."""
    import time

    end = time.monotonic() + deadline
    while time.monotonic() < end:
        state = health(server)
        if state["last"] is not None and state["jobs"] > jobs_before and state["state"] == "idle":
            return state
        assert server.process.poll() is None, server.output()[-3000:]
        time.sleep(0.5)
    pytest.fail(f"no training job ended in {deadline} s:\n{server.output()[-3000:]}")


def train_button(label_studio, model_id: int) -> None:
    """Label Studio's "Start training" button: its API call, which sends START_TRAINING to the backend."""
    url, headers = label_studio
    answer = httpx.post(f"{url}/api/ml/{model_id}/train", headers=headers, json={}, timeout=TIMEOUT)
    assert answer.status_code == 200, answer.text[:500]  # an empty body


def test_label_studio_trains_a_new_version_and_serves_it(label_studio, tiny_model_dir, tmp_path):
    """The loop closed against a real Label Studio: tasks annotated through its API, the training started
    as its button starts it, predictions answered by the old model while the job runs, the new version
    swapped in and Label Studio's predictions then carrying it; a job killed midway leaves the served
    version as it was and runs again after a restart, which serves the version served before it; a
    worse model is kept on disk and not served."""
    import json
    import time

    models = tmp_path / "models"
    url, headers = label_studio
    token = headers["Authorization"].split()[1]
    project, tasks = annotated_project(label_studio)
    base = ("--label-studio", "--models", models, "--label-studio-url", url, "--label-studio-api-key", token,
            "--train-config", loop_config(tmp_path), "--train-every", "0", "--holdout", "0.25")
    # lr 0: the new version predicts as the old one, a tie, which the policy serves
    with serving(tiny_model_dir, tmp_path, *base, "--train-set", "train.lr=0") as server:
        model = api(label_studio, "POST", "/api/ml", json={"url": server.url, "project": project, "title": "nerkit"})
        first_version = model["model_version"]
        for task, result in tasks:  # each fires ANNOTATION_CREATED at the backend, counted (--train-every 0)
            api(label_studio, "POST", f"/api/tasks/{task}/annotations", json={"result": result, "was_cancelled": False})
        assert health(server)["state"] == "idle"
        train_button(label_studio, model["id"])
        while health(server)["state"] != "training":
            time.sleep(0.1)
        answer = httpx.post(f"{server.url}/predict", json={"tasks": [{"id": 1, "data": {"text": TEXTS[0]}}],
                                                            "label_config": NER_CONFIG}, timeout=TIMEOUT)
        assert answer.status_code == 200 and answer.json()["results"][0]["model_version"] == first_version
        state = wait_for_job(server, 0)
        assert state["last"]["status"] == "finished" and state["last"]["served"], state
        new_version = state["served"]
        assert re.fullmatch(r"v1-\d{8}T\d{6}", new_version) and (models / new_version / "nerkit.json").is_file()
        assert json.loads((models / "served.json").read_text())["version"] == new_version
        assert state["last"]["tasks"]["partial"] == 1 and state["last"]["tasks"]["heldout"] >= 1
        predictions, _ = pre_annotated_again(label_studio, project)
        assert {p["model_version"] for p in predictions if p["model_version"] == new_version}, predictions

        # a job killed midway: the served version stays, the failure is reported, Label Studio hears it
        train_button(label_studio, model["id"])
        while not (health(server)["job"] or {}).get("pid"):
            time.sleep(0.1)
        os.kill(health(server)["job"]["pid"], 9)
        state = wait_for_job(server, 1)
        assert state["last"]["status"] == "failed" and "SIGKILL" in state["last"]["error"], state
        assert state["served"] == new_version and (models / ".jobs" / "pending.json").is_file()
        refused = httpx.post(f"{server.url}/webhook", json={"action": "START_TRAINING", "project": {
            "id": project, "label_config": NER_CONFIG}}, timeout=TIMEOUT)
        assert refused.status_code == 500 and "failed" in refused.json()["error"]  # and queued again
        server.process.send_signal(15)  # stops that job too: it runs again on restart
        server.process.wait(60)

    # the restart serves the version served before, and the interrupted job runs again; a worse model
    # (a learning rate that wrecks it) is kept on disk but not served
    with serving(tiny_model_dir, tmp_path, *base, "--train-set", "train.lr=50") as server:
        assert health(server)["served"] == new_version
        state = wait_for_job(server, 0)
        assert state["last"]["status"] == "finished" and not state["last"]["served"], state
        assert state["last"]["f1"] < state["last"]["served_f1"]
        assert state["served"] == new_version and (models / state["last"]["version"]).is_dir()
        assert not (models / ".jobs" / "pending.json").exists()
        answer = httpx.post(f"{server.url}/predict", json={"tasks": [{"id": 1, "data": {"text": TEXTS[0]}}],
                                                            "label_config": NER_CONFIG}, timeout=TIMEOUT)
        assert answer.json()["results"][0]["model_version"] == new_version


def pre_annotated_again(label_studio, project: int) -> tuple[list[dict], dict]:
    """Label Studio's "Retrieve predictions" on every task of `project`, then every prediction it keeps."""
    api(label_studio, "POST", "/api/dm/actions", params={"id": "retrieve_tasks_predictions", "project": project},
        json={"selectedItems": {"all": True, "excluded": []}})
    return api(label_studio, "GET", "/api/predictions", params={"project": project}), {}
