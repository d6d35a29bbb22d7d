"""`nerkit calibrate`: fit the temperature that makes a model's entity scores honest on a dev set,
and keep it in the model directory (nerkit.json's `score_temperature`), where prediction, the
server and an export made afterwards read it.

Temperature scaling (Guo et al. 2017) applied to the CRF: every score, emissions and transitions
alike, is divided by one number T before the entity probabilities are computed. The decoded path
does not move (the best path is the best at any T), so tags and F1 stay exactly as they were; only
the scores change. T is the one that minimises the log loss of "this entity is right" (span and
type exactly as in the gold file) over the dev set's predicted entities, found on a grid of log T
and refined around its best point. The emissions are computed once and kept for every T tried.

A span-head model has no temperature to fit: its threshold is chosen instead, and Platt's map of its
span scores fitted (nerkit.tools.span_threshold).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from nerkit.data.splits import check_data_files, read_gold, train_and_dev
from nerkit.data.tags import tags_to_spans
from nerkit.errors import UserError
from nerkit.inference.pipeline import Pipeline
from nerkit.inference.model_dir import CONFIG_FILE, META_FILE, SCORE_TEMPERATURE, _read_json, runtime, update_meta

log = logging.getLogger(__name__)

GRID = [math.exp(math.log(0.1) + k * (math.log(10.0) - math.log(0.1)) / 40) for k in range(41)]  # 0.1 .. 10


@dataclass
class Scored:
    """One batch of windows, decoded: what every temperature tried needs."""

    emissions: torch.Tensor  # (B, T, K) float64, on the model's device
    mask: torch.Tensor  # (B, T)
    paths: list[list[int]]
    right: list[bool]  # per entity of the paths, in order: span and type as in the gold file


def dev_set(pipe: Pipeline, model_dir: Path, data: str | Path | None) -> tuple[list, str]:
    """The gold sentences to calibrate on, and their name for messages: the file DATA, or without one
    the dev split the model was selected on, as its config.yaml gives it (`data.dev`, or the seeded
    share of `data.train` carved off: `nerkit.data.splits.train_and_dev`, the one place it is made)."""
    if data is None:  # the files the split comes from, as the model's config names them
        check_data_files(pipe.config, ("train", "dev"), fix=f"set NERKIT_DATA as it was for training "
                         f"({model_dir / CONFIG_FILE} names the file), or pass --data DEV")
        return train_and_dev(pipe.config)[2], f"the dev split of {model_dir / CONFIG_FILE}"
    corpus = read_gold(data, pipe.config.data.repair, "pass --repair")
    pipe.check_types(corpus.types, str(data))
    return corpus.sentences, str(data)


def decoded_batches(pipe: Pipeline, sentences: list, batch_size: int, window: int | None) -> list[Scored]:
    """The gold sentences read in the model's windows, decoded once, each entity marked right or
    wrong against the gold spans of its sentence."""
    gold = [{(g.start, g.end, g.type) for g in s.spans()} for s in sentences]
    found = []
    for rows, emissions, mask, paths in pipe.decoded_windows([s.tokens for s in sentences], batch_size, window):
        right = [(start + s.start, start + s.end, s.type) in gold[i]
                 for (i, start), path in zip(rows, paths) for s in tags_to_spans([pipe.tags[t] for t in path])]
        found.append(Scored(emissions.double(), mask, paths, right))
    return found


def log_loss(pipe: Pipeline, batches: list[Scored], temperature: float) -> float:
    """Mean log loss of the entities' scores at `temperature` against whether they are right."""
    crf = pipe.model.crf
    total, count = 0.0, 0
    for b in batches:
        probs = [p for row in crf.entity_probabilities(b.emissions, b.mask, b.paths, temperature) for p in row]
        for p, right in zip(probs, b.right):
            p = min(max(p, 1e-12), 1 - 1e-12)
            total -= math.log(p if right else 1 - p)
            count += 1
    return total / count if count else 0.0


