"""The training loop: data preparation, optimiser and schedule, per-epoch dev evaluation, best and
last models, early stopping, `metrics.jsonl`, resumable checkpoints, and the final test figures
(computed once at the end, never used for selection)."""

from __future__ import annotations

import json
import math
import random
import shutil
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from nerkit.config import RESUMABLE_KEYS, Config, load_config
from nerkit.corpus import Sentence, read_corpus, sha256_file, split_sentence
from nerkit.errors import UserError
from nerkit.features import bucketed_batches, collate
from nerkit.files import CHECKPOINT, WRITE_ERRNOS, atomic_directory, recover_directory
from nerkit.pipeline import Pipeline, resolve_device, seeded_dev_split, set_threads

WARMUP_BATCHES = 20


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Interrupted(Exception):
    """Training stopped by SIGINT after a checkpoint was written."""


@dataclass
class Data:
    train: list[Sentence]
    dev: list[Sentence]
    test: list[Sentence] | None
    types: list[str]
    scheme: str
    checksums: dict


def prepare_data(config: Config) -> Data:
    dc = config.data
    if not dc.train:
        raise UserError("data.train is not set", fix="name the training file in the config's data section")
    train_corpus = read_corpus(dc.train, repair=dc.repair)
    if train_corpus.repaired:
        log(f"{dc.train}: repaired {train_corpus.repaired} tags in {train_corpus.invalid_transitions} invalid transitions")
    train = [s for s in train_corpus.sentences if len(s)]  # an empty JSON-lines text has nothing to learn
    if dc.limit:
        train = train[: dc.limit]
    if dc.dev:
        dev = read_corpus(dc.dev, repair=dc.repair).sentences
    else:
        if dc.dev_split <= 0:
            raise UserError("no dev data: data.dev is not set and data.dev_split is 0",
                            fix="set data.dev, or data.dev_split (e.g. 0.05) to carve a dev set from train")
        train, dev = seeded_dev_split(train, dc.dev_split, dc.split_seed)
        log(f"dev: {len(dev)} sentences carved from {dc.train} (seed {dc.split_seed}, {dc.dev_split:.0%})")
    test = read_corpus(dc.test, repair=dc.repair).sentences if dc.test else None
    pieces = [p for s in train for p in split_sentence(s, dc.max_len)]
    if len(pieces) != len(train):
        log(f"train: {len(train)} sentences split into {len(pieces)} pieces of at most {dc.max_len} characters")
    types = sorted({sp.type for s in train for sp in s.spans()})
    scheme = train_corpus.scheme if dc.scheme == "auto" else dc.scheme
    if not types:
        raise UserError("the training data has no entities", where=dc.train)
    checksums = {name: sha256_file(path) for name, path in (("train", dc.train), ("dev", dc.dev), ("test", dc.test)) if path}
    return Data(pieces, dev, test, types, scheme, checksums)


def make_optimizer(config: Config, params) -> torch.optim.Optimizer:
    tc = config.train
    params = [p for p in params if p.requires_grad]
    if tc.optimizer == "sgd":
        return torch.optim.SGD(params, lr=tc.lr, momentum=tc.momentum, weight_decay=tc.weight_decay)
    # The fused kernels update every parameter in one pass: on CPU they make a BiLSTM step ~20%
    # faster, the dense bigram table being most of the parameters.
    fused = all(p.dtype in (torch.float32, torch.float64) and p.device.type in ("cpu", "cuda") for p in params)
    cls = torch.optim.Adam if tc.optimizer == "adam" else torch.optim.AdamW
    return cls(params, lr=tc.lr, weight_decay=tc.weight_decay, fused=fused)


