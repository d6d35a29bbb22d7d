"""One training job of Label Studio's loop, run as a process of its own (`python -m
nerkit.tools.loop.job SPEC.json`, started by nerkit.tools.loop.backend), so that the server's
process keeps predicting with the served model meanwhile, and a job that dies takes nothing with it.

The job reads the project's annotations through Label Studio's API (its JSON export), holds out a
seeded share of the completely annotated tasks (`held_out`: the same tasks every job, so that no
version ever trains on them), trains from the served model on the rest (partial annotations,
`data.unknown`, as partial labels; a type the model lacks grows its head: nerkit.training.grow
with `grow.targets: none`, since every type of the labelling config is annotated), and scores the
new model and the served one on the held-out tasks through the one evaluation path. The trained
model becomes the version directory the spec names only once it is scored; the last thing the
job writes is result.json (or error.json with its one-line reason)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import traceback
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import replace
from pathlib import Path

from nerkit.errors import UserError
from nerkit.files import atomic_write_text

log = logging.getLogger(__name__)

RESULT, ERROR = "result.json", "error.json"
API_KEY = "LABEL_STUDIO_API_KEY"  # the key reaches the job in its environment, never in a file
MIN_COMPLETE = 3  # complete tasks a job needs: one held out, one for dev, one to train on
EXPORT_TIMEOUT = 120  # seconds


def held_out(task_ids: list, share: float, seed: int) -> set:
    """The tasks kept out of training to score every version on: each task whose seeded hash falls
    below `share`, decided by its id alone, so a task held out once stays held out as the project
    grows; at least one (the lowest hash) and never all of them."""
    def rank(task_id) -> float:
        digest = hashlib.sha256(f"{seed}:{task_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2 ** 64

    ranked = sorted(task_ids, key=rank)
    chosen = {t for t in ranked if rank(t) < share}
    if not chosen and ranked:
        chosen = {ranked[0]}
    if len(chosen) >= len(ranked):
        chosen = set(ranked[:max(1, len(ranked) - 2)])
    return chosen


def export_tasks(url: str, api_key: str, project) -> list[dict]:
    """The project's annotated tasks, as Label Studio's JSON export gives them (`GET
    /api/projects/ID/export`, what label-studio-ml-backend reads too)."""
    query = urllib.parse.urlencode({"exportType": "JSON", "download_all_tasks": "false"})
    request = urllib.request.Request(f"{url.rstrip('/')}/api/projects/{project}/export?{query}",
                                     headers={"Authorization": f"Token {api_key}"})
    try:
        with urllib.request.urlopen(request, timeout=EXPORT_TIMEOUT) as answer:
            tasks = json.loads(answer.read().decode("utf-8"))
    except urllib.error.HTTPError as e:
        fix = ("check --label-studio-api-key (Label Studio: Account & Settings > Legacy Token)"
               if e.code in (401, 403) else "check --label-studio-url and that the project exists")
        raise UserError(f"Label Studio answered {e.code} to the export of project {project}", where=url, fix=fix) from None
    except (urllib.error.URLError, OSError) as e:
        raise UserError(f"cannot reach Label Studio ({getattr(e, 'reason', e)})", where=url,
                        fix="check --label-studio-url (the address this machine reaches Label Studio at)") from None
    if not isinstance(tasks, list):
        raise UserError("Label Studio's export is not a list of tasks", where=url)
    return tasks


def project_sentences(tasks: list[dict], data_key: str, directory: Path) -> list[tuple[object, object]]:
    """(task id, Sentence) for each annotated task, read by nerkit's Label Studio reader from the
    tasks as the project's export gives them (their text moved from `data_key` to where the reader
    looks). A task with unknown regions (data.unknown) is a partial sentence."""
    from nerkit.data.annotation import LABEL_STUDIO_DATA_KEY, read_label_studio
    from nerkit.data.records import UNKNOWN_KEY

    kept = []
    for task in tasks:
        data = task.get("data") or {}
        if not isinstance(data.get(data_key), str):
            continue
        moved = {LABEL_STUDIO_DATA_KEY: data[data_key], **({UNKNOWN_KEY: data[UNKNOWN_KEY]} if UNKNOWN_KEY in data else {})}
        kept.append({"id": task.get("id"), "data": moved, "annotations": task.get("annotations") or []})
    if not any(t["annotations"] for t in kept):
        return []
    path = directory / "annotations.json"
    atomic_write_text(path, json.dumps(kept, ensure_ascii=False))
    corpus = read_label_studio(path)
    return [(kept[s.line - 1]["id"], s) for s in corpus.sentences]


def job_config(spec: dict, train: Path, test: Path, out: Path):
    """The run's config: the user's --train-config (else the served model's own recipe, its
    config.yaml) with this job's corpora, grown from the served model with no targets of its own."""
    from nerkit.config import load_config
    from nerkit.data.tags import detect_scheme
    from nerkit.inference.predictor import read_model_dir

    base = spec.get("train_config") or str(Path(spec["current"]) / "config.yaml")
    config = load_config(base, spec.get("overrides") or [])
    # Label Studio's regions are spans: they are tagged in the served model's scheme
    scheme = detect_scheme(read_model_dir(spec["current"]).vocab["tags"])
    data = replace(config.data, train=str(train), dev=None, test=str(test), train_extra=None, scheme=scheme)
    grow = replace(config.grow, source=str(spec["current"]), targets="none")
    return replace(config, data=data, grow=grow, output_dir=str(out))


