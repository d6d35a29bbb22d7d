"""`nerkit bench grow`: adding entity types one step at a time, measured with the protocol of the
continual-NER papers (ExtendNER, Monaikul et al., AAAI 2021; CFNER, Zheng et al., ACL 2022).

The training split is cut into as many disjoint slices as there are steps (`slices`, the papers'
greedy sampling); step i's slice is labelled for step i's types alone (every other entity removed,
not marked). The first step trains a model from scratch; each later one grows the previous step's
model by its types (`nerkit train --from`, nerkit.training.grow) with `hard` or `soft` targets for
the old types, and against them `finetune` (grow.targets: none, the old types read as O: plain fine-tuning, which
forgets) and `joint` (a model trained from scratch on the slices so far labelled for every type so
far: what relabelling everything would give). Each step's model is chosen on the dev set labelled
for the types so far, and scored once on the test set labelled for them: micro-F1 and each type's
F1. Each step is a record in OUT/results.jsonl as soon as it is done, and its model stays in
OUT/runs/ (the next step grows it), so that `--resume` skips the steps done.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from nerkit.data.corpus import write_corpus
from nerkit.data.matching import keep_types
from nerkit.errors import UserError
from nerkit.files import read_json_lines
from nerkit.inference.model_dir import WEIGHTS_FILE, read_metrics
from nerkit.tools.bench.loop import describe_device, mean
from nerkit.tools.bench.runner import host_info, open_simulation, recorded
from nerkit.tools.bench.speed import invocation

log = logging.getLogger(__name__)

RESULTS = "results.jsonl"
METHODS = ("hard", "soft", "finetune", "joint")  # how each step after the first learns
TARGETS = {"hard": "hard", "soft": "soft", "finetune": "none"}  # the grow.targets of the methods that grow


@dataclass(frozen=True)
class GrowOptions:
    orders: tuple[tuple[str, ...], ...] = ()  # each a sequence of the corpus's types (empty: its types sorted)
    first: int = 1  # types the first step learns; one per step after
    methods: tuple[str, ...] = METHODS
    seed: int = 1  # the slices' and every training's seed


def steps_of(order: tuple[str, ...], first: int) -> list[tuple[str, ...]]:
    """The types each step adds: the first `first` of `order`, then one a step."""
    return [tuple(order[:first])] + [(t,) for t in order[first:]]


def is_grow_dir(directory: Path) -> bool:
    return all(p.name in (RESULTS, "data", "runs") for p in directory.iterdir())


def record_key(record: dict) -> tuple:
    return record["order"], record["method"], record["step"], record["seed"]


def order_name(order: tuple[str, ...]) -> str:
    return "-".join(order)


def simulate(config_path: str | Path, overrides: list[str], out: str | Path, options: GrowOptions,
             resume: bool = False, device: str | None = None) -> list[dict]:
    """Every order and method through its steps (the module's docstring); returns the records."""
    from nerkit.data.splits import read_splits

    out = Path(out)
    config = open_simulation(config_path, overrides, out, resume, device, is_grow_dir, "an earlier run (--resume it)")
    if config.grow.source:
        raise UserError("the benchmark grows its own models", where=str(config_path), fix="remove grow.source")
    unknown = [m for m in options.methods if m not in METHODS]
    if unknown:
        raise UserError(f"unknown method {unknown[0]!r}", fix=f"choose among {', '.join(METHODS)}")
    splits = read_splits(config)
    orders = options.orders or (tuple(splits.types),)
    for order in orders:
        if sorted(order) != sorted(splits.types):
            raise UserError(f"the order {','.join(order)} is not the corpus's types, {', '.join(splits.types)}, "
                            "each once", where=str(config_path), fix="list every type of the corpus once")
        if not 1 <= options.first < len(order):
            raise UserError(f"--first {options.first}: the first step must leave a type to add "
                            f"({len(order)} types)", fix=f"use --first 1 to {len(order) - 1}")
    done = recorded(out / RESULTS, resume, record_key, "a grow record")
    out.mkdir(parents=True, exist_ok=True)
    base = {**host_info(), "command": invocation(), "config": str(config_path), "overrides": list(overrides),
            "options": asdict(options)}
    for order in orders:
        run_order(config, splits, out, order, options, done, base)
    return [r for _, r in read_json_lines(out / RESULTS, "a grow record")]


def slices(sentences, steps: list[tuple[str, ...]], seed: int) -> list[list[int]]:
    """The training sentences' indices cut into one disjoint slice per step, as the continual-NER
    papers' greedy sampling does (Monaikul et al. 2021, followed by CFNER): in a seeded order, a
    sentence goes to the step, among those whose types it holds, with the fewest sentences so far,
    and a sentence of no step's types to the smallest slice; so each slice holds its own types'
    entities however rare they are, and the slices stay as even as the types allow."""
    order = list(range(len(sentences)))
    random.Random(seed).shuffle(order)
    cut: list[list[int]] = [[] for _ in steps]
    for i in order:
        held = {span.type for span in sentences[i].spans()}
        candidates = [k for k, types in enumerate(steps) if held & set(types)] or range(len(steps))
        cut[min(candidates, key=lambda k: (len(cut[k]), k))].append(i)
    return [sorted(c) for c in cut]


def write_step_data(splits, directory: Path, steps: list[tuple[str, ...]], seed: int) -> list[dict]:
    """Each step's corpora, as JSON lines in `directory`: `train` (its slice, its types alone),
    `joint` (the slices so far, every type so far), `dev` and `test` (every type so far). Returns
    their paths and sizes per step."""
    directory.mkdir(parents=True, exist_ok=True)
    cut = slices(splits.train, steps, seed)
    files, seen = [], []
    for i, types in enumerate(steps, start=1):
        seen += list(types)
        own = [splits.train[j] for j in cut[i - 1]]
        so_far = [splits.train[j] for k in range(i) for j in cut[k]]
        paths = {name: directory / f"step{i}.{name}.jsonl" for name in ("train", "joint", "dev", "test")}
        for name, sentences, kept in (("train", own, types), ("joint", so_far, seen), ("dev", splits.dev, seen),
                                      ("test", splits.test or [], seen)):
            if not paths[name].is_file():  # written once: a resumed run reads what its first steps trained on
                write_corpus(paths[name], keep_types(sentences, set(kept)), "jsonl")
        files.append({"paths": paths, "sentences": len(own), "joint_sentences": len(so_far), "types": list(seen)})
    return files


def run_order(config, splits, out: Path, order: tuple[str, ...], options: GrowOptions, done: set, base: dict) -> None:
    """One order of types: its data written, the first step's model trained once (every method
    starts from it), then each method step by step."""
    from nerkit.training.loop import finished

    if splits.test is None:
        raise UserError("the benchmark scores each step on a test set", where=str(base["config"]),
                        fix="set data.test")
    steps = steps_of(order, options.first)
    name = order_name(order)
    files = write_step_data(splits, out / "data" / f"{name}-s{options.seed}", steps, options.seed)
    runs = out / "runs" / f"{name}-s{options.seed}"
    first = runs / "step1"
    for method in options.methods:
        key = (name, method, 1, options.seed)
        if key in done and (first / WEIGHTS_FILE).is_file():
            continue
        if not finished(first):  # never trained, or stopped midway: continued from its checkpoint
            train_step(config, splits, files[0], first, options.seed, None, "none")
        write_record(out, {"order": name, "method": method, "step": 1, "seed": options.seed,
                           "new_types": list(steps[0]), **files_tally(files[0])}, first, base)
        done.add(key)
    for method in options.methods:
        previous = first
        for i in range(2, len(steps) + 1):
            run_dir = runs / method / f"step{i}"
            key = (name, method, i, options.seed)
            if key not in done or not (run_dir / WEIGHTS_FILE).is_file():
                started = time.perf_counter()
                if method == "joint":
                    train_step(config, splits, files[i - 1], run_dir, options.seed, None, "none", joint=True)
                else:
                    train_step(config, splits, files[i - 1], run_dir, options.seed, previous, TARGETS[method])
                write_record(out, {"order": name, "method": method, "step": i, "seed": options.seed,
                                   "new_types": list(steps[i - 1]), **files_tally(files[i - 1], method == "joint"),
                                   "seconds": round(time.perf_counter() - started, 1)}, run_dir, base)
            previous = run_dir


def files_tally(step: dict, joint: bool = False) -> dict:
    return {"types": step["types"], "sentences": step["joint_sentences" if joint else "sentences"]}


def train_step(config, splits, step: dict, run_dir: Path, seed: int, source: Path | None, targets: str,
               joint: bool = False) -> dict:
    """Train one step's model in `run_dir`: from scratch (`source` None) or grown from `source`;
    a step stopped midway continues from its checkpoint."""
    from nerkit.training.loop import train_or_continue

    paths = step["paths"]
    data = replace(config.data, train=str(paths["joint" if joint else "train"]), dev=str(paths["dev"]),
                   test=str(paths["test"]), limit=0, train_extra=None, hide_entities=0.0, scheme=splits.scheme)
    grow = replace(config.grow, source=str(source) if source is not None else None, targets=targets,
                   anchor=config.grow.anchor if source is not None else 0.0)  # --set grow.anchor: the grown steps'
    step_config = replace(config, data=data, grow=grow, train=replace(config.train, seed=seed))
    return train_or_continue(step_config, run_dir)


def write_record(out: Path, record: dict, run_dir: Path, base: dict) -> None:
    """A step's record from its model's metrics.json, appended to OUT/results.jsonl at once (a stop
    loses no finished step)."""
    metrics = read_metrics(run_dir)
    test = metrics["test"]
    record = {**record, "dev_f1": metrics["dev"]["f1"], "test_f1": test["f1"],
              "per_type": {t: v["f1"] for t, v in test["per_type"].items()}, "best_epoch": metrics["best_epoch"],
              "device": describe_device(metrics["device"]), "run": str(run_dir), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              **base}
    with open(out / RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
    log.info(f"grow {record['order']} {record['method']} step {record['step']} (+{','.join(record['new_types'])}): "
             f"test F1 {100 * record['test_f1']:.2f}, " + ", ".join(f"{t} {100 * f:.2f}" for t, f in record["per_type"].items()))


def latest(records: list[dict]) -> dict:
    """The last record of each (order, method, step, seed): a step trained again replaces its record."""
    found = {}
    for r in records:
        found[record_key(r)] = r
    return found


def summary(records: list[dict]) -> str:
    """The results as Markdown: per order, a row per step and a column per method (test micro-F1 over
    the types so far, and each old type's F1), the average over the steps, and each method's worst
    change of an old type's F1 against its model of the step before."""
    found = latest(records)
    lines = []
    for order in sorted({k[0] for k in found}):
        mine = {k: r for k, r in found.items() if k[0] == order}
        methods = [m for m in METHODS if any(k[1] == m for k in mine)]
        seeds = sorted({k[3] for k in mine})
        steps = sorted({k[2] for k in mine})
        lines += [f"### {order} (seed {', '.join(map(str, seeds))})", "",
                  "| step | types | " + " | ".join(f"{m}: micro-F1 | {m}: old types' F1" for m in methods) + " |",
                  "|---:|---|" + "---:|---|" * len(methods)]
        for step in steps:
            rows = {m: [r for k, r in mine.items() if k[1] == m and k[2] == step] for m in methods}
            any_row = next(r for rs in rows.values() for r in rs)
            cells = []
            for m in methods:
                if not rows[m]:
                    cells += ["", ""]
                    continue
                old = [t for t in any_row["types"] if t not in any_row["new_types"]]
                cells += [f"{mean(100 * r['test_f1'] for r in rows[m]):.2f}",
                          ", ".join(f"{t} {mean(100 * r['per_type'].get(t, 0.0) for r in rows[m]):.2f}" for t in old)]
            lines.append(f"| {step} | +{','.join(any_row['new_types'])} | " + " | ".join(cells) + " |")
        averages, drops = [], []
        for m in methods:
            per_step = [mean(100 * r["test_f1"] for k, r in mine.items() if k[1] == m and k[2] == s)
                        for s in steps if any(k[1] == m and k[2] == s for k in mine)]
            averages.append(f"{mean(per_step):.2f}" if len(per_step) == len(steps) else "")
            drops.append(largest_drop({k: r for k, r in mine.items() if k[1] == m}))
        lines.append("| average | | " + " | ".join(f"{a} | worst old-type change {d}" for a, d in zip(averages, drops))
                     + " |")
        lines.append("")
    return "\n".join(lines) + "\n" if lines else "no records yet\n"


def largest_drop(records: dict) -> str:
    """The worst change (the largest fall, or the smallest gain) of an old type's test F1 from one
    step's model to the next's, as "TYPE -x.xx (step N)", over one method's records."""
    worst = None
    for (order, method, step, seed), r in records.items():
        before = records.get((order, method, step - 1, seed))
        if before is None:
            continue
        for t, f1 in r["per_type"].items():
            if t in before["per_type"] and t not in r["new_types"]:
                drop = 100 * (before["per_type"][t] - f1)
                if worst is None or drop > worst[0]:
                    worst = (drop, t, step)
    return "" if worst is None else f"{worst[1]} {0.0 - worst[0]:+.2f} (step {worst[2]})"
