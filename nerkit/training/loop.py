"""The training loop, in named steps: `set_up` (data, vocabularies, model, optimiser, schedule, a
fresh or resumed state), `train_step` (one batch), `run_epoch` (its batches, stopping where a limit
or Ctrl-C says; with `nerkit distill`, `distill_step` on the unlabelled batches mixed among
them), `end_epoch` (dev evaluation, best and last models, the checkpoint) and `finish`
(the best model's final figures, test scored once and never used for selection). `train` runs them.
A run with `grow.source` adds types to a trained model: its pipeline, its examples' targets and its
loss come from nerkit.training.grow's `Growth`.

Under torchrun every rank runs the same steps (nerkit.training.distributed): each trains on its slice of the
global batch and DDP averages the gradients; rank 0 alone evaluates, logs and writes files.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from nerkit.config import Config
from nerkit.data.splits import Splits, read_splits
from nerkit.device import resolve_device, set_threads
from nerkit.errors import Interrupted, UserError, stop_signals_handled
from nerkit.features.batch import bucketed_batches, collate
from nerkit.features.featurizer import Example
from nerkit.files import CHECKPOINT, WRITE_ERRNOS
from nerkit.inference.model_dir import read_metrics, update_meta
from nerkit.inference.pipeline import Pipeline
from nerkit.inference.span_threshold import adopt_choice, choice_on_dev
from nerkit.log import progress_display
from nerkit.training.build import build_pipeline
from nerkit.training.checkpoint import (
    Progress,
    load_checkpoint,
    load_memory,
    rank_rng_state,
    save_checkpoint,
)
from nerkit.training.distributed import (
    World,
    resume_command,
    seed_rank,
)
from nerkit.training.distill import Distillation, UnlabelledBatch
from nerkit.training.grow import Growth
from nerkit.training.model_card import write_model_card
from nerkit.training.run_dir import check_run, prepare_output_dir, save_run_config
from nerkit.training.schedule import (
    lr_factor,
    make_optimizer,
    run_steps,
    warn_long_run_warmup,
    warn_long_warmup,
)
from nerkit.training.streams import Step, Streams, step_batch, step_chars

log = logging.getLogger(__name__)


WARMUP_BATCHES = 20  # a session's first batches, left out of the steady throughput


LIMITS = ("max_steps", "time_budget")  # the stops a resume that raises the limit continues


def train_step(model, batch, optimizer, scheduler=None, params: list = (), clip_norm: float = 0.0,
               clip_value: float = 0.0, weight: float = 1.0) -> float:
    """One optimiser step on one batch (`params`: the ones to clip); returns the batch's loss, times
    `weight` (a rank's share of a global batch, `World.slice`). The only place a model learns: the
    training loop, the benchmarks and the profiling scripts all call it. `model` may be a
    `distributed.Replica`, whose backward averages the gradients of all ranks before they are
    clipped."""
    return learn(model.loss(batch), optimizer, scheduler, params, clip_norm, clip_value, weight)


def learn(loss: torch.Tensor, optimizer, scheduler=None, params: list = (), clip_norm: float = 0.0,
          clip_value: float = 0.0, weight: float = 1.0) -> float:
    """`train_step`'s optimiser step, from a loss already computed (document streams compute theirs
    with the memory, `document_step`); returns the loss, times `weight`."""
    if weight != 1.0:
        loss = loss * weight
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if clip_norm:
        torch.nn.utils.clip_grad_norm_(params, clip_norm)
    if clip_value:
        torch.nn.utils.clip_grad_value_(params, clip_value)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return loss.item()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class StopRequest:
    """Set by SIGINT (Ctrl-C) or SIGTERM (`kill`, a batch scheduler's preemption) and read by the
    training loop, which stops where a checkpoint is consistent."""

    def __init__(self):
        self.requested = False
        self.signum = signal.SIGINT  # the signal that asked, for the exit code

    def on_signals(self):
        """While training runs (on the main thread: signals reach no other)."""
        return stop_signals_handled(self.handle)

    def handle(self, signum, frame) -> None:
        if self.requested:  # the second signal: stop now (the last checkpoint on disk is complete)
            raise KeyboardInterrupt
        self.requested, self.signum = True, signum


# ------------------------------------------------------------------------------ the steps


@dataclass
class Run:
    """A training run in progress: what `set_up` builds and the other steps share."""

    config: Config
    out: Path
    splits: Splits
    pipe: Pipeline
    examples: list[Example]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    progress: Progress
    best_state: dict | None  # rank 0's alone
    stop: StopRequest
    world: World
    learner: torch.nn.Module  # what `train_step` calls `loss` on: the model, or its distributed.Replica
    progress_bar: bool | None = None
    started: float = 0.0  # perf_counter at the run's start, earlier sessions included
    session_steps: int = 0
    params: list = field(default_factory=list)
    total_steps: int = 0  # the steps train.epochs and train.max_steps allow (a time budget may allow fewer)
    warned_warmup: bool = False  # whether a warm-up too long for the run has been reported
    # data.context: document: the training streams (then `examples` is empty), the memory the next
    # segment of each row reads (None at an epoch's start), and the featurised empty text a row
    # that has run out reads
    streams: Streams | None = None
    memory: list | None = None
    empty: Example | None = None
    distill: Distillation | None = None  # `nerkit distill`: the unlabelled text and its teachers' targets
    grow: Growth | None = None  # `nerkit train --from`: the model grown and its old types' targets
    # best_state's dev metrics when this session scored that very state (rank 0's): `finish` reports
    # them rather than score dev again; None after a resume, which restores a state it did not score
    best_dev: dict | None = None

    @cached_property
    def lengths(self) -> list[int]:
        return [len(e) for e in self.examples]

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def checkpoint(self) -> None:
        """Every rank calls it at the same step: rank 0 writes, with every rank's random state."""
        rank_states = self.world.gather(rank_rng_state(self.pipe.device))[1:]
        if self.world.main:
            self.progress.elapsed = self.elapsed()
            save_checkpoint(self.out, self.pipe.model, self.optimizer, self.scheduler, self.progress,
                            self.best_state, rank_states, memory=self.memory if self.progress.batch else None)


def set_up(config: Config, out: Path, force: bool, resume: bool, splits: Splits | None, stop: StopRequest,
           progress_bar: bool | None, world: World, distill: Distillation | None = None) -> Run:
    """Everything a run needs before its first step: a fresh output directory, or the state of the
    run in `out` restored from its checkpoint; with several processes, this rank in their group."""
    growth = Growth.start(config) if config.grow.source else None
    if growth is not None:
        config = growth.config  # the source model's architecture
    tc = config.train
    # before the data loads: a wrong path or a used --out costs no wait
    check_run(config, out, force, resume, world.size, writes=world.main)
    set_threads(tc.threads)
    device = world.join(resolve_device(tc.device, "train.device"), tc.dist_timeout)
    seed_everything(tc.seed)
    splits = splits if splits is not None else read_splits(config)
    if distill is not None and world.size > 1:
        raise UserError("nerkit distill trains on one process", fix="run it without torchrun")
    if growth is not None and distill is not None:
        raise UserError("a run either grows a model (grow.source) or distils one, not both",
                        fix="grow the model with nerkit train --from, then distil it")
    if growth is not None and world.size > 1:
        raise UserError("growing a model (grow.source) trains on one process", fix="run it without --nproc or torchrun")
    if growth is not None:
        pipe = growth.pipeline(splits, device)
    else:
        pipe = build_pipeline(config, splits, device, unlabelled=distill.units if distill else ())
    if distill is not None:
        distill.attach(pipe.featurizer)
    config = pipe.config  # the widths its vector files gave resolved
    world.check_same("the corpora and vocabularies", [splits.checksums, pipe.featurizer.sizes()], config.data.train)
    streams = document_streams(config, pipe, splits, world)
    if streams:
        examples = []
    elif growth is not None:
        examples = growth.examples(pipe, splits.train)
    else:
        examples = [pipe.featurizer.training_example(s) for s in splits.train]
    if streams is None:  # document streams run a frozen LM every step (its cache is per sentence)
        attach_lm_cache(config, pipe, splits, examples)
    n_params = sum(p.numel() for p in pipe.model.parameters())
    ranks = f" x {world.size} processes ({tc.batch_size // world.size} sentences each a step)" if world.size > 1 else ""
    # a CRF tags in a scheme; the span head scores spans of each type, with no tags at all
    labels = f"tags {splits.scheme.upper()} over" if pipe.head.has_tags else "spans of types"
    log.info(f"model: {config.encoder.name}, {n_params:,} parameters, {labels} {', '.join(pipe.types)}; "
             f"train {len(splits.train)} sentences, dev {len(splits.dev)}; device {device}{ranks}")
    optimizer = make_optimizer(config, pipe.model)
    gold_steps = streams.steps_per_epoch() if streams else math.ceil(len(examples) / tc.batch_size)
    steps_per_epoch, total_steps = run_steps(
        config, len(examples), gold_steps + (distill.steps_per_epoch(gold_steps) if distill else 0))
    warned = warn_long_run_warmup(config, steps_per_epoch, total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(config, step, steps_per_epoch, total_steps))
    run = Run(config, out, splits, pipe, examples, optimizer, scheduler,
              Progress(checksums={**splits.checksums, **(distill.checksums if distill else {}),
                                  **(growth.checksums if growth else {})},
                       world_size=world.size), None, stop, world, pipe.model,
              progress_bar, params=[p for p in pipe.model.parameters() if p.requires_grad],
              total_steps=total_steps, warned_warmup=warned, streams=streams,
              empty=pipe.featurizer.example([], []) if streams else None, distill=distill, grow=growth)
    if resume:
        _restore(run)
        if world.main:  # the run's config.yaml: this session's limits, and the widths its vector files gave
            save_run_config(out, config)
            pipe.write_meta(out)  # nerkit.json: a run begun before it held train_max_len gets it
    else:
        seed_rank(tc.seed, world.rank)
        if world.main:
            prepare_output_dir(out, force)
            pipe.write_static_files(out)
    run.learner = world.wrap(pipe.model)  # after the restore: DDP starts every rank from rank 0's weights
    run.started = time.perf_counter() - run.progress.elapsed
    return run


def document_streams(config: Config, pipe: Pipeline, splits: Splits, world: World) -> Streams | None:
    """With `data.context: document`, the training documents as streams of segments; else None."""
    if config.data.context != "document":
        return None
    if world.size > 1:
        raise UserError("data.context: document trains on one process: its streams carry each row's memory "
                        "from step to step, and the ranks do not share it", fix="train without --nproc or torchrun")
    streams = Streams.build(pipe.featurizer, splits.train, config.encoder.options.segment, config.train.batch_size)
    log.info(f"document context: {streams.segments:,} segments of at most {config.encoder.options.segment} "
             f"characters in {len(streams.parts):,} documents (or parts), read as {streams.rows} streams")
    return streams


def attach_lm_cache(config: Config, pipe: Pipeline, splits: Splits, examples: list[Example]) -> None:
    """A frozen language model runs once over the training text: its states are cached on disk
    (keyed by the LM's and the text's checksums) and each example carries its own, so that the
    epochs train the layers above it at their usual speed. Of stacked sources, each frozen one is
    cached on its own (in its own `cache`); the fine-tuned ones run every step."""
    lm = pipe.model.lm
    if lm is None or all(source.finetune for source in lm.sources):
        return
    from nerkit.pretrained.cache import cached_features

    texts = [s.tokens for s in splits.train]
    per_source = []  # each source's states of every training sentence, or None for a fine-tuned one
    for source, options in zip(lm.sources, config.embeddings.lm_sources()):
        if source.finetune:
            per_source.append(None)
            continue
        cache = options.cache or str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nerkit" / "lm")
        started = time.perf_counter()
        per_source.append(cached_features(source, texts, cache))
        log.info(f"frozen LM states of {len(examples):,} training sentences from {cache} "
                 f"({time.perf_counter() - started:.0f} s)")
    for i, example in enumerate(examples):
        example.lm_states = lm.example_states([states[i] if states is not None else None for states in per_source])


def _restore(run: Run) -> None:
    """The state of an interrupted, finished or limited run, and whether it goes on: a finished run
    given more epochs does, and so does one stopped by a step or time limit that the resume raised
    (or lifted), inside the epoch the limit cut, with that epoch's remaining batches."""
    tc, history, world = run.config.train, run.out / "metrics.jsonl", run.world
    progress, run.best_state = load_checkpoint(run.out, run.pipe.model, run.optimizer, run.scheduler,
                                               run.progress.checksums, world.rank)
    if world.rank >= progress.world_size:  # a rank the run did not have: its own random stream
        seed_rank(tc.seed, world.rank, progress.step)
    if progress.world_size != world.size:
        log.info(f"the run trained on {progress.world_size} process(es) so far, and goes on with {world.size}: "
                 f"the same global batches, other dropout draws")
        progress.world_size = world.size
    if not world.main:
        run.best_state = None  # rank 0 keeps the best model
    if progress.stopped == "epochs" and progress.epoch <= tc.epochs:
        progress.stopped = ""
    if progress.stopped == "max_steps" and (not tc.max_steps or progress.step < tc.max_steps):
        progress.stopped = ""
    if progress.stopped == "time_budget" and (not tc.time_budget or progress.elapsed < tc.time_budget):
        progress.stopped = ""
    run.progress = progress
    run.memory = load_memory(run.out, run.pipe.device) if progress.batch else None
    logged = progress.epochs_logged
    if progress.stopped:  # a run that only lacks its final model: a cut epoch's record stays
        run.best_state = adopt_cut_epoch(run)
        logged += progress.cut_dev_f1 >= 0
    progress.cut_dev_f1 = -1.0
    if world.main:
        lines = history.read_text(encoding="utf-8").splitlines(True) if history.exists() else []
        history.write_text("".join(lines[:logged]), encoding="utf-8")
    log.info(f"resuming {run.out} at epoch {progress.epoch}, batch {progress.batch} (step {progress.step})")


def adopt_cut_epoch(run: Run) -> dict | None:
    """The best state of a run that a limit stopped inside an epoch: the model where it stopped
    when its evaluation there beat the best full epoch."""
    progress = run.progress
    if progress.cut_dev_f1 <= progress.best_f1:
        return run.best_state
    progress.best_f1, progress.best_epoch = progress.cut_dev_f1, progress.epoch
    return {k: v.detach().clone() for k, v in run.pipe.model.state_dict().items()} if run.world.main else None


def run_epoch(run: Run, epoch: int) -> int:
    """The epoch's batches from where its progress stands, until they are done or a limit stops
    the run (`run.progress.stopped`); Ctrl-C writes a checkpoint and raises `Interrupted`. Returns the
    number of batches the epoch has. The batches are global: each rank trains on its slice of
    each, and after each step the ranks agree on the batch's loss and on whether to stop (Ctrl-C
    or the time budget on any of them), so that they all stop at the same step."""
    tc, progress, world = run.config.train, run.progress, run.world
    run.pipe.model.train()
    batches = epoch_batches(run, epoch)
    if not progress.batch:
        run.memory = None  # each epoch's streams start afresh
    bar = progress_display(f"epoch {epoch}", len(batches), "batch", initial=progress.batch,
                           shown=run.progress_bar if world.main else False)
    try:
        for item in batches[progress.batch:]:
            t0 = time.perf_counter()
            step = document_step if run.streams else distill_step if isinstance(item, UnlabelledBatch) else sentence_step
            loss, chars = step(run, item)
            late = bool(tc.time_budget) and run.elapsed() > tc.time_budget
            loss, stops, lates = world.sum([loss / world.size, run.stop.requested, late])
            seconds = time.perf_counter() - t0
            progress.step += 1
            progress.batch += 1
            run.session_steps += 1
            progress.epoch_loss += loss
            if isinstance(item, UnlabelledBatch):
                progress.epoch_distill_loss += loss
                progress.epoch_distill_batches += 1
            progress.epoch_chars += chars
            progress.epoch_seconds += seconds
            if run.session_steps > WARMUP_BATCHES:
                progress.steady_chars += chars
                progress.steady_seconds += seconds
            bar.update(1)
            bar.set_postfix(**{"loss": f"{loss:.3f}",
                               "chars/s": f"{progress.epoch_chars / max(progress.epoch_seconds, 1e-9):,.0f}"})
            if stops or (tc.checkpoint_every and progress.step % tc.checkpoint_every == 0):
                run.checkpoint()
            if stops:
                raise interrupted(run, f"training interrupted at epoch {epoch}, step {progress.step}")
            if tc.max_steps and progress.step >= tc.max_steps:
                progress.stopped = "max_steps"
                break
            if lates:
                progress.stopped = "time_budget"
                break
    finally:
        bar.close()
    return len(batches)


def epoch_batches(run: Run, epoch: int) -> list:
    """The epoch's batches, in the epoch's seeded order: lists of sentence indices, or with document
    streams the epoch's steps (`Streams.epoch`). A resume recomputes them from the seed."""
    rng = random.Random(run.config.train.seed * 1000 + epoch)
    if run.streams is not None:
        return run.streams.epoch(rng)
    gold = bucketed_batches(run.lengths, run.config.train.batch_size, rng)
    return run.distill.mix(gold, epoch, run.config.train.batch_size) if run.distill else gold


def sentence_step(run: Run, idx: list[int]) -> tuple[float, int]:
    """One step on the sentences `idx` of a global batch (this rank's slice of them); returns this
    rank's weighted loss and the global batch's characters."""
    tc = run.config.train
    mine, weight = run.world.slice(idx)
    batch = collate([run.examples[i] for i in mine]).to(run.pipe.device)
    if run.grow is not None:  # the new labels and the source model's targets (nerkit.training.grow)
        loss = learn(run.grow.loss(run.learner, batch), run.optimizer, run.scheduler, run.params, tc.clip_norm,
                     tc.clip_value, weight)
    else:
        loss = train_step(run.learner, batch, run.optimizer, run.scheduler, run.params, tc.clip_norm,
                          tc.clip_value, weight)
    return loss, sum(run.lengths[i] for i in idx)


def distill_step(run: Run, item: UnlabelledBatch) -> tuple[float, int]:
    """One step on unlabelled sequences: the distillation loss against the teachers' targets
    (nerkit.training.distill), times `distill.weight`. Returns the weighted loss and the characters."""
    tc = run.config.train
    loss, chars = run.distill.loss(run.pipe.model, item.indices, run.pipe.device)
    return learn(loss, run.optimizer, run.scheduler, run.params, tc.clip_norm, tc.clip_value,
                 run.distill.options.weight), chars


def document_step(run: Run, step: Step) -> tuple[float, int]:
    """One step on the next segment of every stream, read with the memory of the streams' segments
    before; the memory it leaves is the next step's. Returns the loss and the step's characters."""
    tc = run.config.train
    batch = step_batch(step, run.empty).to(run.pipe.device)
    loss, run.memory = run.pipe.model.segment_loss(batch, run.memory)
    return learn(loss, run.optimizer, run.scheduler, run.params, tc.clip_norm, tc.clip_value), step_chars(step)


def how_to_resume(out: Path, distill: Distillation | None) -> str:
    """The command that continues the run in `out`: a distillation continues as it started."""
    return "the same `nerkit distill` command with --resume" if distill is not None else resume_command(out)


def interrupted(run: Run, what: str) -> Interrupted:
    """The Interrupted of every rank: rank 0's message says how to go on, the others' is empty."""
    message = f"{what}; checkpoint saved. Continue with: {how_to_resume(run.out, run.distill)}" if run.world.main else ""
    return Interrupted(message, run.stop.signum)


def end_epoch(run: Run, epoch: int, n_batches: int) -> bool:
    """Evaluate on dev, log the epoch, keep the best and the last model, write the checkpoint.
    Returns whether the run is over. An epoch that a limit cut short is evaluated too (the stopped
    run's model may be that state) and logged as partial; its checkpoint stays inside the epoch
    with the best model as it was, so that a resume that lifts the limit continues as if uncut.
    Rank 0 evaluates and writes; the other ranks wait for its dev F1 and follow the same course."""
    tc, progress, pipe, main = run.config.train, run.progress, run.pipe, run.world.main
    partial = 0 < progress.batch < n_batches
    dev = log_epoch(run, epoch, n_batches, partial) if main else None
    dev_f1 = run.world.from_main(dev["f1"] if main else 0.0)
    if partial:  # the record is left out of epochs_logged: a resume that finishes the epoch drops it
        if main:
            pipe.save(run.out / "last", {"epoch": epoch, "dev": dev, "partial": True})
        progress.cut_dev_f1 = dev_f1  # progress.stopped: the limit that cut it
        run.checkpoint()
        best_before = run.best_state
        run.best_state = adopt_cut_epoch(run)
        if run.best_state is not best_before:  # the state `dev` scored
            run.best_dev = dev
        return True
    if dev_f1 > progress.best_f1:
        progress.best_f1, progress.best_epoch, progress.bad_epochs = dev_f1, epoch, 0
        if main:
            run.best_state = {k: v.detach().clone() for k, v in pipe.model.state_dict().items()}
            run.best_dev = dev
            pipe.write_weights(run.out, {"best_epoch": epoch, "dev": dev})
    else:
        progress.bad_epochs += 1
    if main:
        pipe.save(run.out / "last", {"epoch": epoch, "dev": dev})
    progress.train_chars += progress.epoch_chars
    progress.train_seconds += progress.epoch_seconds
    progress.epochs_logged += 1
    if tc.patience and progress.bad_epochs >= tc.patience:
        progress.stopped = "early_stopping"
        log.info(f"early stopping: no dev improvement for {tc.patience} epochs")
    if epoch == tc.epochs and not progress.stopped:
        progress.stopped = "epochs"
    finished = bool(progress.stopped)
    progress.epoch, progress.batch = epoch + 1, 0
    progress.epoch_loss, progress.epoch_chars, progress.epoch_seconds = 0.0, 0, 0.0
    progress.epoch_distill_loss, progress.epoch_distill_batches = 0.0, 0
    run.checkpoint()
    if not finished and run.world.sum([run.stop.requested])[0]:
        raise interrupted(run, f"training interrupted after epoch {epoch}, step {progress.step}")
    return finished


def evaluate(run: Run, sentences: list, name: str = "dev") -> dict:
    """The model's metrics on dev or test sentences (`name`), through the one evaluation path; a model
    trained in document context reads them as it trained, in order as a stream (`document`). A grown
    model's dev or test set that lacks some of its types is scored on those it carries."""
    document = run.config.data.context == "document"
    types = run.grow.scored_types.get(name) if run.grow is not None else None
    return run.pipe.evaluate(sentences, run.config.train.eval_batch_size, document=document, types=types)


def evaluate_dev(run: Run) -> dict:
    """The model's dev metrics; with `span.choose_threshold`, a span-head model's are those at the
    threshold chosen on dev as `nerkit calibrate` chooses it, with the choice (`span_threshold`)."""
    pipe, config = run.pipe, run.config
    if not pipe.head.has_threshold or not config.span.choose_threshold:
        return evaluate(run, run.splits.dev)
    choice = choice_on_dev(pipe, run.splits.dev, config.train.eval_batch_size)
    return {**evaluate(run, run.splits.dev), "span_threshold": choice}


def log_epoch(run: Run, epoch: int, n_batches: int, partial: bool) -> dict:
    """Rank 0's part of an epoch's end: the dev evaluation, its record in metrics.jsonl and its log
    line; returns the dev metrics."""
    tc, progress = run.config.train, run.progress
    dev = evaluate_dev(run)
    rates = run.scheduler.get_last_lr()  # the rest's, then a fine-tuned LM's own groups (make_optimizer)
    record = {"epoch": epoch, "step": progress.step, "loss": progress.epoch_loss / max(1, progress.batch),
              "lr": rates[0], **({"lm_lr": max(rates[1:])} if len(rates) > 1 else {}),
              "dev_precision": dev["precision"], "dev_recall": dev["recall"], "dev_f1": dev["f1"],
              "chars_per_s": progress.epoch_chars / max(progress.epoch_seconds, 1e-9), "elapsed_s": run.elapsed()}
    if run.distill is not None:  # the two losses apart: the gold likelihood's and the (weighted) distillation's
        gold_batches = progress.batch - progress.epoch_distill_batches
        record.update(gold_loss=(progress.epoch_loss - progress.epoch_distill_loss) / max(1, gold_batches),
                      distill_loss=progress.epoch_distill_loss / max(1, progress.epoch_distill_batches))
    chosen = dev.get("span_threshold")
    if chosen:  # the span head's dev F1 is at the threshold chosen on dev; the default's beside it
        record.update(dev_threshold=chosen["chosen"], dev_f1_at_default=chosen["f1_at_default"])
    if partial:
        record.update(partial=True, batches=progress.batch, of_batches=n_batches)
    with open(run.out / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    cut = f" ({progress.batch:,} of {n_batches:,} batches, {run.progress.stopped})" if partial else ""
    log.info(f"epoch {epoch}/{tc.epochs}{cut}  loss {record['loss']:.4f}  dev P {100 * dev['precision']:.2f} "
             f"R {100 * dev['recall']:.2f} F1 {100 * dev['f1']:.2f}{' *' if dev['f1'] > progress.best_f1 else ''}"
             + (f" (threshold {chosen['chosen']:g} chosen on dev; F1 {100 * chosen['f1_at_default']:.2f} at "
                f"span.threshold {run.config.span.threshold:g})" if chosen else "")
             + f"  {record['chars_per_s']:,.0f} chars/s  {record['elapsed_s']:.0f}s")
    if tc.time_budget and not run.warned_warmup:  # the steps the budget allows, at the pace so far
        affordable = int(progress.step * tc.time_budget / max(run.elapsed(), 1e-9))
        if affordable < run.total_steps:
            run.warned_warmup = warn_long_warmup(
                run.config, affordable, f"that train.time_budget = {tc.time_budget:g} s allows at this pace")
    return dev


def finish(run: Run, epoch: int) -> dict:
    """The best model's figures: dev (scored again unless this session scored that state: the
    evaluation is deterministic, and took as long as the epoch's), test once (reported, never used
    for selection). Rank 0's alone: the other ranks are done."""
    tc, progress, pipe, splits = run.config.train, run.progress, run.pipe, run.splits
    pipe.model.load_state_dict(run.best_state)
    dev = run.best_dev if run.best_dev is not None else evaluate_dev(run)
    if "span_threshold" in dev:  # the best epoch's threshold: test is scored at it, and the model predicts with it
        adopt_choice(pipe, dev["span_threshold"], run.out)
    metrics = {"best_epoch": progress.best_epoch, "epochs": min(epoch, tc.epochs), "steps": progress.step,
               "partial_epoch": progress.batch > 0,  # a limit stopped the run inside its last epoch
               "stopped": run.progress.stopped, "dev": dev,
               "train_chars_per_s": (progress.train_chars + progress.epoch_chars)
               / max(progress.train_seconds + progress.epoch_seconds, 1e-9),  # with a cut epoch's
               "train_chars_per_s_steady": progress.steady_chars / max(progress.steady_seconds, 1e-9),
               "train_steps_s": progress.train_seconds + progress.epoch_seconds,  # in the steps alone
               "elapsed_s": run.elapsed(), "parameters": sum(p.numel() for p in pipe.model.parameters()),
               "device": str(pipe.device), "processes": run.world.size, "data_sha256": splits.checksums}
    if splits.test is not None:
        metrics["test"] = evaluate(run, splits.test, "test")
        log.info(f"test (best dev epoch {progress.best_epoch}): P {100 * metrics['test']['precision']:.2f} "
                 f"R {100 * metrics['test']['recall']:.2f} F1 {100 * metrics['test']['f1']:.2f}")
    pipe.write_weights(run.out, metrics)
    if run.grow is not None:  # what it grew from
        update_meta(run.out, {"grown_from": run.grow.record})
    write_model_card(run.out, run.config, metrics, splits)
    log.info(f"model saved to {run.out}")
    if run.progress.stopped in LIMITS and (progress.batch > 0 or epoch < tc.epochs):  # epochs were left to train
        limit = getattr(tc, run.progress.stopped)
        log.warning(f"train.{run.progress.stopped} = {limit:g} stopped the run in epoch {min(epoch, tc.epochs)} of {tc.epochs}, "
                    f"step {progress.step:,}; continue with: {how_to_resume(run.out, run.distill)} "
                    f"--set train.{run.progress.stopped}={2 * limit:g}")
    return metrics


# ------------------------------------------------------------------------------ the loop


def train(config: Config, out: str | Path | None = None, force: bool = False, resume: bool = False,
          progress_bar: bool | None = None, splits: Splits | None = None,
          distill: Distillation | None = None) -> dict | None:
    """Train as the config says (or continue a run with `resume`); returns the final metrics,
    also written to OUT/metrics.json. `splits`: the config's corpora, when the caller has already
    read them with `read_splits(config)` (the benchmark scores dev and test again afterwards).
    `distill`: `nerkit distill`'s unlabelled text and targets (nerkit.tools.distill), trained on
    between the gold batches.

    Started by torchrun (WORLD_SIZE > 1), the process is one rank of a data-parallel run; rank 0
    returns the metrics, the others None.

    SIGINT or SIGTERM stops the run at the next step boundary, or after the epoch's evaluation,
    with a checkpoint and `Interrupted`; a second signal stops it at once. A write that fails for a reason
    the user can fix (a full disk, permissions) is a UserError; the last complete checkpoint stays.
    A rank that loses the others (one was killed, or silent past train.dist_timeout) ends with a
    JobError."""
    out = Path(out or config.output_dir)
    config = replace(config, output_dir=str(out))  # the caller's config stays as it is
    stop, world = StopRequest(), World.from_env()
    finished = False
    try:
        with stop.on_signals():
            run = set_up(config, out, force, resume, splits, stop, progress_bar, world, distill)
            progress = run.progress
            # A finished run only lacks its final model: its last epoch is the one before
            # progress.epoch, unless a limit cut that epoch short (then progress stayed inside it).
            epoch = progress.epoch - 1 if progress.stopped and not progress.batch else progress.epoch
            while epoch <= config.train.epochs and not progress.stopped:
                n_batches = run_epoch(run, epoch)
                if end_epoch(run, epoch, n_batches):
                    break
                epoch += 1
            metrics = finish(run, epoch) if world.main else None
            finished = True
            return metrics
    except OSError as e:
        if e.errno not in WRITE_ERRNOS:
            raise
        resumable = (out / CHECKPOINT / "state.json").is_file()
        then = f"then continue with: {how_to_resume(out, distill)}" if resumable else "or choose another --out"
        raise UserError(e.strerror, where=str(e.filename or out),
                        fix=f"free space or fix permissions there, {then}") from None
    except RuntimeError as e:
        lost = world.lost(e, config.train.dist_timeout, out)
        if lost is None:
            raise
        raise lost from None
    finally:
        world.leave(finished)


def train_or_continue(config: Config, out: Path, progress_bar: bool | None = False,
                      splits: Splits | None = None) -> dict | None:
    """A benchmark's or an audit's run in `out`: continued from the checkpoint a stopped run left
    there (its data and config checked as `--resume` checks them), else trained from the start,
    replacing what `out` holds. A stop mid-run then costs the epochs since its checkpoint, not the run.
    `splits` as for `train`."""
    resume = (out / CHECKPOINT / "state.json").is_file()
    return train(config, out=out, force=not resume, resume=resume, progress_bar=progress_bar, splits=splits)


def finished(out: Path) -> bool:
    """Whether the run in `out` has its final model: `finish` writes why it stopped into metrics.json,
    where a run stopped midway has only its best epoch's dev scores (and its weights)."""
    try:
        return "stopped" in read_metrics(out)
    except (OSError, ValueError):
        return False
