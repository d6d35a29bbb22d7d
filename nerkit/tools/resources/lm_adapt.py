"""`nerkit lm adapt`: continued masked-language-model training of a local encoder on unlabelled text
(domain- or task-adaptive pretraining, Gururangan et al. 2020), the recipe for a domain with few
labels: adapt the encoder to the domain's raw text, then train the tagger on it as usual.

A model without an MLM head (a plain encoder, as `make lm` writes) gets a fresh one. Masking is
BERT's (15% of the tokens: 80% [MASK], 10% a random token, 10% kept), by token or, with
`whole_word`, by jieba's words (every token of a chosen word is masked together). XLNet has no
masked-LM form: it trains on its own objective, permutation language modelling, with the same choice
of targets: no token may see a target's content (`perm_mask`), each target is predicted by the
query stream from the rest (`target_mapping`), the input keeps its tokens; this is the orders of
XLNet's objective in which the targets come last and none sees another (its partial prediction).
A share of the lines is held out and its perplexity (exp of the mean masked-token loss, with a fixed masking)
measured before and after, in float32 whatever the training's precision (`bf16`: the training
steps under bf16 autocast, about 1.7 times as fast a step of m3e-small on a CPU with AVX512-BF16,
as the features' `embeddings.lm.bf16`). The run is time-boxed and resumable: it writes nerkit's checkpoint
(safetensors + JSON) every `checkpoint_every` steps and on a limit, and `resume` continues it
exactly. The result is an ordinary Hugging Face directory (config.json, model.safetensors, the
tokenizer's files), read by `embeddings.lm.path`.

`exclude` takes out every line that overlaps an evaluation set (nerkit.data.overlap), before the
held-out split: a labelled corpus file, or a config, whose dev and test sets (MSRA's dev carved from
train as training carves it) are excluded; the counts go into the result.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from nerkit.data.overlap import MIN_CHARS, remove_overlaps
from nerkit.data.records import read_text, text_lines
from nerkit.device import set_threads
from nerkit.errors import UserError
from nerkit.files import CHECKPOINT, atomic_write_bytes, atomic_write_text, check_input, check_output_directory
from nerkit.log import progress_display
from nerkit.pretrained.hub_cache import lm_directory
from nerkit.pretrained.subword import token_positions
from nerkit.pretrained.vocab import FETCH_FIX
from nerkit.training.checkpoint import Progress, load_checkpoint, save_checkpoint

log = logging.getLogger(__name__)

RESULT = "adapt.json"  # what the run measured, beside the model


@dataclass
class AdaptOptions:
    steps: int = 1000  # optimiser steps in all (a resume may raise it)
    batch_size: int = 16
    lr: float = 5e-5
    mask_prob: float = 0.15
    whole_word: bool = False  # mask jieba's words whole
    max_len: int = 128  # tokens per line (longer lines are cut)
    held_out: float = 0.05  # share of the lines kept for the perplexity
    time_budget: float = 0.0  # seconds (0: none)
    checkpoint_every: int = 200
    seed: int = 0
    bf16: bool = False  # the training steps under bf16 autocast (the perplexity stays float32)


def read_lines(paths: list[str | Path]) -> list[str]:
    lines = []
    for path in paths:
        check_input(str(path), "--text", "no such file")
        lines += [line.strip() for line in text_lines(read_text(path))]
    if len(lines) < 2:
        raise UserError("fewer than two non-empty lines of text", where=str(paths[0]),
                        fix="give the unlabelled text of your domain, one passage a line")
    return lines


def exclusion_sets(paths: list[str | Path]) -> dict[str, list[str]]:
    """The sentences to keep out of the text, by set: a config (.yaml/.yml) gives its run's dev and
    test sets, as `nerkit train` would read them; any other path is a labelled corpus."""
    from nerkit.config import load_config
    from nerkit.data.corpus import read_corpus
    from nerkit.data.splits import read_splits

    sets = {}
    for path in map(str, paths):
        if path.endswith((".yaml", ".yml")):
            splits = read_splits(load_config(path))
            sets[f"{path} dev"] = [s.text for s in splits.dev]
            if splits.test:
                sets[f"{path} test"] = [s.text for s in splits.test]
        else:
            check_input(path, "--exclude", "no such file")
            sets[path] = [s.text for s in read_corpus(path, repair=True).sentences]
    return sets


def without_overlaps(lines: list[str], exclude: list[str | Path], first_text: str | Path):
    """`lines` less those that overlap the sets of `exclude`, and a report per set (logged)."""
    if not exclude:
        return lines, []
    lines, reports = remove_overlaps(lines, exclusion_sets(exclude))
    for report in reports:
        log.info(f"{report.name}: {report.found:,} of its {report.sentences:,} sentences are in the text; "
                 f"{report.lines_removed:,} overlapping lines taken out")
    if len(lines) < 2:
        raise UserError("fewer than two lines of text are left once the lines overlapping --exclude are out",
                        where=str(first_text), fix="give more text, or check that --exclude names the right sets")
    return lines, reports


def dry_run(lm: str | Path, texts: list[str | Path], exclude: list[str | Path], options: AdaptOptions) -> dict:
    """What `adapt` would train on, without loading a model or writing anything (`nerkit lm adapt
    --dry-run`): the text's lines, those left once the lines overlapping `exclude` are out, how many
    of them would be held out, and each excluded set's `OverlapReport`."""
    lm_directory(lm, "--lm", FETCH_FIX)  # a wrong --lm is found now, not after a dry run looked right
    lines = read_lines(texts)
    kept, reports = remove_overlaps(lines, exclusion_sets(exclude)) if exclude else (lines, [])
    held = len(split_held_out(kept, options.held_out, options.seed)[1]) if len(kept) >= 2 else 0
    return {"texts": [str(t) for t in texts], "lines": len(lines), "kept": len(kept), "held_out": held,
            "min_chars": MIN_CHARS, "excluded": [r.to_dict() for r in reports]}


