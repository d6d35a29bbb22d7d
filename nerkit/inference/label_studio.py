"""Label Studio's ML backend protocol, served by `nerkit serve --label-studio`: a Label Studio project
connects to the server as its model (Settings > Model, or `POST /api/ml`), and every task it asks
about comes back pre-annotated, each region and each prediction with its score, so that the project
sorts and filters its tasks by the model's confidence with no code written by the user.

What Label Studio calls (its `ml/api_connector.py`): `GET /health` (the server's own), `POST /setup`
with the project's labelling config (answered with the model's version), `POST /predict` with
`{"tasks": [...], "label_config": ...}` (answered `{"results": [...]}`, one prediction per task, in
order, each naming the `model_version` that made it), and `POST /webhook` with the project's events.
With a trainer (`nerkit serve --models DIR`: nerkit.tools.loop, docs/label-studio-loop.md) the
training events (the `START_TRAINING` event of the "Start training" button and of Label Studio's
auto-training, annotations created or updated, the older `POST /train`) go to it; without one a
training request is answered 501 with what to do instead, and every other event is acknowledged and
ignored.

The labelling config says where a task keeps its text and what the regions are called: the first
`<Labels name=... toName=...>` and the `<Text name=... value="$key">` it labels. Entity types the
config does not list are left out of the predictions (Label Studio could not show them), with a
warning naming them once.
"""

from __future__ import annotations

import asyncio
import logging
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from nerkit.data.annotation import model_prediction
from nerkit.data.tags import Span

log = logging.getLogger(__name__)

NO_TRAINING = ("nerkit does not train from Label Studio: export the project's annotations (JSON), then "
               "`nerkit train` on them (`nerkit data convert EXPORT.json train.jsonl --from label-studio`), "
               "and restart `nerkit serve --label-studio` with the new model")


@dataclass(frozen=True)
class LabelConfig:
    """What a labelling config says about named entities: the `<Labels>` tag's name and the name of
    the `<Text>` tag it labels, the task data key that text is read from, and the labels offered."""

    from_name: str
    to_name: str
    data_key: str
    labels: tuple[str, ...]


def read_label_config(xml: str) -> LabelConfig:
    """The `LabelConfig` of a Label Studio labelling config; a ValueError says what is missing."""
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError as e:
        raise ValueError(f"the labelling config is not XML ({e})") from None
    tags = list(root.iter())
    labels = next((t for t in tags if t.tag == "Labels"), None)
    if labels is None or not labels.get("name") or not labels.get("toName"):
        raise ValueError("the labelling config has no <Labels name=... toName=...>: nerkit predicts "
                         "named entities, which Label Studio labels with <Labels> over a <Text>")
    text = next((t for t in tags if t.tag == "Text" and t.get("name") == labels.get("toName")), None)
    value = (text.get("value") or "") if text is not None else ""
    if not value.startswith("$") or len(value) < 2:
        raise ValueError(f"the labelling config has no <Text name=\"{labels.get('toName')}\" value=\"$KEY\"> "
                         "for its <Labels> to label")
    offered = tuple(t.get("value") for t in labels if t.tag == "Label" and t.get("value"))
    return LabelConfig(labels.get("name"), labels.get("toName"), value[1:], offered)


def task_prediction(record: dict, config: LabelConfig, model_version: str, dropped: set[str]) -> dict:
    """One task's prediction from its `nerkit predict` record: the regions as `config` names them
    (types it does not offer are added to `dropped` and left out), each with its score, and the
    prediction's own score (`prediction_score`: its least sure region's)."""
    spans = []
    for e in record["entities"]:
        if config.labels and e["type"] not in config.labels:
            dropped.add(e["type"])
            continue
        spans.append(Span(e["start"], e["end"], e["type"], e.get("score")))
    return model_prediction(record["text"], spans, model_version, config.from_name, config.to_name)


async def _json_object(request: Request) -> dict:
    try:
        payload = await request.json()
    except ValueError:
        raise HTTPException(422, "the body is not JSON") from None
    if not isinstance(payload, dict):
        raise HTTPException(422, "the body is not a JSON object")
    return payload


