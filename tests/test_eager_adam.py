"""nerkit.training.eager_adam: torch's Adam and AdamW without their compiler guards take the very
steps torch's own take, share their state both ways, and a training run imports no torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from helpers import REPO

from nerkit.training.eager_adam import EAGER, eager_class


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(30, 8), torch.nn.LSTM(8, 6, batch_first=True))


def _steps(optimizer: torch.optim.Optimizer, model: torch.nn.Module, n: int, seed: int = 5) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(n):
        optimizer.zero_grad(set_to_none=True)
        out, _ = model(torch.randint(0, 30, (4, 7), generator=generator))
        out.pow(2).sum().backward()
        optimizer.step()


@pytest.mark.parametrize("base", [torch.optim.Adam, torch.optim.AdamW])
@pytest.mark.parametrize("fused", [True, False])
def test_the_eager_optimiser_steps_as_torchs_bit_for_bit_and_shares_its_state(base, fused):
    assert base in EAGER  # this torch has what the eager class needs
    models = [_model(1), _model(1)]
    torchs, eager = (cls(m.parameters(), lr=0.01, weight_decay=0.01, fused=fused)
                     for cls, m in zip((base, eager_class(base)), models))
    _steps(torchs, models[0], 4)
    _steps(eager, models[1], 4)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)
    # a checkpoint of either loads in the other and goes on the same
    again = [_model(2), _model(2)]
    swapped = [base(again[0].parameters(), lr=0.01, fused=fused), eager_class(base)(again[1].parameters(), lr=0.01, fused=fused)]
    for model, source, target in zip(again, (models[1], models[0]), swapped):
        model.load_state_dict(source.state_dict())
    swapped[0].load_state_dict(eager.state_dict())
    swapped[1].load_state_dict(torchs.state_dict())
    _steps(swapped[0], again[0], 2, seed=9)
    _steps(swapped[1], again[1], 2, seed=9)
    for a, b in zip(again[0].parameters(), again[1].parameters()):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_a_training_run_imports_no_torch_dynamo(tmp_path):
    """torch.optim's guards import torch._dynamo (~1 s of a short run) on the optimiser's first call."""
    code = ("import sys\nsys.path.insert(0, 'tests')\nfrom helpers import tiny_raw_config\n"
            "from nerkit.config import build_config\nfrom nerkit.training.loop import train\n"
            f"train(build_config(tiny_raw_config(), 'tiny', ['train.epochs=1']), out={str(tmp_path / 'm')!r})\n"
            "print('torch._dynamo' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "False"