def format_dry_run(found: dict) -> str:
    """`dry_run` as people read it: the lines, a Markdown table of the excluded sets, what would train."""
    out = [f"text: {', '.join(found['texts'])}: {found['lines']:,} non-empty lines, {found['kept']:,} left once the "
           f"lines overlapping --exclude are out (sentences and lines under {found['min_chars']} characters are not "
           "compared)"]
    if found["excluded"]:
        out += ["", "| set | sentences compared | of them in the text | lines taken out |", "|---|---:|---:|---:|"]
        out += [f"| {r['set']} | {r['sentences']:,} | {r['found_in_text']:,} "
                f"({100 * r['found_in_text'] / max(1, r['sentences']):.1f}%) | {r['lines_removed']:,} |"
                for r in found["excluded"]]
    if found["kept"] < 2:
        out += ["", "a run would stop here: fewer than two lines are left"]
    else:
        out += ["", f"a run would train on {found['kept'] - found['held_out']:,} lines and hold out "
                    f"{found['held_out']:,} for the perplexity"]
    return "\n".join(out)


def split_held_out(lines: list[str], share: float, seed: int) -> tuple[list[str], list[str]]:
    order = list(range(len(lines)))
    random.Random(seed).shuffle(order)
    count = max(1, round(share * len(lines)))
    held = set(order[:count])
    return [s for i, s in enumerate(lines) if i not in held], [s for i, s in enumerate(lines) if i in held]


def load_mlm(directory: Path):
    """The tokenizer, a masked-LM model of a local directory (XLNet's LM head for an XLNet), and
    whether its head is fresh (the directory has none, or part of one)."""
    from nerkit.pretrained.bert import _transformers

    transformers = _transformers()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        config = transformers.AutoConfig.from_pretrained(str(directory), local_files_only=True)
        head = transformers.XLNetLMHeadModel if permutation_lm(config) else transformers.AutoModelForMaskedLM
        model, loading = head.from_pretrained(str(directory), local_files_only=True, output_loading_info=True)
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"cannot read it as a masked language model ({str(e).splitlines()[0]})", where=str(directory),
                        fix="give a local Hugging Face encoder directory (config.json, weights, tokenizer files)") from None
    if tokenizer.mask_token_id is None:
        raise UserError("its tokenizer has no mask token", where=str(directory), fix="use an encoder trained with MLM")
    return tokenizer, model, bool(loading["missing_keys"])


def permutation_lm(config) -> bool:
    """Whether the model trains by permutation language modelling (XLNet) rather than masking."""
    return getattr(config, "model_type", "") == "xlnet"


def word_ids(tokenizer, text: str, offsets: list[tuple[int, int]], whole_word: bool) -> list[int]:
    """A group id per token: tokens of one group are masked together (one per token, or per jieba word)."""
    if not whole_word:
        return list(range(len(offsets)))
    import jieba

    word_of = [0] * len(text)
    start = 0
    for k, word in enumerate(jieba.cut(text)):
        word_of[start:start + len(word)] = [k] * len(word)
        start += len(word)
    return [word_of[s] if s < len(text) else -1 - t for t, (s, _) in enumerate(offsets)]


