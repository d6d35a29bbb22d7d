"""`nerkit bench label-studio`: Label Studio's training loop (docs/label-studio-loop.md) timed end to
end. A real Label Studio on 127.0.0.1 (nerkit.tools.loop.studio starts it, or one given by its URL
and key) and a real `nerkit serve --label-studio --models` connected to it; a project of the
corpus's first --tasks sentences; a batch of --batch annotations submitted through Label Studio's
API, the corpus's gold standing in for the annotator; the training started as Label Studio starts
it (its auto-training on the batch's last annotation, or the "Start training" button after it).

Each round times, from the moment the batch's first annotation is sent: the job starting, the job
finishing (the new version swapped in), and the first prediction read back through Label Studio's
API that carries the new version (`loop_s`); and the served model's /predict latency while the job
runs against idle. A round is a fresh project, server and model store; the record goes to
OUT/results.jsonl and OUT/RESULTS.md (speed.py writes them), each round's server log to OUT/logs."""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from nerkit.errors import UserError
from nerkit.tools.bench.serve_load import free_port, percentile, start_server, stop_server
from nerkit.tools.bench.speed import check_subject, prepare_out, save, summarise

JOB_START_S = 120  # seconds from the batch's last annotation to its job's start, at most
PREDICTION_S = 120  # seconds from the job's end to a prediction by its version through Label Studio, at most
POLL_S = 0.1  # how often /health is read while waiting
WARM_UP = 5  # /predict requests answered before the idle ones are timed
IDLE_PROBES = 20  # /predict requests timed with no job running
PROBE_INTERVAL_S = 0.25  # between two timed /predict requests (an annotator's pre-annotations, not a load test)
TRIGGERS = ("auto", "button")  # Label Studio's auto-training on the batch's last annotation, or its button


@dataclass
class StudioBench:
    """What a round does: the project's tasks, the batch annotated, how training starts, and the
    `nerkit serve` loop options passed on."""
    tasks: int = 100
    batch: int = 20
    trigger: str = "auto"
    train_config: Path | None = None
    train_set: tuple[str, ...] = ()
    holdout: float = 0.2
    job_timeout: float = 1800.0  # seconds a job may take
    label_studio_url: str | None = None  # a running Label Studio to use instead of starting one
    api_key: str | None = None  # its API token


def project_sentences(data: Path, tasks: int, batch: int) -> list:
    """The corpus's first `tasks` complete sentences (a partial one's gold is not a whole annotation)."""
    from nerkit.data.corpus import read_corpus

    if not data.is_file():
        raise UserError("corpus not found", where=str(data))
    if tasks <= batch:
        raise UserError(f"--tasks ({tasks}) must be more than --batch ({batch})",
                        fix="the new version's prediction is read on a task the batch left unannotated")
    sentences = [s for s in read_corpus(data).sentences if s.text and not s.partial][:tasks]
    if len(sentences) < tasks:
        raise UserError(f"the corpus has {len(sentences)} complete sentences, fewer than --tasks {tasks}",
                        where=str(data), fix="pass a smaller --tasks or a larger corpus")
    return sentences


def post_json(url: str, body: dict, timeout: float = 60) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body, ensure_ascii=False).encode("utf-8"),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read())


def training(server: str) -> dict:
    """The server's /health `training` object."""
    with urllib.request.urlopen(f"{server}/health", timeout=30) as answer:
        return json.loads(answer.read())["training"]


class Probe:
    """Times the served model's /predict, as Label Studio asks it (one task, the project's config)."""

    def __init__(self, server: str, label_config: str, texts: list[str]):
        self.server, self.label_config, self.texts, self.sent = server, label_config, texts, 0

    def once(self) -> float:
        """One request's latency in ms."""
        text = self.texts[self.sent % len(self.texts)]
        self.sent += 1
        started = time.perf_counter()
        answer = post_json(f"{self.server}/predict", {"tasks": [{"id": self.sent, "data": {"text": text}}],
                                                      "label_config": self.label_config})
        if not answer.get("results"):
            raise UserError(f"the server's /predict answered no result: {str(answer)[:200]}")
        return 1000 * (time.perf_counter() - started)

    def paced(self, count: int) -> list[float]:
        found = []
        for _ in range(count):
            found.append(self.once())
            time.sleep(PROBE_INTERVAL_S)
        return found


