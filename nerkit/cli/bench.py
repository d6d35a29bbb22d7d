"""`nerkit bench`: train and measure every run of a benchmark matrix, or time whole `nerkit predict`,
`export` and `serve` processes over several rounds (nerkit.tools.bench)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Literal, Optional

import typer

from nerkit.cli.export import ExportFormat, Quantize
from nerkit.cli.options import (
    Device,
    Runtime,
    flag,
)
from nerkit.errors import UserError
from nerkit.tools.bench.annotator import QUERY_COST
from nerkit.tools.bench.engine_run import ENGINES
from nerkit.tools.bench.grow import METHODS as GROW_METHODS
from nerkit.tools.bench.label_studio import TRIGGERS

Engine = Literal[ENGINES]
Trigger = Literal[TRIGGERS]


bench_app = typer.Typer(invoke_without_command=True, help="Train and measure every run of a benchmark matrix "
                        "(`nerkit bench --matrix FILE`), time whole commands (`nerkit bench predict`, `export`, "
                        "`serve`), simulate the annotation loop (`nerkit bench loop`), add types step by step "
                        "(`nerkit bench grow`), or time Label Studio's training loop (`nerkit bench label-studio`).")

ROUNDS = typer.Option(3, "--rounds", min=1, help="Times the command runs, each a fresh process; the record keeps "
                      "each round and their min/median/max.")
SPEED_OUT = typer.Option(..., "--out", "-o", help="Directory for results.jsonl and RESULTS.md (a new one, or one "
                         "that nerkit bench wrote: the record replaces its name's earlier one).")
NAME = typer.Option(None, "--name", help="The record's name (default: from the command and its options).")


@bench_app.callback()
def bench(
    ctx: typer.Context,
    matrix: Optional[Path] = typer.Option(None, "--matrix", help="Matrix YAML, e.g. configs/bench/full.yaml."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output directory (default bench-out/MATRIX_NAME)."),
    quick: bool = flag("--quick", help="Apply the matrix's quick: overrides (a small slice, minutes)."),
    only: List[str] = typer.Option([], "--only", help="Only the runs with this name or name prefix (repeatable, or a,b), and "
                             "the teachers they need that OUT has no model of."),
    resume: bool = flag("--resume", help="Skip runs recorded as ok in OUT/results.jsonl; continue a run from its "
                        "checkpoint when only train limits, threads or device changed (e.g. a larger "
                        "train.time_budget); a run whose model or data changed starts over, saying what "
                        "changed (its old log kept as logs/NAME.previous.log)."),
    device: Optional[Device] = typer.Option(None, "--device", help="train.device of every run."),
    markdown_only: bool = flag("--markdown-only", help="Only rebuild RESULTS.md from results.jsonl."),
    set_: List[str] = typer.Option([], "--set", help="Override a config value of every run: --set train.time_budget=900."),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Comma-separated seeds replacing every entry's, e.g. 1,2."),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Runs trained at once (each its own process)."),
    rounds: Optional[int] = typer.Option(None, "--rounds", min=1, help="Times each run is trained and measured, "
                                         "replacing the matrix's rounds: (speed min/median/max in its record)."),
):
    """Train and measure every run of a benchmark matrix, each in its own process; exit 1 if any failed,
    130 or 143 if SIGINT or SIGTERM stopped a run's training (its checkpoint saved; no further run starts)."""
    if ctx.invoked_subcommand is not None:
        return
    if matrix is None:
        raise UserError("nerkit bench needs --matrix FILE (or a subcommand: predict, export, serve, loop, grow, "
                        "audit, label-studio)",
                        fix="see `nerkit bench --help`")
    from nerkit.tools.bench import parse_seeds, run_bench

    # a run's training stopped by SIGINT or SIGTERM stops the benchmark: Interrupted, the CLI's to report
    table, failed = run_bench(matrix, out, quick=quick, only=only, resume=resume, device=device,
                              markdown_only=markdown_only, sets=set_, seeds=parse_seeds(seeds), jobs=jobs,
                              rounds=rounds)
    typer.echo(table, nl=False)
    if failed:
        raise typer.Exit(1)


