"""The optimiser (SGD or Adam, with the language model's own parameter group) and the learning-rate
schedule (linear warm-up, then constant, inverse-time decay or linear decay), and the warning when a
warm-up takes too much of the run."""

from __future__ import annotations

import logging
import math

import torch

from nerkit.config import Config
from nerkit.training.eager_adam import eager_class

log = logging.getLogger(__name__)

# A learning-rate warm-up this share of a run's steps or more keeps most of the run below train.lr.
LONG_WARMUP = 0.5


def make_optimizer(config: Config, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The optimiser of the model's trainable parameters; a fine-tuned language model's own
    learning rate (`embeddings.lm.lr`; each stacked source's own) makes its parameters a group of
    their own, after the group of the rest, and its `layer_decay` below 1 a group per depth (the
    embeddings first, at lr * decay ** top_depth, up to the top layer at lr)."""
    tc = config.train
    params = [p for p in model.parameters() if p.requires_grad]
    own_rates = []  # (parameter ids, their rate), in the sources' order
    for source, weights, options in zip(model.lm_sources(), model.lm_parameters(), config.embeddings.lm_sources()):
        rate = options.lr or tc.lr
        if options.layer_decay < 1 and options.finetune:
            depths = source.parameter_depths()
            top = max(depth for _, depth in depths)
            for level in sorted({depth for _, depth in depths}):
                own_rates.append(({id(p) for p, depth in depths if depth == level}, rate * options.layer_decay ** (top - level)))
        elif options.lr:
            own_rates.append(({id(p) for p in weights}, options.lr))
    claimed = set().union(*(ids for ids, _ in own_rates))
    groups = [{"params": [p for p in params if id(p) not in claimed]}]
    groups += [{"params": [p for p in params if id(p) in ids], "lr": lr} for ids, lr in own_rates]
    if tc.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=tc.lr, momentum=tc.momentum, weight_decay=tc.weight_decay)
    # The fused kernels update every parameter in one pass: on CPU they make a BiLSTM step ~20%
    # faster, the dense bigram table being most of the parameters.
    fused = all(p.dtype in (torch.float32, torch.float64) and p.device.type in ("cpu", "cuda") for p in params)
    # torch's class called without its compiler guards, which import torch._dynamo (~1 s) and do nothing here
    cls = eager_class(torch.optim.Adam if tc.optimizer == "adam" else torch.optim.AdamW)
    return cls(groups, lr=tc.lr, weight_decay=tc.weight_decay, fused=fused)


def warmup_steps(config: Config, total_steps: int) -> int:
    """The warm-up in steps: `train.warmup` as a fraction of the run's `total_steps` (below 1) or as
    steps, or the older `train.warmup_steps`."""
    tc = config.train
    if tc.warmup_steps:
        return tc.warmup_steps
    if tc.warmup >= 1:
        return int(tc.warmup)
    return round(tc.warmup * total_steps)


def lr_factor(config: Config, step: int, steps_per_epoch: int, total_steps: int) -> float:
    """Warm-up, then constant, linear decay to 0, or inverse-time decay lr / (1 + decay * epoch)."""
    tc, warmup = config.train, warmup_steps(config, total_steps)
    if warmup and step < warmup:
        return (step + 1) / warmup
    if tc.schedule == "linear":
        span = max(1, total_steps - warmup)
        return max(0.0, 1.0 - (step - warmup) / span)
    if tc.schedule == "inverse_time":
        return 1.0 / (1.0 + tc.decay * (step // max(1, steps_per_epoch)))
    return 1.0


def run_steps(config: Config, examples: int, steps_per_epoch: int = 0) -> tuple[int, int]:
    """(steps per epoch, total steps) of a run over `examples` training sentences: train.epochs of
    ceil(examples / train.batch_size) batches, or of `steps_per_epoch` when the caller knows them
    (document streams), at most train.max_steps."""
    tc = config.train
    steps_per_epoch = steps_per_epoch or math.ceil(examples / tc.batch_size)
    total_steps = steps_per_epoch * tc.epochs
    return steps_per_epoch, min(total_steps, tc.max_steps) if tc.max_steps else total_steps


def warn_long_run_warmup(config: Config, steps_per_epoch: int, total_steps: int) -> bool:
    """`warn_long_warmup` for the steps `run_steps` gave, saying what limits them; whether it warned."""
    tc = config.train
    return warn_long_warmup(config, total_steps, "that train.max_steps allows" if total_steps == tc.max_steps
                            else f"that {tc.epochs:,} epochs of {steps_per_epoch:,} batches make")


def warn_long_warmup(config: Config, steps: int, what: str) -> bool:
    """Warn when the warm-up is LONG_WARMUP or more of the `steps` the run will take (`what` says
    where that count comes from); returns whether it warned."""
    warmup = warmup_steps(config, steps)
    if not warmup or warmup < LONG_WARMUP * steps:
        return False
    key = "train.warmup_steps" if config.train.warmup_steps else "train.warmup"
    reached = "never reaches train.lr" if warmup >= steps else f"reaches train.lr only at step {warmup:,}"
    log.warning(f"{key} = {warmup:,} is {warmup / max(steps, 1):.0%} of the {steps:,} steps {what}: "
                f"the learning rate {reached}; make it a tenth of the run's steps, whatever their number "
                f"(--set train.warmup=0.1)")
    return True