def model_inputs(model, tokenizer, lines: list[str], options: AdaptOptions, rng: random.Random) -> dict:
    """The keyword arguments of one training or perplexity step: a masked batch, or for XLNet the
    same targets as permutation-LM inputs."""
    permutation = permutation_lm(model.config)
    input_ids, attention, labels = masked_batch(tokenizer, lines, options, rng, replace_targets=not permutation)
    if not permutation:
        return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}
    targets = labels != -100  # (B, T)
    count = int(targets.sum(1).max())  # predictions per row, padded with -100
    batch, length = input_ids.shape
    target_mapping = torch.zeros(batch, count, length)  # (B, P, T): one target position a row
    target_labels = torch.full((batch, count), -100, dtype=torch.long)
    for b in range(batch):
        positions = targets[b].nonzero().flatten()
        target_mapping[b, torch.arange(len(positions)), positions] = 1.0
        target_labels[b, :len(positions)] = labels[b, positions]
    perm_mask = targets[:, None, :].expand(batch, length, length).float()  # (B, T, T): nobody sees a target
    return {"input_ids": input_ids, "attention_mask": attention, "perm_mask": perm_mask,
            "target_mapping": target_mapping, "labels": target_labels}


def mlm_loss(model, inputs: dict) -> torch.Tensor:
    """The step's loss: the mean cross-entropy over the predicted tokens, as the model's own `loss`
    is. A masked LM whose head is one module beside its encoder (BERT's `cls`, RoBERTa's `lm_head`)
    runs the head on the predicted positions only: about one token in seven, where the vocabulary-
    sized output layer was half of a step's arithmetic. Any other model (XLNet) computes its own."""
    heads = [module for name, module in model.named_children() if name != model.base_model_prefix]
    if permutation_lm(model.config) or len(heads) != 1 or model.base_model is model:
        return model(**inputs).loss
    labels = inputs["labels"]
    states = model.base_model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])[0]  # (B, T, H)
    targets = labels != -100
    logits = heads[0](states[targets])  # (N, V): the N predicted tokens
    return torch.nn.functional.cross_entropy(logits.float(), labels[targets])


def masked_batch(tokenizer, lines: list[str], options: AdaptOptions, rng: random.Random, replace_targets: bool = True):
    """input_ids, attention_mask, labels (-100 where nothing is predicted) for a batch of lines; with
    `replace_targets` (BERT's masking, not XLNet's) the targets' inputs are replaced as BERT does."""
    encoded = tokenizer(lines, truncation=True, max_length=options.max_len, padding=True,
                        return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="pt")
    input_ids = encoded["input_ids"].clone()
    labels = torch.full_like(input_ids, -100)
    vocab = len(tokenizer)
    for b, line in enumerate(lines):
        real = [t for t, special in enumerate(encoded["special_tokens_mask"][b].tolist())
                if not special and encoded["attention_mask"][b, t]]
        groups = word_ids(tokenizer, line, [tuple(encoded["offset_mapping"][b, t].tolist()) for t in real],
                          options.whole_word)
        chosen = {g for g in set(groups) if rng.random() < options.mask_prob}
        if not chosen and real:
            chosen = {groups[rng.randrange(len(groups))]}  # at least one prediction a line
        for t, g in zip(real, groups):
            if g not in chosen:
                continue
            labels[b, t] = input_ids[b, t]
            roll = rng.random()
            if not replace_targets:
                continue
            if roll < 0.8:
                input_ids[b, t] = tokenizer.mask_token_id
            elif roll < 0.9:
                input_ids[b, t] = rng.randrange(vocab)
    return input_ids, encoded["attention_mask"], labels


@torch.no_grad()
def perplexity(model, tokenizer, lines: list[str], options: AdaptOptions) -> float:
    """exp(mean loss over masked tokens) with a fixed masking (seeded), comparable across runs."""
    rng = random.Random(options.seed + 1)
    total, count = 0.0, 0
    model.eval()
    for start in range(0, len(lines), options.batch_size):
        inputs = model_inputs(model, tokenizer, lines[start:start + options.batch_size], options, rng)
        n = int((inputs["labels"] != -100).sum())
        total, count = total + float(mlm_loss(model, inputs)) * n, count + n
    return math.exp(total / max(count, 1))