def fit_temperature(pipe: Pipeline, batches: list[Scored]) -> float:
    """The temperature of least log loss: the best of `GRID`, then of a finer grid between its neighbours."""
    losses = {t: log_loss(pipe, batches, t) for t in GRID}
    best = min(losses, key=losses.get)
    k = GRID.index(best)
    low, high = GRID[max(k - 1, 0)], GRID[min(k + 1, len(GRID) - 1)]
    finer = [math.exp(math.log(low) + i * (math.log(high) - math.log(low)) / 20) for i in range(21)]
    losses.update({t: log_loss(pipe, batches, t) for t in finer})
    return min(losses, key=losses.get)


def calibrate(model_dir: str | Path, data: str | Path | None = None, batch_size: int = 128,
              window: int | None = None) -> dict:
    """Fit the temperature of MODEL_DIR's scores on the gold file DATA (a dev set: never the test
    set, whose scores would then be fitted to it; None: the dev split the model was selected on),
    write it into MODEL_DIR/nerkit.json, and return it with the expected calibration error and log
    loss before and after. A span-head model gets its threshold chosen instead
    (`nerkit.tools.span_threshold.calibrate_threshold`)."""
    model_dir = Path(model_dir)
    meta_path = model_dir / META_FILE
    if meta_path.is_file() and runtime(_read_json(meta_path)) == "onnx":
        raise UserError("this is an ONNX export, which has no torch model to fit", where=str(model_dir),
                        fix="calibrate the model directory that `nerkit train` wrote, then export it again")
    pipe = Pipeline.load(model_dir)
    sentences, where = dev_set(pipe, model_dir, data)
    if pipe.config.model.head == "span":
        from nerkit.tools.span_threshold import calibrate_threshold

        return calibrate_threshold(pipe, model_dir, sentences, where, batch_size, window)
    batches = decoded_batches(pipe, sentences, batch_size, window)
    entities = sum(len(b.right) for b in batches)
    if entities == 0:
        raise UserError("the model predicts no entity in this file: nothing to calibrate on", where=where,
                        fix="calibrate on a larger dev set")
    temperature = fit_temperature(pipe, batches)
    result = {"temperature": round(temperature, 4), "entities": entities, "data": where}
    for name, t in (("before", 1.0), ("after", temperature)):
        pipe.score_temperature = t
        metrics = pipe.predict_and_score(sentences, batch_size, window=window, with_calibration=True).metrics
        result[name] = {"ece": metrics["calibration"]["ece"], "brier": metrics["calibration"]["brier"],
                        "log_loss": log_loss(pipe, batches, t)}
    meta_path = update_meta(model_dir, {SCORE_TEMPERATURE: result["temperature"]})
    log.info(f"score temperature {temperature:.3f} on {entities:,} entities of {where}: ECE "
             f"{result['before']['ece']:.4f} -> {result['after']['ece']:.4f}; wrote {meta_path}")
    return result


def calibration_table(records: list[dict]) -> str:
    """Records of models' calibration (their `dev`, `test`, `fit` and `test_after`, as the docs'
    records hold them) as a Markdown table: F1, ECE before and after the temperature, Brier score."""
    lines = ["| dataset | model | test F1 | dev ECE | test ECE | temperature (fit on dev) | test ECE after | "
             "test Brier before / after | entities (test) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        before, after = r["test"]["calibration"], r["test_after"]["calibration"]
        lines.append(f"| {r['dataset']} | {r['model']} | {100 * r['test']['f1']:.2f} | "
                     f"{r['dev']['calibration']['ece']:.4f} | {before['ece']:.4f} | {r['fit']['temperature']:.3f} | "
                     f"{after['ece']:.4f} | {before['brier']:.4f} / {after['brier']:.4f} | {before['entities']:,} |")
    return "\n".join(lines) + "\n"
