"""nerkit.model.dropout: the CPU mask drawn from `rand_like` (cheaper than torch's `bernoulli_`), with
nn.Dropout's distribution, scaling and gradient; the identity outside training, zeros at p = 1."""

from __future__ import annotations

import torch

from nerkit.model.dropout import Dropout, dropout


def test_the_cpu_mask_is_uniforms_below_the_keep_probability():
    x = torch.randn(8, 30, 50, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(5)
    y = Dropout(0.3).train()(x)
    torch.manual_seed(5)
    kept = torch.rand_like(x) < 0.7  # the stream the mask comes from (torch's own draws bernoulli_)
    mask = kept.double() * (1 / 0.7)
    assert torch.equal(y, x * mask)
    y.sum().backward()
    assert torch.equal(x.grad, mask)  # the gradient is the same product with the mask


def test_the_distribution_is_dropouts():
    torch.manual_seed(0)
    y = dropout(torch.ones(1_000_000), 0.25, True)
    assert abs((y == 0).double().mean().item() - 0.25) < 0.003  # 5 standard deviations
    assert set(y.unique().tolist()) == {0.0, torch.tensor(1 / 0.75).item()} and abs(y.mean().item() - 1.0) < 0.005


def test_outside_training_and_at_the_bounds_it_is_torchs():
    x = torch.randn(4, 5)
    assert dropout(x, 0.5, False) is x and dropout(x, 0.0, True) is x
    assert torch.equal(dropout(x, 1.0, True), torch.zeros_like(x))
    assert Dropout(0.5).eval()(x) is x and Dropout(0.5).p == 0.5
