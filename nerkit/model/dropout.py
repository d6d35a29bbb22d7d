"""Dropout whose CPU mask is cheaper to draw: uniform numbers compared with the keep probability.

torch's CPU dropout draws its mask with `bernoulli_`, one generator call per element and serial:
4-5 ms for a BiLSTM step's (32, 48, 400) output, ~12% of a training step on one thread. `rand_like`
draws the same distribution (an element is kept with probability 1 - p, to float resolution) 3x
faster, its mask scaled in place; the gradient is the same product with the mask. The random
numbers are other ones, so a run's figures differ from the `bernoulli_` stream's, not its
distribution (docs/notebook/speed.md, session 43). Other devices keep torch's fused kernel; outside
training (and in an export, which runs in eval mode) it is the identity, as nn.Dropout is.
"""

from __future__ import annotations

import torch
from torch import nn


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`nn.functional.dropout(x, p, training)`, the CPU mask drawn by `rand_like`."""
    if not training or p == 0.0 or x.device.type != "cpu" or not 0.0 < p < 1.0:
        return nn.functional.dropout(x, p, training)  # identity, another device, or p = 1 (zeros)
    keep = 1.0 - p
    return x * torch.rand_like(x).lt_(keep).mul_(1.0 / keep)


class Dropout(nn.Dropout):
    """nn.Dropout (same `p`, no state) with `dropout`'s CPU mask."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
