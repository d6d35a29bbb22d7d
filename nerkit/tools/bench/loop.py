"""`nerkit bench loop`: the annotation loop of `nerkit data select`, simulated with the gold labels
standing in for the annotator, to measure what choosing by uncertainty buys over choosing at random,
and what asking for spans buys over asking for sentences.

For each seed, every loop starts from the same `start` random training sentences, labelled whole
(round 0). Each round after, a sentence loop (`unit` sentence) adds `add` sentences chosen from the
rest of the training split, by the model of the round before or at random; a span loop (`unit`
span) asks about the spans that model is least sure of in the rest (or random ones of the same
candidates), each answered from gold and widened to the whole names it cuts, until the round's
questions cost what `add` sentences of mean length do (`span_cost` to choose), the sentences asked
becoming partially annotated training sentences (nerkit.tools.bench.annotator says how it counts
the cost, the same for both units). The model is trained again from scratch on all of them with the
same config (the same budget every round). With `full`, each seed's model of the whole training
split is trained once too: the full-data F1 that the summary measures each loop against. Every
round's model is scored on the dev set, which also selects its epoch as in any run, and on the test
set (never used to choose anything). Each round is a record in OUT/results.jsonl as soon as it is
done, and each loop's labels in OUT/state/, so that `--resume` goes on where a stopped run left off:
a round stopped midway continues from its checkpoint in OUT/runs/.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from nerkit.errors import UserError
from nerkit.files import read_json_lines
from nerkit.inference.model_dir import read_metrics
from nerkit.tools.bench.annotator import QUERY_COST
from nerkit.tools.bench.runner import host_info, open_simulation, recorded

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
    units: tuple[str, ...] = ("sentence",)  # nerkit.tools.annotation.select.UNITS
    query_cost: int = QUERY_COST  # characters each question costs besides those it labels
    span_cost: int = 0  # what a span round's questions cost (0: what `add` sentences of mean length do)
    full: bool = False  # also train on the whole training split once per seed


FULL = ("full", "all")  # the (unit, strategy) of a seed's model of the whole training split


def is_loop_dir(directory: Path) -> bool:
    return all(p.name in (RESULTS, "state", "runs") for p in directory.iterdir())


def record_key(record: dict) -> tuple:
    """A record's (unit, strategy, seed, round); a record written before units were is a sentence loop's."""
    return record.get("unit", "sentence"), record["strategy"], record["seed"], record["round"]


def simulate(config_path: str | Path, overrides: list[str], out: str | Path, options: LoopOptions = LoopOptions(),
             resume: bool = False, device: str | None = None) -> list[dict]:
    """Run the loop for every seed, unit and strategy (see the module's docstring); returns the records."""
    from nerkit.config import head_traits
    from nerkit.data.splits import read_splits

    out = Path(out)
    config = open_simulation(config_path, overrides, out, resume, device, is_loop_dir, "an earlier loop (--resume it)")
    if "span" in options.units and not head_traits(config).supports_marginals:
        raise UserError(f"a span loop needs a CRF's marginals; this config's head is model.head: {config.model.head}",
                        where=str(config_path), fix="use --unit sentence, or a config with model.head: crf")
    if "span" in options.units and config.data.context == "document":  # as training refuses a partial corpus there
        raise UserError("a span loop's partial sentences cannot be read with data.context: document",
                        where=str(config_path), fix="use --unit sentence, or --set data.context=sentence")
    splits = read_splits(config)
    needed = options.start + (options.add * options.rounds if "sentence" in options.units else 0)
    if needed > len(splits.train):
        raise UserError(f"the loop needs {needed:,} training sentences, the split has {len(splits.train):,}",
                        fix="lower --start, --add or --rounds")
    done = recorded(out / RESULTS, resume, record_key, "a loop record")
    out.mkdir(parents=True, exist_ok=True)
    base = {**host_info(), "config": str(config_path), "overrides": list(overrides), "options": asdict(options)}
    for seed in options.seeds:
        if options.full and (*FULL, seed, 0) not in done:
            run_full(config, splits, out, options, seed, base)
        for unit in options.units:
            for strategy in options.strategies:
                run_one(config, splits, out, options, unit, strategy, seed, done, base)
    return [r for _, r in read_json_lines(out / RESULTS, "a loop record")]


def run_one(config, splits, out: Path, options: LoopOptions, unit: str, strategy: str, seed: int, done: set,
            base: dict) -> None:
    """One unit, strategy and seed through every round, from its saved labels where it has them."""
    from nerkit.tools.bench.annotator import UNIT_LABELS

    labels = UNIT_LABELS[unit](splits.train, options, strategy, seed, out / "state")
    runs = out / "runs" / (f"{strategy}-s{seed}" if unit == "sentence" else f"{unit}-{strategy}-s{seed}")
    for round_ in range(options.rounds + 1):
        written = (unit, strategy, seed, round_) in done
        if written and (round_ == options.rounds or labels.chosen(round_ + 1)):
            continue  # this round's model chose the next labels before the stop
        started = time.perf_counter()
        run_dir = runs / f"round{round_}"
        pipe, metrics = train_round(config, splits, labels.training(round_), run_dir, seed, options.dev_limit)
        if not written:
            write_record(out, {"unit": unit, "strategy": strategy, "seed": seed, "round": round_,
                               **labels.tally(round_)}, metrics, started, options, base)
        if round_ == options.rounds:
            break
        labels.choose(pipe, round_ + 1)
        shutil.rmtree(run_dir)  # its labels are chosen: no resume needs this model again
    shutil.rmtree(runs, ignore_errors=True)


def run_full(config, splits, out: Path, options: LoopOptions, seed: int, base: dict) -> None:
    """The seed's model of the whole training split, recorded as unit "full" (its cost: every
    sentence asked whole)."""
    from nerkit.tools.bench.annotator import question_cost

    started = time.perf_counter()
    run_dir = out / "runs" / f"full-s{seed}"
    _, metrics = train_round(config, splits, splits.train, run_dir, seed, options.dev_limit)
    characters = sum(len(s) for s in splits.train)
    tally = {"sentences": len(splits.train), "characters": characters, "queries": len(splits.train),
             "cost": question_cost(characters, len(splits.train), options.query_cost)}
    write_record(out, {"unit": FULL[0], "strategy": FULL[1], "seed": seed, "round": 0, **tally}, metrics, started,
                 options, base)
    shutil.rmtree(run_dir, ignore_errors=True)


def write_record(out: Path, record: dict, metrics: dict, started: float, options: LoopOptions, base: dict) -> None:
    """A round's record, appended to OUT/results.jsonl at once (a stop loses no finished round)."""
    record = {**record, "query_cost": options.query_cost, "dev_f1": metrics["dev_f1"], "test_f1": metrics["test_f1"],
              "best_epoch": metrics["best_epoch"], "seconds": round(time.perf_counter() - started, 1),
              "device": metrics["device"], "date": time.strftime("%Y-%m-%d %H:%M:%S"), **base}
    with open(out / RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    log.info(f"loop {record['unit']} {record['strategy']} seed {record['seed']} round {record['round']}: "
             f"{record['sentences']:,} sentences, cost {record['cost']:,} characters, dev F1 "
             f"{100 * record['dev_f1']:.2f}, test F1 {100 * (record['test_f1'] or 0):.2f}")


def train_round(config, splits, train_sentences, run_dir: Path, seed: int, dev_limit: int):
    """Train on `train_sentences` (selecting the epoch on the first `dev_limit` dev sentences, or
    all), then score the whole dev and test sets; the pipeline and its F1s. A run stopped midway
    continues from its checkpoint, and a finished one is only scored (a stop came before its record
    or its choice)."""
    from nerkit.data.splits import Splits
    from nerkit.inference.pipeline import Pipeline
    from nerkit.training.loop import finished, train_or_continue

    dev = splits.dev[:dev_limit] if dev_limit else splits.dev
    subset = Splits(train_sentences, dev, None, splits.types, splits.scheme,
                    {**splits.checksums, "loop": f"{len(train_sentences)}-{seed}"})
    config = replace(config, train=replace(config.train, seed=seed))
    if not finished(run_dir):
        train_or_continue(config, run_dir, splits=subset)
    metrics = read_metrics(run_dir)
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
    """The sentence loops' table (`sentence_table`), and where any record is a span loop's or a
    full-data run's, every loop by its cost (`cost_table`) and what each cost to reach 99% of the
    full-data F1 (`reach_table`)."""
    sentences = [r for r in records if record_key(r)[0] == "sentence"]
    tables = [sentence_table(sentences)] if sentences else []
    if len(sentences) < len(records):
        tables += [cost_table(records), reach_table(records)]
    return "\n".join(tables)


def sentence_table(records: list[dict]) -> str:
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
            cells += [f"{mean(100 * r['dev_f1'] for r in rows):.2f}", test_cell(rows)]
        lines.append(f"| {config} | {round_} | {sentences:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def test_cell(rows: list[dict]) -> str:
    tests = [100 * (r["test_f1"] or 0) for r in rows]
    return f"{mean(tests):.2f} ({min(tests):.2f}-{max(tests):.2f}, {len(rows)} seeds)"


def loop_name(record: dict) -> str:
    unit, strategy = record_key(record)[:2]
    return "full data" if (unit, strategy) == FULL else f"{unit}, {strategy}"


def cost_table(records: list[dict]) -> str:
    """Every loop's rounds (and the full-data runs) over the seeds: questions, characters labelled and
    the cost with each question's fixed cost (means), dev F1 and test F1 (mean, lowest-highest)."""
    by: dict = {}
    for r in records:
        by.setdefault((Path(r["config"]).stem, loop_name(r), r["round"]), []).append(r)
    lines = ["| config | loop | round | questions | characters | cost | dev F1 | test F1 (lowest-highest) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (config, name, round_), rows in sorted(by.items()):
        lines.append(f"| {config} | {name} | {round_} | {mean(r['queries'] for r in rows):,.0f} | "
                     f"{mean(r['characters'] for r in rows):,.0f} | {mean(r['cost'] for r in rows):,.0f} | "
                     f"{mean(100 * r['dev_f1'] for r in rows):.2f} | {test_cell(rows)} |")
    return "\n".join(lines) + "\n"


REACH = 0.99  # the share of the full-data F1 a loop is measured to reach


def reach_table(records: list[dict]) -> str:
    """Per config and seed, each loop's first round whose test F1 reaches REACH x the full-data run's
    test F1 (the test set chooses nothing: this only reads the curve): its cost, its characters as
    a share of the training split's, and its cost and characters over the sentence loop's of the
    same strategy."""
    lines = [f"| config | seed | full-data test F1 | loop | reaches {REACH:.0%} at round | cost | "
             "characters (% of training) | cost / sentence loop's | characters / sentence loop's |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for config in sorted({Path(r["config"]).stem for r in records}):
        mine = [r for r in records if Path(r["config"]).stem == config]
        for seed in sorted({r["seed"] for r in mine}):
            full = next((r for r in mine if r["seed"] == seed and record_key(r)[:2] == FULL), None)
            if full is None or full["test_f1"] is None:
                lines.append(f"| {config} | {seed} | no full-data run (--full) | | | | | | |")
                continue
            target = REACH * full["test_f1"]
            reached = {}
            for unit, strategy in sorted({record_key(r)[:2] for r in mine if r["seed"] == seed} - {FULL}):
                rounds = sorted((r for r in mine if r["seed"] == seed and record_key(r)[:2] == (unit, strategy)),
                                key=lambda r: r["round"])
                reached[unit, strategy] = next((r for r in rounds if (r["test_f1"] or 0) >= target), None), rounds
            for (unit, strategy), (first, rounds) in reached.items():
                head = f"| {config} | {seed} | {100 * full['test_f1']:.2f} | {unit}, {strategy} |"
                if first is None:
                    best = max(rounds, key=lambda r: r["test_f1"] or 0)
                    lines.append(f"{head} not reached (best {100 * (best['test_f1'] or 0):.2f} at round "
                                 f"{best['round']}) | | | | |")
                    continue
                baseline = reached.get(("sentence", strategy), (None,))[0]
                compared = baseline and unit != "sentence"
                ratios = [f"{first[k] / baseline[k]:.2f}" if compared else "" for k in ("cost", "characters")]
                lines.append(f"{head} {first['round']} | {first['cost']:,} | {first['characters']:,} "
                             f"({100 * first['characters'] / full['characters']:.1f}%) | " + " | ".join(ratios) + " |")
    return "\n".join(lines) + "\n"