def add_routes(app: FastAPI, predict_texts, current, trainer=None) -> None:
    """Label Studio's routes on `app`; `predict_texts(texts)` is awaited for their `nerkit predict`
    records (the server's micro-batching queue), each with the `model_version` that made it;
    `current()` is the served (version, types); `trainer` takes the training calls (None: 501)."""
    configs: dict[str, LabelConfig] = {}  # per Label Studio project, from /setup
    warned: set[str] = set()

    def config_of(payload: dict) -> LabelConfig:
        xml = payload.get("label_config") or payload.get("schema")
        if isinstance(xml, str) and xml.strip():
            try:
                return read_label_config(xml)
            except ValueError as e:
                raise HTTPException(422, str(e)) from None
        known = configs.get(str(payload.get("project")))
        if known is None:
            raise HTTPException(422, "no labelling config: send it as label_config (Label Studio does)")
        return known

    @app.post("/setup", summary="Label Studio: connect a project",
              description="Reads the project's labelling config; answers the model's version.")
    async def setup(request: Request):
        payload = await _json_object(request)
        config = config_of(payload)
        configs[str(payload.get("project"))] = config
        model_version, types = current()
        missing = sorted(set(types) - set(config.labels)) if config.labels else []
        if missing:
            log.warning(f"Label Studio project {payload.get('project')}: its labels do not offer {', '.join(missing)}; "
                        "those entities are left out of its predictions")
        return {"model_version": model_version}

    @app.post("/predict", summary="Label Studio: pre-annotate tasks",
              description="`{\"tasks\": [...], \"label_config\": ...}` answers `{\"results\": [...]}`: one "
                          "prediction per task, in order, each region and the prediction scored.")
    async def predict(request: Request):
        payload = await _json_object(request)
        tasks = payload.get("tasks")
        if not isinstance(tasks, list) or not all(isinstance(t, dict) for t in tasks):
            raise HTTPException(422, "tasks must be a list of Label Studio tasks")
        config = config_of(payload)
        texts = []
        for task in tasks:
            text = (task.get("data") or {}).get(config.data_key)
            if not isinstance(text, str):
                raise HTTPException(422, f"task {task.get('id')} has no text at data.{config.data_key}, where "
                                         f"the labelling config's <Text value=\"${config.data_key}\"> reads it")
            texts.append(text)
        records = await predict_texts(texts) if texts else []
        model_version = records[0]["model_version"] if records else current()[0]
        dropped: set[str] = set()
        results = [task_prediction(r, config, r.get("model_version", model_version), dropped) for r in records]
        if dropped - warned:
            log.warning(f"left out of Label Studio's predictions: {', '.join(sorted(dropped - warned))} "
                        "(the project's labels do not offer them)")
            warned.update(dropped)
        return {"results": results, "model_version": model_version}

    @app.post("/webhook", summary="Label Studio: project events",
              description="With --models: START_TRAINING queues a training job, an annotation created or "
                          "updated counts towards --train-every. Without: a training request is answered 501 "
                          "(nerkit does not train from Label Studio), other events are acknowledged and ignored.")
    async def webhook(request: Request):
        payload = await _json_object(request)
        if trainer is not None:
            status, body = await asyncio.to_thread(trainer.event, payload)
            return JSONResponse(body, status_code=status)
        if payload.get("action") == "START_TRAINING":
            return JSONResponse({"status": "error", "error": NO_TRAINING}, status_code=501)
        return {"status": "ignored", "action": payload.get("action")}

    @app.post("/train", summary="Label Studio: train (older versions)",
              description="With --models, queues a training job; without, answered 501.")
    async def train(request: Request):
        if trainer is None:
            return JSONResponse({"status": "error", "error": NO_TRAINING}, status_code=501)
        status, body = await asyncio.to_thread(trainer.train_call, await _json_object(request))
        return JSONResponse(body, status_code=status)

    @app.post("/job_status", summary="Label Studio: a training job's status",
              description="The training loop's state: the served version, the job running, the last job's outcome.")
    async def job_status(request: Request):
        if trainer is None:
            return JSONResponse({"status": "error", "error": NO_TRAINING}, status_code=501)
        return {"job": (await _json_object(request)).get("job"), **trainer.status()}

    @app.get("/versions", summary="Label Studio: the model's versions")
    async def versions():
        return {"versions": trainer.versions() if trainer is not None else [current()[0]]}


def batched(batcher):
    """`add_routes`' `predict_texts` on a server's `Batcher`: its records, awaited (503 when its
    queue is full, as nerkit's own /predict answers)."""
    from nerkit.inference.batcher import QueueFull

    async def predict_texts(texts: list[str]) -> list[dict]:
        try:
            future = batcher.submit(texts)
        except QueueFull as e:
            raise HTTPException(503, f"busy: {e}") from None
        return await asyncio.wrap_future(future)
    return predict_texts
