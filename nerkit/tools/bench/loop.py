"""`nerkit bench loop`: the annotation loop of `nerkit data select`, simulated with the gold labels
standing in for the annotator, to measure what choosing by uncertainty buys over choosing at random.

For each seed, both strategies start from the same `start` random training sentences; each round
then adds `add` sentences chosen from the rest of the training split (by the model of the round
before, or at random), and the model is trained again from scratch on all of them with the same
config (the same budget every round). Every round's model is scored on the dev set, which also
selects its epoch as in any run, and on the test set (never used to choose anything). Each round is
a record in OUT/results.jsonl as soon as it is done, and the labelled set of each (strategy, seed)
in OUT/state/, so that `--resume` goes on where a stopped run left off.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from nerkit.config import load_config
from nerkit.errors import UserError
from nerkit.files import atomic_write_text, check_output_directory, read_json_lines
from nerkit.tools.bench.runner import host_info

log = logging.getLogger(__name__)

RESULTS = "results.jsonl"


@dataclass(frozen=True)
class LoopOptions:
    start: int = 200  # random training sentences of round 0
    add: int = 200  # sentences chosen each round after
    rounds: int = 5  # rounds after round 0
    seeds: tuple[int, ...] = (1, 2, 3)
    strategies: tuple[str, ...] = ("uncertainty", "random")
    dev_limit: int = 0  # the first N dev sentences select each run's epoch (0: all); all are scored


def is_loop_dir(directory: Path) -> bool:
    return all(p.name in (RESULTS, "state", "runs") for p in directory.iterdir())


def simulate(config_path: str | Path, overrides: list[str], out: str | Path, options: LoopOptions = LoopOptions(),
             resume: bool = False, device: str | None = None) -> list[dict]:
    """Run the loop for every seed and strategy (see the module's docstring); returns the records."""
    from nerkit.data.splits import read_splits

    out = Path(out)
    check_output_directory(out, resume, own=is_loop_dir, inputs=[config_path], what="an earlier loop (--resume it)")
    config = load_config(config_path, overrides)
    if device is not None:
        config = replace(config, train=replace(config.train, device=device))
    splits = read_splits(config)
    needed = options.start + options.add * options.rounds
    if needed > len(splits.train):
        raise UserError(f"the loop needs {needed:,} training sentences, the split has {len(splits.train):,}",
                        fix="lower --start, --add or --rounds")
    done = {(r["strategy"], r["seed"], r["round"]) for _, r in read_json_lines(out / RESULTS, "a loop record")} \
        if resume and (out / RESULTS).is_file() else set()
    out.mkdir(parents=True, exist_ok=True)
    base = {**host_info(), "config": str(config_path), "overrides": list(overrides), "options": asdict(options)}
    for seed in options.seeds:
        for strategy in options.strategies:
            run_one(config, splits, out, options, strategy, seed, done, base)
    return [r for _, r in read_json_lines(out / RESULTS, "a loop record")]


def run_one(config, splits, out: Path, options: LoopOptions, strategy: str, seed: int, done: set,
            base: dict) -> None:
    """One strategy and seed through every round, from its saved labelled set where it has one."""
    from nerkit.tools.annotation.select import select

    state_file = out / "state" / f"{strategy}-s{seed}.json"
    labelled = random.Random(seed).sample(range(len(splits.train)), options.start)  # the same for both strategies
    if state_file.is_file():
        labelled = json.loads(state_file.read_text(encoding="utf-8"))["labelled"]
    for round_ in range(options.rounds + 1):
        size = options.start + options.add * round_
        if (strategy, seed, round_) in done and len(labelled) > size:
            continue  # this round's model chose the next sentences before the stop
        run_dir = out / "runs" / f"{strategy}-s{seed}"
        started = time.perf_counter()
        pipe, metrics = train_round(config, splits, [splits.train[i] for i in labelled[:size]], run_dir, seed,
                                    options.dev_limit)
        if (strategy, seed, round_) not in done:
            record = {"strategy": strategy, "seed": seed, "round": round_, "sentences": size,
                      "characters": sum(len(splits.train[i]) for i in labelled[:size]),
                      "dev_f1": metrics["dev_f1"], "test_f1": metrics["test_f1"], "best_epoch": metrics["best_epoch"],
                      "seconds": round(time.perf_counter() - started, 1), "device": metrics["device"],
                      "date": time.strftime("%Y-%m-%d %H:%M:%S"), **base}
            with open(out / RESULTS, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            log.info(f"loop {strategy} seed {seed} round {round_}: {size:,} sentences, dev F1 "
                     f"{100 * record['dev_f1']:.2f}, test F1 {100 * record['test_f1']:.2f}")
        if round_ == options.rounds:
            break
        rest = sorted(set(range(len(splits.train))) - set(labelled))
        texts = [splits.train[i].text for i in rest]
        picked = select(pipe, texts, options.add, strategy, seed * 1000 + round_)
        labelled = labelled[:size] + [rest[k] for k in picked]
        atomic_write_text(state_file, json.dumps({"labelled": labelled, "options": asdict(options)}) + "\n")
    shutil.rmtree(out / "runs" / f"{strategy}-s{seed}", ignore_errors=True)


def train_round(config, splits, train_sentences, run_dir: Path, seed: int, dev_limit: int):
    """Train on `train_sentences` (selecting the epoch on the first `dev_limit` dev sentences, or
    all), then score the whole dev and test sets; the pipeline and its F1s."""
    from nerkit.data.splits import Splits
    from nerkit.inference.pipeline import Pipeline
    from nerkit.training.loop import train

    dev = splits.dev[:dev_limit] if dev_limit else splits.dev
    subset = Splits(train_sentences, dev, None, splits.types, splits.scheme,
                    {**splits.checksums, "loop": f"{len(train_sentences)}-{seed}"})
    config = replace(config, train=replace(config.train, seed=seed))
    metrics = train(config, out=run_dir, force=True, progress_bar=False, splits=subset)
    pipe = Pipeline.load(run_dir, device=metrics["device"])
    batch = config.train.eval_batch_size
    dev_f1 = pipe.evaluate(splits.dev, batch)["f1"]
    test_f1 = pipe.evaluate(splits.test, batch)["f1"] if splits.test else None
    return pipe, {"dev_f1": dev_f1, "test_f1": test_f1, "best_epoch": metrics["best_epoch"],
                  "device": describe_device(metrics["device"])}


def describe_device(device: str) -> str:
    """`cpu`, or the GPU's name (`cuda: NVIDIA H200`): a record says what it ran on."""
    import torch

    return f"cuda: {torch.cuda.get_device_name()}" if str(device).startswith("cuda") else str(device)


def summary(records: list[dict]) -> str:
    """Dev and test F1 by config, round and strategy over the seeds (mean, and the lowest and
    highest test F1), as a Markdown table: the two strategies side by side at each round."""
    by: dict = {}
    for r in records:
        by.setdefault((Path(r["config"]).stem, r["round"], r["sentences"]), {}).setdefault(r["strategy"], []).append(r)
    strategies = sorted({r["strategy"] for r in records}, key=lambda s: (s != "uncertainty", s))
    head = "| config | round | sentences | " + " | ".join(f"{s}: dev F1 | {s}: test F1 (lowest-highest)"
                                                           for s in strategies) + " |"
    lines = [head, "|---|---:|---:|" + "---:|---:|" * len(strategies)]
    for (config, round_, sentences), found in sorted(by.items()):
        cells = []
        for s in strategies:
            rows = found.get(s, [])
            if not rows:
                cells += ["", ""]
                continue
            tests = [100 * (r["test_f1"] or 0) for r in rows]
            dev = sum(100 * r["dev_f1"] for r in rows) / len(rows)
            cells += [f"{dev:.2f}", f"{sum(tests) / len(tests):.2f} ({min(tests):.2f}-{max(tests):.2f}, {len(rows)} seeds)"]
        lines.append(f"| {config} | {round_} | {sentences:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
