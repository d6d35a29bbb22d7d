"""`nerkit serve --label-studio` against a real Label Studio (the `label-studio` package, installed
by `make label-studio` into .venv-ls, or wherever LABEL_STUDIO names its command), started on a free
port of 127.0.0.1 with a fresh database: a project with Label Studio's NER config, tasks imported,
nerkit connected as its model through Label Studio's API, and the pre-annotations read back through
that API, each region's offsets, label and score, and each prediction's score, exactly what
`nerkit predict` gives, nested and overlapping ones included (a span-head model). Skipped, saying
so, when Label Studio is not installed.

Label Studio is started by nerkit.tools.loop.studio (which `nerkit bench label-studio` uses too):
told to accept a model on a loopback address, listening on 127.0.0.1 only. Every request has a
timeout; a test sends a few dozen at most."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import httpx
import pytest
from helpers import NESTED_SENTENCES, REPO, TINY_TRAIN, serving, train_nested_span_model

from nerkit.data.annotation import label_studio_result
from nerkit.tools.loop.studio import label_studio_command, ner_config, started

pytestmark = pytest.mark.slow

TIMEOUT = 60
NER_CONFIG = ner_config(["PER", "LOC", "ORG"])
TEXTS = ["张三在北京大学读书。", "李四去了上海，王五留在武汉。", "今天天气很好", "赵六和华中科技大学的老师见面。"]
NOT_INSTALLED = "Label Studio is not installed (`make label-studio` installs it into .venv-ls)"


@pytest.fixture(scope="module")
def label_studio(tmp_path_factory):
    """A Label Studio on a free port of 127.0.0.1 (nerkit.tools.loop.studio.LabelStudio: its `url`,
    `token` and `headers`)."""
    if label_studio_command() is None:
        pytest.skip(NOT_INSTALLED)
    with started(tmp_path_factory.mktemp("label_studio")) as (studio, _, _):
        yield studio


@pytest.fixture(scope="module")
def backend(tiny_model_dir, tmp_path_factory):
    """`nerkit serve --label-studio` on a free port of 127.0.0.1: its URL."""
    with serving(tiny_model_dir, tmp_path_factory.mktemp("backend"), "--label-studio") as server:
        yield server.url


def api(label_studio, method: str, path: str, **kwargs) -> dict | list:
    answer = httpx.request(method, f"{label_studio.url}{path}", headers=label_studio.headers, timeout=TIMEOUT, **kwargs)
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
        pytest.skip(NOT_INSTALLED)
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
    answer = httpx.post(f"{label_studio.url}/api/ml/{model_id}/train", headers=label_studio.headers, json={},
                        timeout=TIMEOUT)
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
    project, tasks = annotated_project(label_studio)
    base = ("--label-studio", "--models", models, "--label-studio-url", label_studio.url,
            "--label-studio-api-key", label_studio.token,
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


# ----------------------------------------------------------------------- what starts a job, and a type added

def loop_server(label_studio, model_dir: Path, tmp_path: Path, *options: str):
    """`nerkit serve --label-studio --models` connected to `label_studio`, each job 2 epochs of the
    tiny recipe (`options` add to or override it)."""
    return serving(model_dir, tmp_path, "--label-studio", "--models", tmp_path / "models", "--label-studio-url",
                   label_studio.url, "--label-studio-api-key", label_studio.token, "--train-config",
                   loop_config(tmp_path), *options)


def test_train_every_annotations_created_in_label_studio_start_a_job_without_the_button(label_studio, tiny_model_dir,
                                                                                        tmp_path):
    """--train-every 4: the ANNOTATION_CREATED events Label Studio sends as tasks are annotated through
    its API are counted, and the fourth starts a job; nobody presses "Start training" (Label Studio's
    own auto-training is off, as in a new project)."""
    from nerkit.data.corpus import read_corpus

    sentences = [s for s in read_corpus(TINY_TRAIN).sentences if s.spans()][:5]
    project = label_studio.create_project("every", NER_CONFIG)
    tasks = label_studio.import_tasks(project, [{"text": s.text} for s in sentences])
    assert not label_studio.call("GET", f"/api/projects/{project}")["min_annotations_to_start_training"]
    with loop_server(label_studio, tiny_model_dir, tmp_path, "--train-every", "4", "--train-set", "train.lr=0") as server:
        label_studio.connect(project, server.url)
        for task, sentence in zip(tasks[:3], sentences):
            label_studio.annotate(task["id"], label_studio_result(sentence.text, sentence.spans()))
        state = health(server)
        assert state["state"] == "idle" and state["jobs"] == 0 and not state["next_waiting"], state
        label_studio.annotate(tasks[3]["id"], label_studio_result(sentences[3].text, sentences[3].spans()))
        state = wait_for_job(server, 0)
        assert state["last"]["status"] == "finished" and state["last"]["served"], state["last"]  # lr 0: a tie, served
        assert state["jobs"] == 1 and state["last"]["tasks"]["annotated"] == 4
        assert f"training requested for project {project} (4 new annotations)" in server.output()


def test_a_type_added_to_a_live_projects_labelling_config_grows_the_model(label_studio, tmp_path):
    """A model of PER and LOC serves a project whose labelling config then gains ORG: the next job grows
    the model's head (nerkit train --from's growth, grow.targets none), and the new version, served,
    predicts ORG in Label Studio's retrieved predictions."""
    import json

    from helpers import TINY_DEV, tiny_raw_config

    from nerkit.config import build_config
    from nerkit.data.corpus import read_corpus, write_corpus
    from nerkit.data.matching import keep_types
    from nerkit.training.loop import train

    raw = tiny_raw_config()
    for split, source in (("train", TINY_TRAIN), ("dev", TINY_DEV)):
        raw["data"][split] = str(tmp_path / f"{split}-per-loc.bio")
        write_corpus(raw["data"][split], keep_types(read_corpus(source).sentences, {"PER", "LOC"}), "bio")
    train(build_config(raw, "<PER and LOC>"), out=tmp_path / "per-loc", progress_bar=False)
    # the sentences that hold an ORG: ten epochs on eight of them teach it (two held out, one for dev)
    sentences = [s for s in read_corpus(TINY_TRAIN).sentences if any(sp.type == "ORG" for sp in s.spans())][:12]
    project = label_studio.create_project("a type added", ner_config(["PER", "LOC"]))
    tasks = label_studio.import_tasks(project, [{"text": s.text} for s in sentences])
    with loop_server(label_studio, tmp_path / "per-loc", tmp_path, "--train-every", "0", "--train-set",
                     "train.epochs=10", "--train-set", "train.lr=0.05") as server:
        model = label_studio.connect(project, server.url)
        label_studio.update_project(project, label_config=NER_CONFIG)  # Settings > Labeling Interface: ORG added
        for task, sentence in zip(tasks, sentences):
            label_studio.annotate(task["id"], label_studio_result(sentence.text, sentence.spans()))
        label_studio.train(model["id"])
        state = wait_for_job(server, 0)
        assert state["last"]["status"] == "finished" and state["last"]["served"], state
        version = state["served"]
        grown = json.loads((tmp_path / "models" / version / "nerkit.json").read_text(encoding="utf-8"))["grown_from"]
        assert grown["types"] == ["LOC", "PER"] and grown["new_types"] == ["ORG"] and grown["targets"] == "none"
        label_studio.retrieve_predictions(project)
        found = [r["value"]["labels"] for p in label_studio.predictions(project) if p["model_version"] == version
                 for r in p["result"]]
        assert ["ORG"] in found, found


