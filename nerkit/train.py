"""The training loop: data preparation, optimiser and schedule, per-epoch dev evaluation, best and
last models, early stopping, `metrics.jsonl`, and the final test figures (computed once, never
used for selection)."""

from __future__ import annotations

import json
import math
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nerkit.config import Config
from nerkit.corpus import Sentence, read_corpus, split_sentence
from nerkit.errors import UserError
from nerkit.features import bucketed_batches, collate
from nerkit.pipeline import Pipeline, resolve_device, seeded_dev_split


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Data:
    train: list[Sentence]
    dev: list[Sentence]
    test: list[Sentence] | None
    types: list[str]
    scheme: str


def prepare_data(config: Config) -> Data:
    dc = config.data
    if not dc.train:
        raise UserError("data.train is not set", fix="name the training file in the config's data section")
    train_corpus = read_corpus(dc.train, repair=dc.repair)
    if train_corpus.repaired:
        log(f"{dc.train}: repaired {train_corpus.repaired} tags in {train_corpus.invalid_transitions} invalid transitions")
    train = train_corpus.sentences
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
    return Data(pieces, dev, test, types, scheme)


def make_optimizer(config: Config, params) -> torch.optim.Optimizer:
    tc = config.train
    params = [p for p in params if p.requires_grad]
    if tc.optimizer == "sgd":
        return torch.optim.SGD(params, lr=tc.lr, momentum=tc.momentum, weight_decay=tc.weight_decay)
    if tc.optimizer == "adam":
        return torch.optim.Adam(params, lr=tc.lr, weight_decay=tc.weight_decay)
    return torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay)


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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def prepare_output_dir(out: Path, force: bool) -> None:
    if out.exists() and any(out.iterdir()):
        if not force:
            raise UserError("the output directory is not empty", where=str(out),
                            fix="choose another --out, or pass --force to replace it")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def train(config: Config, out: str | Path | None = None, force: bool = False, progress: bool | None = None) -> dict:
    """Train a model as the config says; returns the final metrics (also in OUT/metrics.json)."""
    tc = config.train
    out = Path(out or config.output_dir)
    config.output_dir = str(out)
    if tc.threads:
        torch.set_num_threads(tc.threads)
    device = resolve_device(tc.device)
    seed_everything(tc.seed)
    data = prepare_data(config)
    pipe = Pipeline.from_training_data(config, data.train, data.types, data.scheme, device=device, log=log)
    examples = pipe.training_examples(data.train)
    n_params = sum(p.numel() for p in pipe.model.parameters())
    log(f"model: {config.encoder.name}, {n_params:,} parameters, tags {data.scheme.upper()} over "
        f"{', '.join(data.types)}; train {len(examples)} sentences, dev {len(data.dev)}; device {device}")
    prepare_output_dir(out, force)
    pipe.write_static_files(out)

    optimizer = make_optimizer(config, pipe.model.parameters())
    lengths = [len(e) for e in examples]
    steps_per_epoch = math.ceil(len(examples) / tc.batch_size)
    total_steps = steps_per_epoch * tc.epochs
    if tc.max_steps:
        total_steps = min(total_steps, tc.max_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(config, step, steps_per_epoch, total_steps))
    params = [p for p in pipe.model.parameters() if p.requires_grad]

    best_f1, best_epoch, bad_epochs, step = -1.0, 0, 0, 0
    best_state = None
    train_chars, train_seconds = 0, 0.0
    started = time.perf_counter()
    stopped = "epochs"
    history_path = out / "metrics.jsonl"
    from tqdm import tqdm

    for epoch in range(1, tc.epochs + 1):
        pipe.model.train()
        batches = bucketed_batches(lengths, tc.batch_size, random.Random(tc.seed * 1000 + epoch))
        bar = tqdm(batches, desc=f"epoch {epoch}", unit="batch", leave=False, file=sys.stderr,
                   disable=(not sys.stderr.isatty()) if progress is None else not progress, dynamic_ncols=True)
        epoch_loss, epoch_batches, epoch_chars, epoch_seconds = 0.0, 0, 0, 0.0
        for idx in bar:
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
            step += 1
            seconds = time.perf_counter() - t0
            chars = sum(lengths[i] for i in idx)
            epoch_loss += loss.item()
            epoch_batches += 1
            epoch_chars += chars
            epoch_seconds += seconds
            bar.set_postfix(loss=f"{loss.item():.3f}", chars_s=f"{epoch_chars / max(epoch_seconds, 1e-9):,.0f}")
            if (tc.max_steps and step >= tc.max_steps) or (tc.time_budget and time.perf_counter() - started > tc.time_budget):
                stopped = "max_steps" if tc.max_steps and step >= tc.max_steps else "time_budget"
                break
        bar.close()
        train_chars += epoch_chars
        train_seconds += epoch_seconds
        dev_metrics, _ = pipe.evaluate_sentences(data.dev, tc.eval_batch_size)
        record = {"epoch": epoch, "step": step, "loss": epoch_loss / max(1, epoch_batches),
                  "lr": scheduler.get_last_lr()[0],
                  "dev_precision": dev_metrics["precision"], "dev_recall": dev_metrics["recall"],
                  "dev_f1": dev_metrics["f1"], "chars_per_s": epoch_chars / max(epoch_seconds, 1e-9),
                  "elapsed_s": time.perf_counter() - started}
        with open(history_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        improved = dev_metrics["f1"] > best_f1
        log(f"epoch {epoch}/{tc.epochs}  loss {record['loss']:.4f}  dev P {100 * dev_metrics['precision']:.2f} "
            f"R {100 * dev_metrics['recall']:.2f} F1 {100 * dev_metrics['f1']:.2f}{' *' if improved else ''}  "
            f"{record['chars_per_s']:,.0f} chars/s  {record['elapsed_s']:.0f}s")
        if improved:
            best_f1, best_epoch, bad_epochs = dev_metrics["f1"], epoch, 0
            best_state = {k: v.detach().clone() for k, v in pipe.model.state_dict().items()}
            pipe.write_weights(out, {"best_epoch": epoch, "dev": dev_metrics})
        else:
            bad_epochs += 1
        pipe.save(out / "last", {"epoch": epoch, "dev": dev_metrics})
        if stopped != "epochs":
            break
        if tc.patience and bad_epochs >= tc.patience:
            stopped = "early_stopping"
            log(f"early stopping: no dev improvement for {tc.patience} epochs")
            break

    pipe.model.load_state_dict(best_state)
    metrics = {"best_epoch": best_epoch, "epochs": epoch, "steps": step, "stopped": stopped,
               "dev": pipe.evaluate_sentences(data.dev, tc.eval_batch_size)[0],
               "train_chars_per_s": train_chars / max(train_seconds, 1e-9),
               "elapsed_s": time.perf_counter() - started, "parameters": n_params, "device": str(device)}
    if data.test is not None:
        metrics["test"] = pipe.evaluate_sentences(data.test, tc.eval_batch_size)[0]
        log(f"test (best dev epoch {best_epoch}): P {100 * metrics['test']['precision']:.2f} "
            f"R {100 * metrics['test']['recall']:.2f} F1 {100 * metrics['test']['f1']:.2f}")
    pipe.write_weights(out, metrics)
    log(f"model saved to {out}")
    return metrics