def run_job(spec: dict) -> dict:
    """The job `spec` describes (backend.Trainer writes it); returns what result.json holds."""
    from nerkit.data.corpus import format_jsonl
    from nerkit.inference.label_studio import read_label_config
    from nerkit.inference.pipeline import Pipeline
    from nerkit.training.loop import train

    directory = Path(spec["directory"])
    try:
        labelling = read_label_config(spec["label_config"])
    except ValueError as e:
        raise UserError(f"the project's labelling config: {e}") from None
    tasks = export_tasks(spec["label_studio_url"], os.environ.get(API_KEY, ""), spec["project"])
    found = project_sentences(tasks, labelling.data_key, directory)
    complete = [(task, s) for task, s in found if not s.partial]
    if len(complete) < MIN_COMPLETE:
        raise UserError(f"project {spec['project']} has {len(complete)} completely annotated task"
                        f"{'' if len(complete) == 1 else 's'}; a training job needs at least {MIN_COMPLETE} "
                        "(one held out to score versions on, one to choose the epoch, one to train on)",
                        fix="annotate more tasks, then start training again")
    heldout = held_out([task for task, _ in complete], spec["holdout"], spec["seed"])
    training = [s for task, s in found if task not in heldout]
    scored = [s for task, s in complete if task in heldout]
    train_path, test_path = directory / "train.jsonl", directory / "heldout.jsonl"
    atomic_write_text(train_path, format_jsonl(training))
    atomic_write_text(test_path, format_jsonl(scored))
    log.info(f"project {spec['project']}: {len(found)} annotated tasks ({len(found) - len(complete)} partial), "
             f"{len(scored)} held out to score on, {len(training)} to train on")
    run = directory / "run"
    train(job_config(spec, train_path, test_path, run), out=run, force=True)
    shutil.rmtree(run / "checkpoint", ignore_errors=True)  # the run is finished: its model is what stays
    new_f1 = Pipeline.load(run).evaluate(test_path)["f1"]
    served_f1 = Pipeline.load(spec["current"]).evaluate(test_path)["f1"]
    result = {"version": spec["version"], "job": spec["job"], "project": spec["project"],
              "served_version": spec["current_version"], "heldout_tasks": sorted(heldout, key=str),
              "tasks": {"annotated": len(found), "partial": len(found) - len(complete), "heldout": len(scored),
                        "train": len(training)},
              "f1": new_f1, "served_f1": served_f1}
    atomic_write_text(run / "loop.json", json.dumps(result, ensure_ascii=False, indent=2) + "\n")
    version = Path(spec["versions"]) / spec["version"]
    os.replace(run, version)
    return {**result, "path": str(version)}


def main(argv: list[str]) -> int:
    """The job's process: its exit code 0 with result.json, 2 with error.json for a user's error
    (its one line), 1 with error.json and the traceback in the log for anything else."""
    from nerkit.log import configure_logging

    configure_logging()
    spec_path = Path(argv[0])
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    directory = Path(spec["directory"])
    try:
        os.nice(spec.get("nice", 10))  # the server's predictions come first
    except OSError:
        pass
    try:
        result = run_job(spec)
    except UserError as e:
        atomic_write_text(directory / ERROR, json.dumps({"error": str(e)}, ensure_ascii=False) + "\n")
        log.error(f"nerkit: error: {e}")
        return 2
    except Exception as e:  # noqa: BLE001 - a job's failure is reported, never lost
        traceback.print_exc()
        atomic_write_text(directory / ERROR, json.dumps({"error": f"{type(e).__name__}: {e}"}, ensure_ascii=False) + "\n")
        return 1
    atomic_write_text(directory / RESULT, json.dumps(result, ensure_ascii=False, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