class WhileTraining(threading.Thread):
    """Times /predict every PROBE_INTERVAL_S until stopped; the latencies of the requests made while
    the server said a job was running are `during`."""

    def __init__(self, probe: Probe):
        super().__init__(name="nerkit-bench-probe", daemon=True)
        self.probe, self.during, self.running, self.error = probe, [], False, None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            while not self.done.is_set():
                running_before = self.running
                latency = self.probe.once()
                if running_before and self.running:  # the job ran for the whole request
                    self.during.append(latency)
                self.done.wait(PROBE_INTERVAL_S)
        except Exception as e:  # noqa: BLE001 - the round reports it once the job has ended
            self.error = e


def wait_for(condition, seconds: float, what: str, server: str):
    """Poll the server's training state until `condition(state)` holds: that state, and when it held."""
    deadline, state = time.monotonic() + seconds, None
    while time.monotonic() < deadline:
        state = training(server)
        if condition(state):
            return state, time.perf_counter()
        time.sleep(POLL_S)
    raise UserError(f"{what} within {seconds:g} s (the server's training state: {json.dumps(state)[:300]})")


def one_round(studio, model: Path, sentences: list, types: list[str], options: StudioBench, log_path: Path,
              scratch: Path) -> tuple[dict, list[str]]:
    """A fresh project, server and model store, the batch annotated and the loop timed: the round's
    figures and the server's command."""
    from nerkit.data.annotation import label_studio_result
    from nerkit.tools.loop.studio import ner_config

    label_config = ner_config(types)
    port = free_port()
    server = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "nerkit", "serve", "--model", str(model), "--host", "127.0.0.1", "--port",
               str(port), "--label-studio", "--models", str(scratch / "models"), "--label-studio-url", studio.url,
               "--train-every", "0", "--holdout", str(options.holdout), "--keep", "2",
               *(["--train-config", str(options.train_config)] if options.train_config else []),
               *(part for item in options.train_set for part in ("--train-set", item))]
    project = studio.create_project(f"nerkit bench {scratch.name}", label_config)  # its title: 50 characters at most
    with ExitStack() as stack:
        stack.callback(studio.delete_project, project)
        log = stack.enter_context(open(log_path, "w+b"))
        started = time.perf_counter()
        process = start_server(command, port, log, {"LABEL_STUDIO_API_KEY": studio.token})  # the key: never in a record
        stack.callback(stop_server, process)
        startup = time.perf_counter() - started
        tasks = studio.import_tasks(project, [{"text": s.text} for s in sentences])
        if [t["data"]["text"] for t in tasks] != [s.text for s in sentences]:
            raise UserError("Label Studio's tasks are not the corpus's sentences in order", where=studio.url)
        connected = studio.connect(project, server)
        if options.trigger == "auto":  # "Start model training on annotation submission", every --batch annotations
            studio.update_project(project, min_annotations_to_start_training=options.batch)
        probe = Probe(server, label_config, [s.text for s in sentences])
        for _ in range(WARM_UP):
            probe.once()
        idle = probe.paced(IDLE_PROBES)
        before = training(server)
        watcher = WhileTraining(probe)

        first_sent = time.perf_counter()
        for task, sentence in zip(tasks, sentences[:options.batch]):
            studio.annotate(task["id"], label_studio_result(sentence.text, sentence.spans()))
        annotated = time.perf_counter()
        if options.trigger == "button":
            studio.train(connected["id"])
        watcher.start()
        stack.callback(watcher.done.set)
        state, job_started = wait_for(lambda s: s["state"] == "training" or s["jobs"] > before["jobs"], JOB_START_S,
                                      "no training job started", server)
        watcher.running = True
        state, job_finished = wait_for(lambda s: s["jobs"] > before["jobs"] and s["state"] == "idle",
                                       options.job_timeout, "the training job did not finish", server)
        watcher.running = False
        watcher.done.set()
        last = state["last"]
        if last["status"] != "finished":
            raise UserError(f"the training job failed: {last['error']}", where=str(log_path))
        if not last["served"]:
            raise UserError(f"the new version {last['version']} was not served (held-out F1 {100 * last['f1']:.2f} "
                            f"against the served model's {100 * last['served_f1']:.2f}), so no prediction carries it",
                            fix="annotate a larger --batch, or check the training config (--train-config, --train-set)")
        unannotated = tasks[options.batch]["id"]
        deadline = time.monotonic() + PREDICTION_S
        while True:
            studio.retrieve_predictions(project, [unannotated])
            if any(p.get("model_version") == last["version"] for p in studio.predictions(task=unannotated)):
                predicted = time.perf_counter()
                break
            if time.monotonic() > deadline:
                raise UserError(f"Label Studio gave no prediction by {last['version']} within {PREDICTION_S} s "
                                "of the job's end", where=studio.url)
            time.sleep(POLL_S)
        watcher.join(60)
        if watcher.error is not None:
            raise UserError(f"a /predict request failed while the job ran: {watcher.error}")
    during = watcher.during
    figures = {"loop_s": predicted - first_sent, "annotate_s": annotated - first_sent,
               "to_start_s": job_started - first_sent, "job_s": job_finished - job_started,
               "job_reported_s": last["seconds"], "to_prediction_s": predicted - job_finished,
               "idle_p50_ms": percentile(idle, 50), "idle_p95_ms": percentile(idle, 95),
               "training_p50_ms": percentile(during, 50) if during else None,
               "training_p95_ms": percentile(during, 95) if during else None, "training_requests": len(during),
               "heldout_f1": 100 * last["f1"], "served_f1": 100 * last["served_f1"],
               "train_tasks": last["tasks"]["train"], "heldout_tasks": last["tasks"]["heldout"],
               "server_startup_s": startup}
    return figures, command


