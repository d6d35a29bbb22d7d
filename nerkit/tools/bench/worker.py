"""The benchmark worker, one process per run (`python -m nerkit.tools.bench.worker SPEC`, started by
`nerkit bench`): trains through the same `train()` as `nerkit train` (a student with teachers:
through the same `distill()` as `nerkit distill`), then scores dev and test through the one
evaluation path and times prediction; the figures go to OUT/bench.json."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import yaml

from nerkit.config import load_config
from nerkit.ending import end_process
from nerkit.errors import Interrupted, UserError
from nerkit.files import atomic_write_text
from nerkit.inference.model_dir import read_metrics
from nerkit.pretrained.hub_cache import lm_directory
from nerkit.pretrained.vocab import FETCH_FIX
from nerkit.tools.bench.runner import WORKER_RESULT


def config_sha256(config) -> str:
    """sha256 of the resolved config YAML, output directory left out (it names the run, not the setting)."""
    from nerkit.config import config_to_dict

    resolved = config_to_dict(config)
    resolved.pop("output_dir")
    return hashlib.sha256(yaml.safe_dump(resolved, sort_keys=False, allow_unicode=True).encode("utf-8")).hexdigest()


def pretrained_inputs(config) -> dict:
    """The vector files and language model a run used, each with its sha256 (an LM's: its weights
    file's), so that a record says exactly what went in."""
    from nerkit.data.stats import sha256_file

    emb, found = config.embeddings, {}
    for kind in ("char", "bichar", "word"):
        path = getattr(emb, f"{kind}_vectors")
        if path:
            found[f"{kind}_vectors"] = {"path": path, "sha256": sha256_file(path)}
    sources = []
    for lm in emb.lm_sources():
        directory = lm_directory(lm.path, "embeddings.lm.path", FETCH_FIX)
        weights = [p for p in (directory / "model.safetensors", directory / "pytorch_model.bin") if p.is_file()]
        sources.append({"path": lm.path, "finetune": lm.finetune, "layers": lm.layers, "bf16": lm.bf16,
                        "sha256": sha256_file(weights[0]) if weights else None})
    if sources:  # one language model as before; stacked sources as a list, in their order
        found["lm"] = sources if isinstance(emb.lm, list) else sources[0]
    return found


def lexicon_of(config, pipe, splits) -> dict:
    """A lattice model's lexicon for its record (`lexicon`: source, file sha256, words and their
    sha256, coverage of dev and test: nerkit.tools.resources.lexicon.lexicon_record), as the saved model holds
    it; {} for a model without one."""
    lexicon = pipe.featurizer.lexicon
    if lexicon is None:
        return {}
    from nerkit.tools.resources.lexicon import lexicon_record

    return {"lexicon": lexicon_record(lexicon, config.lexicon.source, {"dev": splits.dev, "test": splits.test},
                                      config.data.normalize)}


def span_threshold_of(pipe, out: str, splits, batch_size: int) -> dict:
    """A span-head model's threshold chosen on its dev split as `nerkit calibrate` chooses it, kept
    in its nerkit.json (so dev and test are then scored at it, and the saved model predicts with it),
    with the test set's scores at the threshold it had before, shown beside and never used to choose;
    {} for a CRF model."""
    if not pipe.head.has_threshold:
        return {}
    from nerkit.inference.model_dir import update_meta
    from nerkit.inference.span_threshold import choose_threshold, span_meta

    default = None, None  # the head's own scores at span.threshold (training chose one already: the same again)
    pipe.span_threshold, pipe.span_score_map = default
    chosen = choose_threshold(pipe, splits.dev, "the dev split", batch_size)
    if splits.test is not None:
        fitted = pipe.span_threshold, pipe.span_score_map
        pipe.span_threshold, pipe.span_score_map = default
        test = pipe.evaluate(splits.test, batch_size)
        chosen["test_before"] = {"threshold": pipe.threshold, **{k: test[k] for k in ("precision", "recall", "f1")}}
        pipe.span_threshold, pipe.span_score_map = fitted
    update_meta(Path(out), span_meta(chosen))
    return {"span_threshold": chosen}


def train_processes(config_path: str, overrides: list[str], out: str, resume: bool, nproc: int) -> dict:
    """Train as `nerkit train --nproc N` does (torchrun starting N processes of `python -m nerkit
    train`); rank 0's metrics.json."""
    from nerkit.training.distributed import launch

    command = ["--quiet", "train"] + (["--resume", out] if resume else ["--config", config_path, "--out", out, "--force"])
    for override in overrides:
        command += ["--set", override]
    code = launch(nproc, command, out)
    if code:
        raise UserError(f"training on {nproc} processes ended with exit code {code} (its error is above)")
    return read_metrics(out)


def write_train_text(splits, path: Path) -> Path:
    """The training split's sentences as text, one a line (as `nerkit data convert --to text`): what a
    student with `train_text: true` reads. The split as `read_splits` gives it, so never a dev
    sentence carved from the training file, nor a test one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(s.text + "\n" for s in splits.train))
    return path


def distilled(config, splits, out: str, resume: bool, teachers: list[str], texts: list[str],
              train_text: str | None) -> dict:
    """Train a student as `nerkit distill` does: its metrics, with its `distilled_from` record."""
    from nerkit.tools.distill import distill

    paths = [Path(t) for t in texts] + ([write_train_text(splits, Path(train_text))] if train_text else [])
    metrics = distill(config, [Path(t) for t in teachers], paths, Path(out), force=not resume, resume=resume,
                      progress_bar=False, splits=splits)
    return {**metrics, "distilled_from": metrics.pop("distillation")}


def measure(config_path: str, overrides: list[str], out: str, predict_batch_size: int, resume: bool = False,
            nproc: int = 1, teachers: list[str] = (), texts: list[str] = (), train_text: str | None = None) -> dict:
    """Train one run through `train()` (from its checkpoint in `out` with `resume`; on `nproc`
    processes through torchrun; a student of `teachers` through `distill()` on `texts` and, where
    `train_text` names a file to write, its training text), then load the saved model, score dev and
    test once through the one evaluation path, whose prediction time is the record's speed (a span
    head's threshold chosen on dev first: `span_threshold_of`). Returns
    the figures of a results.jsonl record."""
    import resource

    import torch

    from nerkit.data.splits import read_splits
    from nerkit.inference.pipeline import Pipeline
    from nerkit.training.loop import train

    config = load_config(config_path, overrides)
    digest = config_sha256(config)
    splits = read_splits(config)  # read once: training selects on its dev split, and it is scored below
    if teachers:
        metrics = distilled(config, splits, out, resume, list(teachers), list(texts), train_text)
    elif nproc > 1:
        metrics = train_processes(config_path, overrides, out, resume, nproc)
    else:
        metrics = train(config, out=out, force=not resume, resume=resume, progress_bar=False, splits=splits)
    pipe = Pipeline.load(out, device=metrics["device"])
    threshold = span_threshold_of(pipe, out, splits, config.train.eval_batch_size)
    dev = pipe.evaluate(splits.dev, config.train.eval_batch_size)
    timed = splits.test if splits.test is not None else splits.dev
    pipe.predict_tokens([s.tokens for s in timed[:predict_batch_size]], predict_batch_size)  # warm-up
    timing = pipe.predict_and_score(timed, predict_batch_size, trim=False)  # as `nerkit predict` batches text
    on_gpu = pipe.device.type == "cuda"
    emb = config.embeddings
    student = {"distilled_from": metrics["distilled_from"]} if teachers else {}
    return {
        **student, **lexicon_of(config, pipe, splits), **threshold,
        "encoder": config.encoder.name, "config_sha256": digest, "data_sha256": metrics["data_sha256"],
        "test": timing.metrics if splits.test is not None else None, "dev": dev, "epochs": metrics["epochs"],
        "best_epoch": metrics["best_epoch"], "steps": metrics["steps"], "stopped": metrics["stopped"],
        "partial_epoch": metrics["partial_epoch"], "parameters": metrics["parameters"],
        "processes": metrics.get("processes", 1),
        "train_chars_per_s": metrics["train_chars_per_s"],
        "train_chars_per_s_steady": metrics["train_chars_per_s_steady"], "train_s": metrics["elapsed_s"],
        "train_steps_s": metrics["train_steps_s"], "predict_s": timing.seconds,
        "predict_chars_per_s": sum(map(len, timed)) / max(timing.seconds, 1e-9),
        "predict_on": "dev" if splits.test is None else "test", "predict_batch_size": predict_batch_size,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
        "peak_cuda_mib": torch.cuda.max_memory_allocated() / 2**20 if on_gpu else None,
        "pretrained": bool(emb.char_vectors or emb.bichar_vectors or emb.word_vectors or emb.lm_sources()),
        "pretrained_inputs": pretrained_inputs(config),
        "device": str(pipe.device), "gpu": torch.cuda.get_device_name() if on_gpu else None,
        "torch_version": torch.__version__, "torch_threads": torch.get_num_threads(),
    }


def worker_main(argv: list[str]) -> int:
    """`python -m nerkit.tools.bench.worker SPEC`: SPEC is JSON with config, overrides, out, predict_batch_size
    and resume; the figures go to OUT/bench.json, the log and errors to stderr."""
    if len(argv) != 1:
        print("usage: python -m nerkit.tools.bench.worker SPEC_JSON (started by `nerkit bench`)", file=sys.stderr)
        return 2
    from nerkit.log import configure_logging

    configure_logging()
    spec = json.loads(argv[0])
    try:
        result = measure(spec["config"], spec["overrides"], spec["out"], spec["predict_batch_size"],
                         spec.get("resume", False), spec.get("nproc", 1), spec.get("teachers") or [],
                         spec.get("texts") or [], spec.get("train_text"))
    except UserError as e:
        print(f"nerkit: error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:  # SIGINT or SIGTERM: the run's checkpoint is saved; say so without a traceback
        print(f"nerkit: {e}", file=sys.stderr)
        return e.exit_code
    # the variables of the matrix's env: as this process has them (after nerkit's own choices, e.g.
    # OMP_WAIT_POLICY where the matrix unset it: nerkit/cores.py)
    result["env_seen"] = {name: os.environ.get(name) for name in spec.get("env", [])}
    atomic_write_text(Path(spec["out"]) / WORKER_RESULT, json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":  # its wall time is the benchmark's: no interpreter teardown (nerkit.ending)
    end_process(worker_main(sys.argv[1:]))