def lr_factor(config: Config, step: int, steps_per_epoch: int, total_steps: int) -> float:
    """Warm-up, then constant, linear decay to 0, or inverse-time decay lr / (1 + decay * epoch)."""
    tc = config.train
    if tc.warmup_steps and step < tc.warmup_steps:
        return (step + 1) / tc.warmup_steps
    if tc.schedule == "linear":
        span = max(1, total_steps - tc.warmup_steps)
        return max(0.0, 1.0 - (step - tc.warmup_steps) / span)
    if tc.schedule == "inverse_time":
        return 1.0 / (1.0 + tc.decay * (step // max(1, steps_per_epoch)))
    return 1.0


def adopt_cut_epoch(pipe: Pipeline, progress: Progress, best_state: dict | None) -> dict | None:
    """The best state of a run that a limit stopped inside an epoch: the model where it stopped
    when its evaluation there beat the best full epoch."""
    if progress.cut_dev_f1 <= progress.best_f1:
        return best_state
    progress.best_f1, progress.best_epoch = progress.cut_dev_f1, progress.epoch
    return {k: v.detach().clone() for k, v in pipe.model.state_dict().items()}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Progress:
    """Where a run stands: everything besides tensors that a checkpoint must restore."""

    epoch: int = 1  # the epoch in progress
    batch: int = 0  # batches of this epoch already done (the sampler position)
    step: int = 0
    best_f1: float = -1.0
    best_epoch: int = 0
    bad_epochs: int = 0
    epoch_loss: float = 0.0
    epoch_chars: int = 0
    epoch_seconds: float = 0.0
    train_chars: int = 0
    train_seconds: float = 0.0
    steady_chars: int = 0  # after the first WARMUP_BATCHES of a session: allocator and caches settled
    steady_seconds: float = 0.0
    elapsed: float = 0.0  # wall seconds of earlier sessions of this run
    epochs_logged: int = 0  # lines of metrics.jsonl that belong to this state
    stopped: str = ""  # why the run ended, once it has: only the final model is left to write
    cut_dev_f1: float = -1.0  # dev F1 of the model where a limit cut the epoch short (-1: none)
    checksums: dict = field(default_factory=dict)


def _rng_state() -> tuple[dict, dict]:
    np_state = np.random.get_state()
    tensors = {"rng.torch": torch.get_rng_state(), "rng.numpy": torch.from_numpy(np_state[1].astype(np.int64))}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    meta = {"python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
            "numpy": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])]}
    return tensors, meta


def _set_rng_state(tensors: dict, meta: dict) -> None:
    version, internal, gauss = meta["python"]
    random.setstate((version, tuple(internal), gauss))
    name, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((name, tensors["rng.numpy"].numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["rng.torch"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def save_checkpoint(out: Path, pipe: Pipeline, optimizer, scheduler, progress: Progress, best_state: dict | None) -> None:
    """Everything needed to continue exactly, in safetensors + JSON, written as one atomic directory."""
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in pipe.model.state_dict().items()}
    if best_state is not None:
        tensors.update({f"best.{k}": v.detach().cpu().contiguous() for k, v in best_state.items()})
    opt = optimizer.state_dict()
    opt_meta = {}
    for idx, state in opt["state"].items():
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{idx}.{name}"] = value.detach().cpu().contiguous()
            else:
                opt_meta[f"{idx}.{name}"] = value
    rng_tensors, rng_meta = _rng_state()
    tensors.update(rng_tensors)
    meta = {"progress": asdict(progress), "optimizer": {"param_groups": opt["param_groups"], "other": opt_meta},
            "scheduler": scheduler.state_dict(), "rng": rng_meta}
    with atomic_directory(out / CHECKPOINT) as tmp:
        (tmp / "state.safetensors").write_bytes(safetensors_bytes(tensors))
        (tmp / "state.json").write_text(json.dumps(meta), encoding="utf-8")


def load_checkpoint(out: Path, pipe: Pipeline, optimizer, scheduler, checksums: dict) -> tuple[Progress, dict | None]:
    """Restore the model, optimiser, scheduler and random state of the run in `out`; `checksums`:
    the data files' now, which must be the ones the run started with."""
    directory = out / CHECKPOINT
    recover_directory(directory)
    if not (directory / "state.json").is_file() or not (directory / "state.safetensors").is_file():
        raise UserError("no checkpoint to resume from", where=str(directory),
                        fix="a run writes its checkpoint at the first epoch end or train.checkpoint_every steps")
    try:
        meta = json.loads((directory / "state.json").read_text(encoding="utf-8"))
        tensors = load_file(str(directory / "state.safetensors"))
    except Exception as e:  # a damaged file: json or safetensors errors
        raise UserError(f"the checkpoint cannot be read ({e})", where=str(directory)) from None
    # Checked before the weights are loaded: other data builds other vocabularies, i.e. other shapes.
    started_with = meta["progress"].get("checksums", {})
    changed = [k for k, v in checksums.items() if started_with.get(k) not in (None, v)]
    if changed:
        raise UserError(f"the {', '.join(changed)} data changed since the run started", where=str(out),
                        fix="resume with the same data files, or start a new run")
    try:
        pipe.model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    except RuntimeError as e:  # shapes or names that do not fit: not this model's checkpoint
        raise UserError(f"the checkpoint does not fit the model this config builds ({str(e).splitlines()[0]})",
                        where=str(directory), fix="resume with the config and data the run started with") from None
    best = {k[5:]: v for k, v in tensors.items() if k.startswith("best.")} or None
    state: dict = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = value
    for key, value in meta["optimizer"]["other"].items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["optimizer"]["param_groups"]})
    scheduler.load_state_dict(meta["scheduler"])
    _set_rng_state(tensors, meta["rng"])
    return Progress(**meta["progress"]), best


