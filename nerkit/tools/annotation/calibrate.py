"""`nerkit calibrate`: fit the temperature that makes a model's entity scores honest on a dev set,
and keep it in the model directory (nerkit.json's `score_temperature`), where prediction, the
server and an export made afterwards read it.

Temperature scaling (Guo et al. 2017) applied to the CRF: every score, emissions and transitions
alike, is divided by one number T before the entity probabilities are computed. The decoded path
does not move (the best path is the best at any T), so tags and F1 stay exactly as they were; only
the scores change. T is the one that minimises the log loss of "this entity is right" (span and
type exactly as in the gold file) over the dev set's predicted entities, stitched from their
windows and scored as prediction scores them (each entity once), found by a coarse search of log T
refined by golden-section search: 16 forward-backward passes. The emissions, paths and entities are
computed once and kept for every T tried.

A span-head model has no temperature to fit: its threshold is chosen instead, and Platt's map of its
span scores fitted (nerkit.inference.span_threshold).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from nerkit.data.corpus import refuse_partial
from nerkit.data.splits import check_data_files, read_gold, train_and_dev
from nerkit.data.tags import Span
from nerkit.device import set_threads
from nerkit.errors import UserError
from nerkit.inference.evaluate import MIN_CALIBRATION_ENTITIES, calibration
from nerkit.inference.pipeline import Pipeline
from nerkit.inference.model_dir import CONFIG_FILE, SCORE_TEMPERATURE, ModelDir, update_meta
from nerkit.log import progress_display
from nerkit.model.crf import EntitySegments
from nerkit.model.decoded import path_entities

log = logging.getLogger(__name__)

# The search for T: log T over [LOW, HIGH], first at COARSE evenly spaced points, then by golden-section
# search between the neighbours of the best of them, REFINE steps (the bracket shrinks to 0.618^REFINE
# of 2 * ln(HIGH / LOW) / (COARSE - 1): 0.02 in log T, 2% in T). A best T at an end of the range is
# no fit (the log loss still falls beyond it: nothing the file says is calibrated by a temperature).
LOW, HIGH = 0.1, 10.0
COARSE, REFINE = 5, 10
EDGE = 0.02  # in log T: a best T this close to an end of the range is at the edge


@dataclass
class Decoded:
    """The gold texts read in the model's windows and decoded once, what every temperature tried
    needs: each window's emissions (float64), mask, paths and entities (`CRF.entity_segments`), and
    whether each entity of the stitched predictions is right (span and type as in the gold file)."""

    token_lists: list[list[str]]
    pieces: list[tuple[int, int, int]]  # (text, window start, window end), in text order
    batches: list[tuple[list[int], torch.Tensor, torch.Tensor, list[list[int]], EntitySegments]]  # piece indices first
    right: list[bool]


def dev_set(pipe: Pipeline, model_dir: Path, data: str | Path | None) -> tuple[list, str]:
    """The gold sentences to calibrate on, and their name for messages: the file DATA, or without one
    the dev split the model was selected on, as its config.yaml gives it (`data.dev`, or the seeded
    share of `data.train` carved off: `nerkit.data.splits.train_and_dev`, the one place it is made).
    A UserError when they hold no entity."""
    if data is None:  # the files the split comes from, as the model's config names them
        check_data_files(pipe.config, ("train", "dev"), fix=f"set NERKIT_DATA as it was for training "
                         f"({model_dir / CONFIG_FILE} names the file), or pass --data DEV")
        sentences, where = train_and_dev(pipe.config)[2], f"the dev split of {model_dir / CONFIG_FILE}"
    else:
        corpus = read_gold(data, pipe.config.data.repair, "pass --repair")
        refuse_partial(corpus, role="calibration set")  # where nobody annotated, a found entity is not wrong
        sentences, where = corpus.sentences, str(data)
    if not any(s.spans() for s in sentences):
        raise UserError("the gold file has no entities: every predicted one would count as wrong, and the fit "
                        "would only flatten the scores", where=where, fix="calibrate on a labelled dev set")
    if data is not None:
        pipe.check_types(corpus.types, where)
    return sentences, where


def decode(pipe: Pipeline, sentences: list, batch_size: int, window: int | None) -> Decoded:
    """The gold sentences read in the model's windows as prediction reads them, decoded once."""
    token_lists = [s.tokens for s in sentences]
    batches, pieces = [], []
    for found, batch in pipe.window_batches(token_lists, batch_size, window):
        emissions = pipe.model.emissions(batch).double()
        paths = pipe.model.head.crf.decode(emissions, batch.mask)
        indices = list(range(len(pieces), len(pieces) + len(found)))
        pieces.extend(found)
        batches.append((indices, emissions, batch.mask, paths, pipe.model.head.crf.entity_segments(batch.mask, paths)))
    order = sorted(range(len(pieces)), key=pieces.__getitem__)  # window_batches reads them by length
    position = {j: k for k, j in enumerate(order)}
    batches = [([position[j] for j in indices], *rest) for indices, *rest in batches]
    decoded = Decoded(token_lists, [pieces[j] for j in order], batches, [])
    gold = [set(s.spans()) for s in sentences]
    decoded.right = [span in gold[i] for i, spans in enumerate(stitched(pipe, decoded)) for span in spans]
    return decoded


def stitched(pipe: Pipeline, decoded: Decoded, temperature: float | None = None) -> list[list[Span]]:
    """Each text's entities as prediction gives them (windows stitched, each entity scored by the
    window that decided it), scored at `temperature`: the one forward-backward pass a temperature
    costs (None: unscored, no pass)."""
    windows: list = [None] * len(decoded.pieces)
    for indices, emissions, mask, paths, segments in decoded.batches:
        probs = ([None] * len(paths) if temperature is None else
                 pipe.model.head.crf.entity_probabilities(emissions, mask, paths, temperature, segments))
        for j, path, p in zip(indices, paths, probs):
            windows[j] = path_entities(path, pipe.tags, pipe.types, p)
    return pipe.stitched_tags(decoded.token_lists, decoded.pieces, windows, scores=temperature is not None)


