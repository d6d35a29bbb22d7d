"""The BiLSTM's CPU training path (a padded batch, each sentence reversed within its length for the
backward direction) gives the packed LSTM's states and gradients, and is the path a CPU training
step takes: torch's packed CPU LSTM made a training step four times as slow (docs/notebook/speed.md).
Prediction packs a batch padded past its longest sentence, as before, and not a trimmed one."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from nerkit.config import BiLSTMOptions
from nerkit.model.encoders.bilstm import BiLSTM

LENGTHS = [7, 3, 5, 1, 7]


def encoder_and_inputs(dtype: torch.dtype, layers: int = 2):
    torch.manual_seed(0)
    encoder = BiLSTM(6, BiLSTMOptions(hidden_size=4, num_layers=layers, dropout=0.0)).to(dtype).train()
    x = torch.randn(len(LENGTHS), max(LENGTHS), 6, dtype=dtype, requires_grad=True)
    mask = torch.arange(max(LENGTHS))[None, :] < torch.tensor(LENGTHS)[:, None]
    return encoder, x, mask


def states_and_gradients(encoder: BiLSTM, x: torch.Tensor, mask: torch.Tensor, path: str) -> list[torch.Tensor]:
    """The states at real positions, then the gradients of the input and of every weight, of a loss
    that reads only real positions."""
    encoder.zero_grad()
    x.grad = None
    out = getattr(encoder, path)(x, mask)
    weights = torch.linspace(-1, 1, out[mask].numel(), dtype=out.dtype).view_as(out[mask])
    (out[mask] * weights).sum().backward()
    return [out[mask].detach(), x.grad.clone(), *(p.grad.clone() for p in encoder.parameters())]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_unpacked_gives_the_packed_states_and_gradients(dtype, tolerance):
    encoder, x, mask = encoder_and_inputs(dtype)
    packed = states_and_gradients(encoder, x, mask, "_packed")
    unpacked = states_and_gradients(encoder, x, mask, "_unpacked")
    for a, b in zip(packed, unpacked):
        torch.testing.assert_close(b, a, rtol=tolerance, atol=tolerance)


def packs(encoder: BiLSTM, x: torch.Tensor, mask: torch.Tensor) -> tuple[bool, torch.Tensor]:
    """Whether the encoder's forward packed the batch, and its output."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = encoder(x, mask)
    return "aten::_pack_padded_sequence" in {event.key for event in prof.key_averages()}, out


def test_a_cpu_training_step_does_not_pack_and_zeroes_padding():
    encoder, x, mask = encoder_and_inputs(torch.float32, layers=1)
    packed, out = packs(encoder, x, mask)
    assert not packed
    assert torch.equal(out[~mask], torch.zeros_like(out[~mask]))


def test_cpu_prediction_packs_a_batch_padded_past_its_longest_sentence_only():
    """Without gradients the packed LSTM skips the columns of prediction's batch shapes; a batch
    without them (a scored corpus's, trimmed) runs the fused LSTM, its states the packed ones."""
    encoder, x, mask = encoder_and_inputs(torch.float32, layers=1)
    encoder.eval()
    wider = torch.cat([x, torch.zeros(len(LENGTHS), 3, x.size(2))], 1)
    with torch.inference_mode():
        packed, padded_out = packs(encoder, wider, torch.cat([mask, torch.zeros(len(LENGTHS), 3, dtype=torch.bool)], 1))
        assert packed
        packed, out = packs(encoder, x, mask)
        assert not packed
    torch.testing.assert_close(out, padded_out[:, :max(LENGTHS)], rtol=1e-5, atol=1e-5)
    assert torch.equal(out[~mask], torch.zeros_like(out[~mask]))