def prepare_output_dir(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise UserError("the output path is a file", where=str(out), fix="choose a directory for --out")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise UserError("the output directory is not empty", where=str(out),
                            fix="choose another --out, resume with --resume, or pass --force to replace it")
        shutil.rmtree(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the output directory ({e.strerror})", where=str(out)) from None


def resume_config(out: str | Path, overrides: list[str] = ()) -> Config:
    """The resolved config saved with a run, for `nerkit train --resume DIR [--set train.epochs=N]`."""
    path = Path(out) / "config.yaml"
    if not path.is_file():
        raise UserError("not a training run directory (no config.yaml)", where=str(out),
                        fix="pass the --out directory of an interrupted `nerkit train`")
    for text in overrides:
        key = text.split("=", 1)[0].strip()
        if key not in RESUMABLE_KEYS:
            raise UserError(f"--set {key} cannot change when resuming", where=str(path),
                            fix=f"a resumed run may change only {', '.join(sorted(RESUMABLE_KEYS))}")
    config = load_config(path, overrides)
    if overrides:
        from nerkit.config import config_to_yaml
        from nerkit.files import atomic_write_text

        atomic_write_text(path, config_to_yaml(config))  # the model directory keeps explaining itself
    return config


def train(config: Config, out: str | Path | None = None, force: bool = False, resume: bool = False,
          progress_bar: bool | None = None, stop_after_steps: int = 0, data: Data | None = None) -> dict:
    """Train as the config says (or continue a run with `resume`); returns the final metrics,
    also written to OUT/metrics.json. `data`: the config's corpora, when the caller has already read
    them with `prepare_data(config)` (the benchmark scores dev and test again afterwards).

    SIGINT stops the run at the next step boundary, or after the epoch's evaluation, with a
    checkpoint and `Interrupted`; a second SIGINT stops it at once. `stop_after_steps` (tests) acts
    as SIGINT after that many steps of this session. A write that fails for a reason the user can
    fix (a full disk, permissions) is a UserError; the last complete checkpoint stays as it was."""
    out = Path(out or config.output_dir)
    config.output_dir = str(out)
    stop = StopRequest()
    try:
        with stop.on_sigint():
            return _train(config, out, force, resume, progress_bar, stop_after_steps, stop, data)
    except OSError as e:
        if e.errno not in WRITE_ERRNOS:
            raise
        resumable = (out / CHECKPOINT / "state.json").is_file()
        then = f"then continue with: nerkit train --resume {out}" if resumable else "or choose another --out"
        raise UserError(e.strerror, where=str(e.filename or out),
                        fix=f"free space or fix permissions there, {then}") from None


class StopRequest:
    """Set by SIGINT and read by the training loop, which stops where a checkpoint is consistent."""

    def __init__(self):
        self.requested = False

    @contextmanager
    def on_sigint(self):
        if threading.current_thread() is not threading.main_thread():  # signals reach only the main thread
            yield
            return

        def handler(signum, frame):
            if self.requested:  # the second Ctrl-C: stop now (the last checkpoint on disk is complete)
                raise KeyboardInterrupt
            self.requested = True

        previous = signal.signal(signal.SIGINT, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def _train(config: Config, out: Path, force: bool, resume: bool, progress_bar: bool | None, stop_after_steps: int,
           stop: StopRequest, data: Data | None) -> dict:
    tc = config.train
    set_threads(tc.threads)
    device = resolve_device(tc.device)
    seed_everything(tc.seed)
    data = data if data is not None else prepare_data(config)
    pipe = Pipeline.from_training_data(config, data.train, data.types, data.scheme, device=device, log=log)
    examples = pipe.training_examples(data.train)
    n_params = sum(p.numel() for p in pipe.model.parameters())
    log(f"model: {config.encoder.name}, {n_params:,} parameters, tags {data.scheme.upper()} over "
        f"{', '.join(data.types)}; train {len(examples)} sentences, dev {len(data.dev)}; device {device}")

    optimizer = make_optimizer(config, pipe.model.parameters())
    lengths = [len(e) for e in examples]
    steps_per_epoch = math.ceil(len(examples) / tc.batch_size)
    total_steps = steps_per_epoch * tc.epochs
    if tc.max_steps:
        total_steps = min(total_steps, tc.max_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(config, step, steps_per_epoch, total_steps))
    params = [p for p in pipe.model.parameters() if p.requires_grad]
    history_path = out / "metrics.jsonl"

    if resume:
        progress, best_state = load_checkpoint(out, pipe, optimizer, scheduler, data.checksums)
        if progress.stopped == "epochs" and progress.epoch <= tc.epochs:
            progress.stopped = ""  # a finished run given more epochs (--resume DIR --set train.epochs=N)
        # A run stopped by a step or time limit that the resume raised (or lifted) goes on where the
        # limit cut it: inside an epoch, with that epoch's remaining batches.
        if progress.stopped == "max_steps" and (not tc.max_steps or progress.step < tc.max_steps):
            progress.stopped = ""
        if progress.stopped == "time_budget" and (not tc.time_budget or progress.elapsed < tc.time_budget):
            progress.stopped = ""
        logged = progress.epochs_logged
        if progress.stopped:  # a run that only lacks its final model: a cut epoch's record stays
            best_state = adopt_cut_epoch(pipe, progress, best_state)
            logged += progress.cut_dev_f1 >= 0
        progress.cut_dev_f1 = -1.0
        lines = history_path.read_text(encoding="utf-8").splitlines(True) if history_path.exists() else []
        history_path.write_text("".join(lines[:logged]), encoding="utf-8")
        log(f"resuming {out} at epoch {progress.epoch}, batch {progress.batch} (step {progress.step})")
    else:
        prepare_output_dir(out, force)
        pipe.write_static_files(out)
        progress, best_state = Progress(checksums=data.checksums), None

    from tqdm import tqdm

    started = time.perf_counter() - progress.elapsed
    stopped = progress.stopped or "epochs"
    session_steps = 0
    # A finished run only lacks its final model: its last epoch is the one before progress.epoch,
    # unless a limit cut that epoch short (then progress stayed inside it).
    epoch = progress.epoch - 1 if progress.stopped and not progress.batch else progress.epoch
    while epoch <= tc.epochs and not progress.stopped:
        pipe.model.train()
        batches = bucketed_batches(lengths, tc.batch_size, random.Random(tc.seed * 1000 + epoch))
        bar = tqdm(total=len(batches), initial=progress.batch, desc=f"epoch {epoch}", unit="batch", leave=False,
                   file=sys.stderr, dynamic_ncols=True,
                   disable=(not sys.stderr.isatty()) if progress_bar is None else not progress_bar)
        for idx in batches[progress.batch:]:
            t0 = time.perf_counter()
            batch = collate([examples[i] for i in idx]).to(device)
            loss = pipe.model.loss(batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if tc.clip_norm:
                torch.nn.utils.clip_grad_norm_(params, tc.clip_norm)
            if tc.clip_value:
                torch.nn.utils.clip_grad_value_(params, tc.clip_value)
            optimizer.step()
            scheduler.step()
            progress.step += 1
            progress.batch += 1
            session_steps += 1
            progress.epoch_loss += loss.item()
            chars, seconds = sum(lengths[i] for i in idx), time.perf_counter() - t0
            progress.epoch_chars += chars
            progress.epoch_seconds += seconds
            if session_steps > WARMUP_BATCHES:
                progress.steady_chars += chars
                progress.steady_seconds += seconds
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}",
                            chars_s=f"{progress.epoch_chars / max(progress.epoch_seconds, 1e-9):,.0f}")
            if stop_after_steps and session_steps >= stop_after_steps:
                stop.requested = True
            if stop.requested or (tc.checkpoint_every and progress.step % tc.checkpoint_every == 0):
                progress.elapsed = time.perf_counter() - started
                save_checkpoint(out, pipe, optimizer, scheduler, progress, best_state)
            if stop.requested:
                bar.close()
                raise Interrupted(f"training interrupted at epoch {epoch}, step {progress.step}; checkpoint saved. "
                                  f"Continue with: nerkit train --resume {out}")
            if tc.max_steps and progress.step >= tc.max_steps:
                stopped = "max_steps"
                break
            if tc.time_budget and time.perf_counter() - started > tc.time_budget:
                stopped = "time_budget"
                break
        bar.close()
        # A limit that stopped the run inside the epoch: it is evaluated (the stopped run's model may be
        # this state), logged as partial, and a resume finishes it, exactly as if it had not been cut.
        partial = 0 < progress.batch < len(batches)

        dev_metrics, _ = pipe.evaluate_sentences(data.dev, tc.eval_batch_size)
        n_batches = max(1, progress.batch)
        record = {"epoch": epoch, "step": progress.step, "loss": progress.epoch_loss / n_batches,
                  "lr": scheduler.get_last_lr()[0],
                  "dev_precision": dev_metrics["precision"], "dev_recall": dev_metrics["recall"],
                  "dev_f1": dev_metrics["f1"], "chars_per_s": progress.epoch_chars / max(progress.epoch_seconds, 1e-9),
                  "elapsed_s": time.perf_counter() - started}
        if partial:
            record.update(partial=True, batches=progress.batch, of_batches=len(batches))
        with open(history_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        improved = dev_metrics["f1"] > progress.best_f1
        cut = f" ({progress.batch:,} of {len(batches):,} batches, {stopped})" if partial else ""
        log(f"epoch {epoch}/{tc.epochs}{cut}  loss {record['loss']:.4f}  dev P {100 * dev_metrics['precision']:.2f} "
            f"R {100 * dev_metrics['recall']:.2f} F1 {100 * dev_metrics['f1']:.2f}{' *' if improved else ''}  "
            f"{record['chars_per_s']:,.0f} chars/s  {record['elapsed_s']:.0f}s")
        if partial:
            # The checkpoint stays inside the epoch with the best model as it was before this
            # evaluation, so that a resume that lifts the limit continues the uncut run (and drops this
            # record: epochs_logged leaves it out); its F1 is kept for a resume that only finishes.
            pipe.save(out / "last", {"epoch": epoch, "dev": dev_metrics, "partial": True})
            progress.stopped, progress.cut_dev_f1 = stopped, dev_metrics["f1"]
            progress.elapsed = time.perf_counter() - started
            save_checkpoint(out, pipe, optimizer, scheduler, progress, best_state)
            best_state = adopt_cut_epoch(pipe, progress, best_state)
            break
        if improved:
            progress.best_f1, progress.best_epoch, progress.bad_epochs = dev_metrics["f1"], epoch, 0
            best_state = {k: v.detach().clone() for k, v in pipe.model.state_dict().items()}
            pipe.write_weights(out, {"best_epoch": epoch, "dev": dev_metrics})
        else:
            progress.bad_epochs += 1
        pipe.save(out / "last", {"epoch": epoch, "dev": dev_metrics})
        progress.train_chars += progress.epoch_chars
        progress.train_seconds += progress.epoch_seconds
        progress.epochs_logged += 1
        early = tc.patience and progress.bad_epochs >= tc.patience
        if early:
            stopped = "early_stopping"
            log(f"early stopping: no dev improvement for {tc.patience} epochs")
        finished = stopped != "epochs" or epoch == tc.epochs
        progress.epoch, progress.batch = epoch + 1, 0
        progress.stopped = stopped if finished else ""
        progress.epoch_loss, progress.epoch_chars, progress.epoch_seconds = 0.0, 0, 0.0
        progress.elapsed = time.perf_counter() - started
        save_checkpoint(out, pipe, optimizer, scheduler, progress, best_state)
        if finished:
            break
        if stop.requested:
            raise Interrupted(f"training interrupted after epoch {epoch}, step {progress.step}; checkpoint saved. "
                              f"Continue with: nerkit train --resume {out}")
        epoch += 1

    pipe.model.load_state_dict(best_state)
    metrics = {"best_epoch": progress.best_epoch, "epochs": min(epoch, tc.epochs), "steps": progress.step,
               "partial_epoch": progress.batch > 0,  # a limit stopped the run inside its last epoch
               "stopped": stopped, "dev": pipe.evaluate_sentences(data.dev, tc.eval_batch_size)[0],
               "train_chars_per_s": (progress.train_chars + progress.epoch_chars)
               / max(progress.train_seconds + progress.epoch_seconds, 1e-9),  # with a cut epoch's
               "train_chars_per_s_steady": progress.steady_chars / max(progress.steady_seconds, 1e-9),
               "elapsed_s": time.perf_counter() - started, "parameters": n_params, "device": str(device),
               "data_sha256": data.checksums}
    if data.test is not None:
        metrics["test"] = pipe.evaluate_sentences(data.test, tc.eval_batch_size)[0]
        log(f"test (best dev epoch {progress.best_epoch}): P {100 * metrics['test']['precision']:.2f} "
            f"R {100 * metrics['test']['recall']:.2f} F1 {100 * metrics['test']['f1']:.2f}")
    pipe.write_weights(out, metrics)
    log(f"model saved to {out}")
    return metrics