def log_loss(pipe: Pipeline, decoded: Decoded, temperature: float) -> float:
    """Mean log loss of the stitched entities' scores at `temperature` against whether they are right."""
    return mean_log_loss(stitched(pipe, decoded, temperature), decoded.right)


def mean_log_loss(spans: list[list[Span]], right: list[bool]) -> float:
    """Mean log loss of the scores of `spans` (every text's, in order) against `right`, one per span."""
    scores = [s.score for found in spans for s in found]
    total = 0.0
    for p, correct in zip(scores, right):
        p = min(max(p, 1e-12), 1 - 1e-12)
        total -= math.log(p if correct else 1 - p)
    return total / len(scores) if scores else 0.0


def fit_temperature(pipe: Pipeline, decoded: Decoded, where: str = "the dev set") -> float:
    """The temperature of least log loss in [LOW, HIGH] (COARSE points, then golden-section search
    between the best one's neighbours), with progress shown; a UserError when it lies at an end of
    the range, where the loss has no minimum to find."""
    bar = progress_display("calibrate", COARSE + REFINE + 1, "temperature")
    losses: dict[float, float] = {}

    def loss(log_t: float) -> float:
        if log_t not in losses:
            losses[log_t] = log_loss(pipe, decoded, math.exp(log_t))
            bar.update(1)
            bar.set_postfix(T=f"{math.exp(log_t):.3f}", loss=f"{losses[log_t]:.4f}")
        return losses[log_t]

    low, high = math.log(LOW), math.log(HIGH)
    coarse = [low + k * (high - low) / (COARSE - 1) for k in range(COARSE)]
    k = min(range(COARSE), key=lambda i: loss(coarse[i]))
    a, b = coarse[max(k - 1, 0)], coarse[min(k + 1, COARSE - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    for _ in range(REFINE):
        if loss(c) <= loss(d):
            b, d = d, c
            c = b - ratio * (b - a)
        else:
            a, c = c, d
            d = a + ratio * (b - a)
    best = min(losses, key=losses.get)
    bar.close()
    if best - low < EDGE or high - best < EDGE:
        raise UserError(f"the log loss of the entity scores still falls at T = {math.exp(best):.3g}, the edge of "
                        f"the search ({LOW:g} to {HIGH:g}): no temperature calibrates this model on this file, "
                        f"and nerkit.json is left as it was", where=where,
                        fix="calibrate on a labelled dev set of the model's own types")
    return math.exp(best)


def calibrate(model_dir: str | Path, data: str | Path | None = None, batch_size: int = 128,
              window: int | None = None, min_entities: int = MIN_CALIBRATION_ENTITIES,
              threads: int | None = None) -> dict:
    """Fit the temperature of MODEL_DIR's scores on the gold file DATA (a dev set: never the test
    set, whose scores would then be fitted to it; None: the dev split the model was selected on),
    write it into MODEL_DIR/nerkit.json, and return it with the expected calibration error, Brier
    score and log loss before and after. A span-head model gets its threshold chosen instead
    (`nerkit.inference.span_threshold.choose_threshold`). Refused, nerkit.json untouched: a file with
    no entities, or fewer than `min_entities` predicted or gold, or a fit at the edge of the range.
    `threads`: torch's (nerkit.device.set_threads; None: as they are)."""
    model_dir = Path(model_dir)
    if threads is not None:
        set_threads(threads)
    found = ModelDir.read(model_dir)
    if found.is_export:
        raise UserError("this is an ONNX export, which has no torch model to fit", where=str(model_dir),
                        fix="calibrate the model directory that `nerkit train` wrote, then export it again")
    pipe = Pipeline.load(found)
    sentences, where = dev_set(pipe, model_dir, data)
    gold = [s.spans() for s in sentences]
    if pipe.head.has_threshold:
        from nerkit.inference.span_threshold import choose_threshold, write_threshold

        result = choose_threshold(pipe, sentences, where, batch_size, window)
        check_enough(result["after"]["predicted"], result["gold"], min_entities, where)
        return write_threshold(model_dir, result)
    decoded = decode(pipe, sentences, batch_size, window)
    entities, gold_count = len(decoded.right), sum(len(set(g)) for g in gold)
    check_enough(entities, gold_count, min_entities, where)
    temperature = fit_temperature(pipe, decoded, where)
    result = {"temperature": round(temperature, 4), "entities": entities, "gold": gold_count, "data": where}
    for name, t in (("before", 1.0), ("after", temperature)):
        spans = stitched(pipe, decoded, t)
        fitted = calibration(gold, spans)
        result[name] = {"ece": fitted["ece"], "brier": fitted["brier"], "log_loss": mean_log_loss(spans, decoded.right)}
    meta_path = update_meta(model_dir, {SCORE_TEMPERATURE: result["temperature"]})
    log.info(f"score temperature {temperature:.3f} on {entities:,} entities of {where}: ECE "
             f"{result['before']['ece']:.4f} -> {result['after']['ece']:.4f}; wrote {meta_path}")
    return result


def check_enough(predicted: int, gold: int, min_entities: int, where: str) -> None:
    """A UserError when the model predicts, or the gold file holds, fewer than `min_entities`."""
    if min(predicted, gold) < min_entities:
        raise UserError(f"{gold:,} gold entities, {predicted:,} predicted: too few to calibrate on (at least "
                        f"{min_entities:,} of each)", where=where,
                        fix="calibrate on a larger dev set, or pass --min-entities N to accept a smaller one")


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