@bench_app.command("loop")
def loop(
    config: Path = typer.Option(..., "--config", "-c", help="The model's config (its data.train is the pool, "
                                "data.dev selects and data.test scores), e.g. configs/peopledaily_bilstm.yaml."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for results.jsonl (and, while it runs, the state)."),
    start: int = typer.Option(200, "--start", min=1, help="Random training sentences of round 0."),
    add: int = typer.Option(200, "--add", min=1, help="Sentences chosen in each round after."),
    rounds: int = typer.Option(5, "--rounds", min=1, help="Rounds after round 0."),
    seeds: str = typer.Option("1,2,3", "--seeds", help="Comma-separated seeds: each its own start and training."),
    strategies: str = typer.Option("uncertainty,random", "--strategies", help="Comma-separated: uncertainty, random."),
    dev_limit: int = typer.Option(0, "--dev-limit", min=0, help="Select each run's epoch on the first N dev "
                                  "sentences (0: all); all of them are scored."),
    set_: List[str] = typer.Option([], "--set", help="Override a config value of every round: --set train.epochs=10."),
    device: Optional[Device] = typer.Option(None, "--device", help="train.device of every round."),
    resume: bool = flag("--resume", help="Go on with the loop in --out where it stopped."),
    unit: str = typer.Option("sentence", "--unit", help="Comma-separated: sentence (each round asks --add whole "
                             "sentences), span (each round asks the spans the model is least sure of, answered "
                             "from gold widened to whole names, for what --add sentences of mean length cost; a "
                             "CRF config)."),
    query_cost: int = typer.Option(QUERY_COST, "--query-cost", min=0, help="Characters each question costs besides "
                                   "those it labels (the context read before answering)."),
    span_cost: int = typer.Option(0, "--span-cost", min=0, help="What a span round's questions cost, in characters "
                                  "(0: what --add sentences of the training split's mean length cost)."),
    full: bool = flag("--full", help="Also train on the whole training split once per seed: the full-data F1 the "
                      "summary measures the cost of reaching 99% of."),
):
    """Simulate the annotation loop with the gold labels as the annotator: dev and test F1 by round,
    choosing by uncertainty against at random, asking for sentences or for spans."""
    from nerkit.tools.annotation.select import STRATEGIES, UNITS
    from nerkit.tools.bench import parse_seeds
    from nerkit.tools.bench.loop import LoopOptions, simulate, summary

    chosen = tuple(s.strip() for s in strategies.split(",") if s.strip())
    if not chosen or set(chosen) - set(STRATEGIES):
        raise UserError(f"--strategies takes {', '.join(STRATEGIES)}, not {strategies!r}")
    units = tuple(u.strip() for u in unit.split(",") if u.strip())
    if not units or set(units) - set(UNITS):
        raise UserError(f"--unit takes {', '.join(UNITS)}, not {unit!r}")
    options = LoopOptions(start, add, rounds, tuple(parse_seeds(seeds)), chosen, dev_limit, units, query_cost,
                          span_cost, full)
    records = simulate(config, set_, out, options, resume=resume, device=device)
    typer.echo(summary(records), nl=False)


@bench_app.command("audit")
def audit(
    config: Path = typer.Option(..., "--config", "-c", help="The config whose training corpus gets planted errors "
                                "(data.limit to take a slice) and which trains the fold models; its data.test scores "
                                "the review's models."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for the corpora, the audit, the review's runs and "
                             "results.jsonl."),
    folds: int = typer.Option(5, "--folds", "-k", help="The audit's --folds."),
    retype: float = typer.Option(0.03, "--retype", min=0, max=1, help="Share of entities given another type."),
    boundary: float = typer.Option(0.03, "--boundary", min=0, max=1, help="Share of entities with an end moved."),
    delete: float = typer.Option(0.03, "--delete", min=0, max=1, help="Share of entities deleted."),
    spurious: float = typer.Option(0.01, "--spurious", min=0, max=1, help="Spurious entities, as a share of the "
                                   "entities."),
    noise_seed: int = typer.Option(1, "--noise-seed", help="Seed of the planted errors."),
    seed: int = typer.Option(0, "--seed", help="Seed of the folds and of the random baselines."),
    review_k: int = typer.Option(0, "--review", min=-1, help="Sentences each simulated review corrects (0: the number "
                                 "of noisy sentences; -1: no review trainings)."),
    missing_threshold: Optional[float] = typer.Option(None, "--missing-threshold", help="The audit's "
                                                      "--missing-threshold."),
    set_: List[str] = typer.Option([], "--set", help="Override a config value of every training: --set train.epochs=3."),
    resume: bool = flag("--resume", help="Go on in --out: the audit's finished folds and the review's finished runs "
                        "are kept."),
    name: Optional[str] = NAME,
):
    """Measure `nerkit data audit` on errors planted in a corpus: precision in the top k, recall at the number of
    noisy sentences and AUPRC against cleanlab's ranking and random order, omissions apart, and the test F1 after
    reviewing the top-k sentences against k random ones."""
    from nerkit.tools.audit.noise import NoiseRates
    from nerkit.tools.bench.audit import AuditBenchOptions, bench_audit

    options = AuditBenchOptions(folds, NoiseRates(retype, boundary, delete, spurious), noise_seed, seed, review_k,
                                missing_threshold=missing_threshold)
    table, _ = bench_audit(config, set_, out, options, resume, name)
    typer.echo(table, nl=False)


@bench_app.command("grow")
def grow(
    config: Path = typer.Option(..., "--config", "-c", help="The model's config, for every step (its data.train is "
                                "cut into the steps' slices, data.dev selects and data.test scores), e.g. "
                                "configs/peopledaily_bilstm.yaml."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for results.jsonl, the steps' data and models."),
    order: List[str] = typer.Option([], "--order", help="The types in the order they are added, comma-separated, "
                                    "e.g. PER,LOC,ORG; repeatable, each order its own sequence (default: the "
                                    "corpus's types sorted)."),
    first: int = typer.Option(1, "--first", min=1, help="Types the first step learns; one is added a step after."),
    methods: str = typer.Option(",".join(GROW_METHODS), "--methods", help="Comma-separated: hard, soft (grown with "
                                "those grow.targets), finetune (grown with the old types read as O), joint (trained "
                                "from scratch on the slices so far, labelled for every type so far)."),
    seed: int = typer.Option(1, "--seed", help="The seed of the slices and of every training."),
    set_: List[str] = typer.Option([], "--set", help="Override a config value of every step: --set train.epochs=10."),
    device: Optional[Device] = typer.Option(None, "--device", help="train.device of every step."),
    resume: bool = flag("--resume", help="Go on in --out where it stopped: the steps recorded are skipped."),
):
    """Add entity types one step at a time (the continual-NER protocol): each step's slice of the
    training data labelled for its types alone; micro-F1 over the types so far and each old type's F1
    per step, against fine-tuning and joint training."""
    from nerkit.tools.bench.grow import GrowOptions, simulate, summary

    orders = tuple(tuple(t.strip() for t in o.split(",") if t.strip()) for o in order)
    chosen = tuple(m.strip() for m in methods.split(",") if m.strip())
    records = simulate(config, set_, out, GrowOptions(orders, first, chosen, seed), resume=resume, device=device)
    typer.echo(summary(records), nl=False)


@bench_app.command("predict")
def predict(
    model: Path = typer.Option(..., "--model", "-m", help="Model directory (or an ONNX export)."),
    text: Path = typer.Option(..., "--text", help="Text file, one text a line, e.g. a test set's sentences."),
    out: Path = SPEED_OUT,
    runtime: Runtime = typer.Option("auto", "--runtime", help="nerkit predict's --runtime."),
    workers: int = typer.Option(1, "--workers", min=1, help="nerkit predict's --workers."),
    threads: int = typer.Option(0, "--threads", min=0, help="nerkit predict's --threads (0 = the cores free)."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="nerkit predict's --batch-size."),
    device: Device = typer.Option("cpu", "--device", help="nerkit predict's --device."),
    env: List[str] = typer.Option([], "--env", help="Set a variable in the timed process: --env "
                                  "OMP_WAIT_POLICY=PASSIVE (KEY= unsets it; repeatable)."),
    engine: Optional[Engine] = typer.Option(None, "--engine", help="Time that cluster engine instead, started on "
                                            "this machine with --workers worker processes, tagging the text cut "
                                            "into files through nerkit's adapter (`make engines`; docs/scale.md)."),
    rounds: int = ROUNDS,
    name: Optional[str] = NAME,
):
    """Time whole `nerkit predict` processes (start-up and loading included): chars/s and peak RSS;
    or, with --engine, a whole process that runs Ray, Spark or Dask over the same text."""
    from nerkit.tools.bench.speed import PredictOptions, bench_predict, parse_env

    options = PredictOptions(runtime, workers, threads, batch_size, device, parse_env(env), engine)
    table, _ = bench_predict(model, text, out, options, rounds, name)
    typer.echo(table, nl=False)


@bench_app.command("export")
def export(
    model: Path = typer.Option(..., "--model", "-m", help="Model directory written by `nerkit train`."),
    out: Path = SPEED_OUT,
    fmt: ExportFormat = typer.Option("onnx", "--format", "-f", help="nerkit export's --format."),
    quantize: Optional[Quantize] = typer.Option(None, "--quantize", help="nerkit export's --quantize."),
    data: Optional[Path] = typer.Option(None, "--data", "-d", help="A gold corpus: each round also times a whole "
                                        "`nerkit eval` of the model and of its export (F1, seconds, peak RSS)."),
    rounds: int = ROUNDS,
    name: Optional[str] = NAME,
):
    """Time whole `nerkit export` processes: seconds, the export's size and peak RSS (and, with --data,
    the F1 and evaluation time of the model and of its export)."""
    from nerkit.tools.bench.speed import bench_export

    table, _ = bench_export(model, out, fmt, quantize, rounds, data, name)
    typer.echo(table, nl=False)


@bench_app.command("serve")
def serve(
    model: Path = typer.Option(..., "--model", "-m", help="Model directory (or an ONNX export)."),
    text: Path = typer.Option(..., "--text", help="Text file: each non-empty line is one request, in turn."),
    out: Path = SPEED_OUT,
    requests: int = typer.Option(200, "--requests", min=1, help="Requests of a round, at most."),
    concurrency: int = typer.Option(8, "--concurrency", min=1, help="Clients sending at once."),
    seconds: float = typer.Option(20.0, "--seconds", min=0.1, help="Seconds of a round, at most."),
    threads: int = typer.Option(0, "--threads", min=0, help="nerkit serve's --threads."),
    workers: int = typer.Option(1, "--workers", min=1, help="nerkit serve's --workers."),
    server_option: List[str] = typer.Option([], "--server-option", help="Another nerkit serve option, as one "
                                            "word each: --server-option=--max-wait-ms --server-option=2."),
    rounds: int = ROUNDS,
    name: Optional[str] = NAME,
):
    """Start `nerkit serve`, then time rounds of a bounded load: latency p50/p95/p99 and throughput."""
    from nerkit.tools.bench.serve_load import Load, bench_serve

    table, _ = bench_serve(model, text, out, Load(requests, concurrency, seconds), rounds, threads, workers,
                           server_option, name)
    typer.echo(table, nl=False)


@bench_app.command("label-studio")
def label_studio(
    model: Path = typer.Option(..., "--model", "-m", help="The model served and trained from (a model directory)."),
    data: Path = typer.Option(..., "--data", "-d", help="A gold corpus: its first --tasks sentences are the project's "
                              "tasks, its labels the annotator's."),
    out: Path = SPEED_OUT,
    tasks: int = typer.Option(100, "--tasks", min=2, help="Tasks imported into the project."),
    batch: int = typer.Option(20, "--batch", min=3, help="Annotations submitted, the first --batch tasks', before "
                              "training starts (a job needs 3 complete tasks)."),
    trigger: Trigger = typer.Option("auto", "--trigger", help="How training starts: auto (Label Studio's own "
                                    "auto-training, every --batch annotations) or button (its Start training "
                                    "button, pressed after the batch)."),
    train_config: Optional[Path] = typer.Option(None, "--train-config", help="nerkit serve's --train-config (default: "
                                                "the model's config.yaml)."),
    train_set: List[str] = typer.Option([], "--train-set", help="nerkit serve's --train-set: --train-set "
                                        "train.epochs=5 (repeatable)."),
    holdout: float = typer.Option(0.2, "--holdout", min=0.01, max=0.9, help="nerkit serve's --holdout."),
    job_timeout: float = typer.Option(1800, "--job-timeout", min=1, help="Seconds a training job may take."),
    label_studio_url: Optional[str] = typer.Option(None, "--label-studio-url", help="A running Label Studio to use "
                                                   "(default: start one from .venv-ls on 127.0.0.1, `make "
                                                   "label-studio`); each round makes a project there and deletes it."),
    label_studio_api_key: Optional[str] = typer.Option(None, "--label-studio-api-key", envvar="LABEL_STUDIO_API_KEY",
                                                       show_default=False, help="With --label-studio-url: its API token."),
    rounds: int = typer.Option(1, "--rounds", min=1, help="Rounds, each a fresh project, server and model store."),
    name: Optional[str] = NAME,
):
    """Time Label Studio's training loop end to end: from the first annotation of a batch submitted
    through Label Studio to the job's start and end and to the first prediction by the new version
    read through Label Studio, and the served model's /predict latency while the job runs and idle."""
    from nerkit.tools.bench.label_studio import StudioBench, bench_label_studio

    options = StudioBench(tasks, batch, trigger, train_config, tuple(train_set), holdout, job_timeout,
                          label_studio_url, label_studio_api_key)
    table, _ = bench_label_studio(model, data, out, options, rounds, name)
    typer.echo(table, nl=False)