def adapt(lm: str | Path, texts: list[str | Path], out: str | Path, options: AdaptOptions = AdaptOptions(),
          resume: bool = False, progress_bar: bool | None = None, exclude: list[str | Path] = (),
          force: bool = False, threads: int | None = None) -> dict:
    """Adapt the encoder in `lm` to `texts` less the lines that overlap the sets of `exclude`, writing a
    Hugging Face directory to `out`; returns what was measured (also written to OUT/adapt.json). A
    non-empty `out` is continued with `resume`, or started over with `force` if an earlier
    adaptation wrote it. `threads`: torch's (nerkit.device.set_threads; None: as they are)."""
    if threads is not None:
        set_threads(threads)
    out, lm = Path(out), lm_directory(lm, "--lm", FETCH_FIX)
    if not resume:
        check_output_directory(out, force, own=is_adapt_dir, inputs=[lm, *texts, *exclude],
                               what="an earlier adaptation (or --resume it)")
    lines, excluded = without_overlaps(read_lines(texts), exclude, texts[0])
    train_lines, held = split_held_out(lines, options.held_out, options.seed)
    torch.manual_seed(options.seed)
    tokenizer, model, fresh = load_mlm(lm)
    positions = token_positions(model.config)
    if positions:
        options = replace(options, max_len=min(options.max_len, positions))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=options.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / max(1, options.steps)))
    checksums = {"text": hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()}  # a resume reads the same text
    progress = Progress(checksums=checksums)
    if resume:
        progress, _ = load_checkpoint(out, model, optimizer, scheduler, checksums)
        before = json.loads((out / CHECKPOINT / "before.json").read_text())["perplexity"]  # measured by the first run
    else:
        before = perplexity(model, tokenizer, held, options)
        if out.is_dir() and force:  # an earlier adaptation, as check_output_directory made sure
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        random.seed(options.seed)
    # A fresh head's perplexity says how untrained the head is, not how well the encoder knows the text.
    head = "; the model has no MLM head, so a fresh one, and that figure is the untrained head's" if fresh else ""
    log.info(f"{len(train_lines):,} lines to train on, {len(held):,} held out (perplexity {before:.2f}{head}); "
             f"steps {progress.step:,} to {options.steps:,}")
    rng = random.Random()
    started = time.perf_counter() - progress.elapsed
    stopped = "steps"
    bar = progress_display("lm adapt", options.steps, "step", initial=progress.step, shown=progress_bar)
    model.train()
    while progress.step < options.steps:
        rng.seed(options.seed * 1_000_003 + progress.step)  # the batch a step draws, the same on a resume
        batch = rng.sample(train_lines, min(options.batch_size, len(train_lines)))
        inputs = model_inputs(model, tokenizer, batch, options, rng)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=options.bf16):
            loss = mlm_loss(model, inputs)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        progress.step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        late = bool(options.time_budget) and time.perf_counter() - started > options.time_budget
        if late or progress.step % options.checkpoint_every == 0 or progress.step == options.steps:
            progress.elapsed = time.perf_counter() - started
            save_checkpoint(out, model, optimizer, scheduler, progress, None)
            atomic_write_text(out / CHECKPOINT / "before.json", json.dumps({"perplexity": before}))
        if late:
            stopped = "time_budget"
            break
    bar.close()
    after = perplexity(model, tokenizer, held, options)
    write_model(model, tokenizer, out)
    result = {"lm": str(lm), "steps": progress.step, "stopped": stopped, "lines": len(train_lines),
              "held_out_lines": len(held), "perplexity_before": round(before, 4), "perplexity_after": round(after, 4),
              "fresh_head": fresh,
              "seconds": round(time.perf_counter() - started, 1), "whole_word": options.whole_word, "bf16": options.bf16,
              "excluded": [report.to_dict() for report in excluded]}
    atomic_write_text(out / RESULT, json.dumps(result, indent=2) + "\n")
    log.info(f"held-out perplexity {before:.2f} -> {after:.2f} after {progress.step:,} steps; wrote {out}")
    if stopped == "time_budget":
        log.warning(f"the time budget stopped the run at step {progress.step:,} of {options.steps:,}; "
                    f"continue with: nerkit lm adapt ... --out {out} --resume")
    return result


def is_adapt_dir(directory: Path) -> bool:
    """Whether `directory` was written by `nerkit lm adapt` (its result or its checkpoint)."""
    return (directory / RESULT).is_file() or (directory / CHECKPOINT).is_dir()


def write_model(model, tokenizer, out: Path) -> None:
    """The adapted model as a Hugging Face directory (`save_pretrained`'s files: safetensors, tied
    weights once), each file moved into `out` atomically."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        for path in Path(tmp).iterdir():
            atomic_write_bytes(out / path.name, path.read_bytes())