def bench_label_studio(model: Path, data: Path, out: Path, options: StudioBench, rounds: int = 1,
                       name: str | None = None) -> tuple[str, dict]:
    """Time `rounds` rounds of the loop (one_round); the record and the table."""
    from nerkit.tools.audit.run import types_of
    from nerkit.tools.loop.studio import LabelStudio, started

    check_subject(model, rounds)
    if options.trigger not in TRIGGERS:
        raise UserError(f"--trigger takes {', '.join(TRIGGERS)}, not {options.trigger!r}")
    if options.train_config is not None and not options.train_config.is_file():
        raise UserError("training config not found", where=str(options.train_config))
    sentences = project_sentences(data, options.tasks, options.batch)
    types = sorted(set(types_of(model)) | {sp.type for s in sentences for sp in s.spans()})
    prepare_out(out, model, data)
    (out / "logs").mkdir(exist_ok=True)
    name = name or f"label-studio_{model.name}_b{options.batch}_{options.trigger}"
    figures, startup = [], None
    with tempfile.TemporaryDirectory(prefix="nerkit-bench-label-studio-") as scratch, ExitStack() as stack:
        if options.label_studio_url:
            if not options.api_key:
                raise UserError("--label-studio-url needs its API key",
                                fix="pass --label-studio-api-key or set LABEL_STUDIO_API_KEY")
            studio = LabelStudio(options.label_studio_url, options.api_key)
        else:
            begun = time.perf_counter()
            studio, _, _ = stack.enter_context(started(Path(scratch) / "label-studio"))
            startup = time.perf_counter() - begun
        version = studio.version()
        for number in range(1, rounds + 1):
            directory = Path(scratch) / f"round-{number}"
            directory.mkdir()
            found, command = one_round(studio, model, sentences, types, options,
                                       out / "logs" / f"{name}-round{number}.serve.log", directory)
            figures.append({"round": number, **found})
    settings = {"model": str(model), "data": str(data), "tasks": options.tasks, "batch": options.batch,
                "trigger": options.trigger, "train_config": str(options.train_config) if options.train_config else None,
                "train_set": list(options.train_set), "holdout": options.holdout, "types": types,
                "label_studio": version, "label_studio_startup_s": startup}
    record = summarise("label-studio", name, command, figures, settings)
    if options.api_key:  # a key given as --label-studio-api-key is in the command line: never in a record
        record["command"] = record["command"].replace(options.api_key, "$LABEL_STUDIO_API_KEY")
    return save(out, record), record