# ----------------------------------------------------------------------- nerkit bench label-studio

def test_the_bench_times_the_loop_through_label_studio(label_studio, tiny_model_dir, tmp_path, nerkit):
    """`nerkit bench label-studio` end to end on the tiny model and corpus, against the module's Label
    Studio (--label-studio-url: the bench starts its own otherwise, by the same code as the fixture):
    each moment of the loop in order, /predict timed idle and while the job ran, the record's
    command, commit and machine, the project it made removed."""
    import json

    out = tmp_path / "bench"
    projects = {p["id"] for p in label_studio.call("GET", "/api/projects")["results"]}
    result = nerkit("bench", "label-studio", "--model", str(tiny_model_dir), "--data", str(TINY_TRAIN), "--tasks", "8",
                    "--batch", "5", "--train-config", str(loop_config(tmp_path)), "--train-set", "train.lr=0",
                    "--out", str(out), "--job-timeout", "240", "--label-studio-url", label_studio.url,
                    "--label-studio-api-key", label_studio.token)
    (record,) = [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    (figures,) = record["rounds"]
    assert 0 < figures["annotate_s"] <= figures["to_start_s"] < figures["to_start_s"] + figures["job_s"] < figures["loop_s"]
    assert figures["loop_s"] == pytest.approx(figures["to_start_s"] + figures["job_s"] + figures["to_prediction_s"])
    assert figures["idle_p50_ms"] > 0 and figures["training_requests"] >= 1 and figures["training_p50_ms"] > 0
    assert record["kind"] == "label-studio" and record["command"].startswith("nerkit bench label-studio")
    assert record["git_commit"] and record["cpu_count"] and record["label_studio"] == label_studio.version()
    assert record["trigger"] == "auto" and record["batch"] == 5 and label_studio.token not in json.dumps(record)
    assert "## nerkit label-studio" in result.stdout and (out / "RESULTS.md").read_text(encoding="utf-8") == result.stdout
    assert {p["id"] for p in label_studio.call("GET", "/api/projects")["results"]} == projects
