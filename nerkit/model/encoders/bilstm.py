"""Bidirectional LSTM encoder: the classic BiLSTM-CRF baseline (Huang et al. 2015; Lample et al. 2016).

A GPU packs the padded batch (cuDNN runs packed sequences in one kernel), and so does prediction on
the CPU when the batch is padded past its longest sentence (packed, the CPU skips the columns that
prediction's batch shapes add). Training on the CPU, a CPU batch without such columns (a scored
corpus's: its LSTM forward 1.14x faster than packed) and an ONNX export (`nerkit export`, which
cannot trace packing) keep the batch padded, the backward
direction reading each sentence reversed within its own length instead (`_unpacked`), which gives
the same states at every real position: torch's CPU LSTM runs packed sequences as one small operator
per time step, whose backward pass fills a gradient the size of the whole packed input at every
step, so a training step took four times as long packed (docs/notebook/speed.md); padded, it runs
oneDNN's fused LSTM forward and backward."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nerkit.config import BiLSTMOptions
from nerkit.model.dropout import Dropout, dropout
from nerkit.model.encoders.base import LatticeWords


class BiLSTM(nn.Module):
    uses_lattice = False

    def __init__(self, input_dim: int, config: BiLSTMOptions, word_dim: int = 0):
        super().__init__()
        self.lstm = nn.LSTM(
            input_dim,
            config.hidden_size,
            num_layers=config.num_layers,
            batch_first=True,
            bidirectional=True,
            dropout=config.dropout if config.num_layers > 1 else 0.0,
        )
        self.dropout = Dropout(config.dropout)
        self.output_dim = 2 * config.hidden_size

    def forward(self, x: torch.Tensor, mask: torch.Tensor, lattice: LatticeWords | None = None) -> torch.Tensor:
        # x (B, T, D), mask (B, T) bool, left-aligned; the lattice is ignored.
        if torch.compiler.is_exporting():
            return self.dropout(self._unpacked(x, mask))
        # On the CPU packing pays only for the columns past the longest sentence that prediction's
        # batch shapes add; a batch without them (training's, a scored corpus's) runs oneDNN's fused LSTM.
        if not x.is_cuda and (torch.is_grad_enabled() or bool(mask[:, -1].any())):  # zeros at padding, as packing leaves them
            return self.dropout(self._unpacked(x, mask).masked_fill(~mask[..., None], 0.0))
        return self.dropout(self._packed(x, mask))

    def _packed(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The LSTM over the batch packed to its real lengths (B, T, 2H); zeros at padding."""
        lengths = mask.sum(1).clamp(min=1).cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))  # (B, T, 2H)
        return out

    def _unpacked(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The same as the packed LSTM without packing: per layer, the forward direction runs over the
        padded batch (padding comes after every real step, so it never reaches one) and the backward
        direction over each sentence reversed within its length, its output reversed back. Padding
        positions hold junk, which the mask keeps out of every result (and their gradient is zero).
        Between layers, in training, the LSTM's own inter-layer dropout."""
        lengths = mask.sum(1, keepdim=True)  # (B, 1)
        positions = torch.arange(mask.size(1), device=mask.device)[None, :]  # (1, T)
        # Position t of the reversed sentence is position length - 1 - t of the sentence; padding stays.
        reverse = torch.where(positions < lengths, lengths - 1 - positions, positions)[..., None]  # (B, T, 1)
        lstm, h = self.lstm, x
        for layer in range(lstm.num_layers):
            if layer:
                h = dropout(h, lstm.dropout, self.training)
            directions = []
            for suffix in ("", "_reverse"):
                weights = [getattr(lstm, f"{name}_l{layer}{suffix}")
                           for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
                inputs = h.gather(1, reverse.expand(-1, -1, h.size(2))) if suffix else h  # (B, T, D_in)
                start = inputs.new_zeros(1, inputs.size(0), lstm.hidden_size)  # (1, B, H)
                # aten's lstm: one layer, one direction, biases, batch first -> (output, h_n, c_n)
                out = torch.lstm(inputs, (start, start), weights, True, 1, 0.0, self.training, False, True)[0]  # (B, T, H)
                directions.append(out.gather(1, reverse.expand(-1, -1, out.size(2))) if suffix else out)
            h = torch.cat(directions, dim=2)  # (B, T, 2H)
        return h
