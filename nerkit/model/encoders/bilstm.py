"""Bidirectional LSTM encoder: the classic BiLSTM-CRF baseline (Huang et al. 2015; Lample et al. 2016)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nerkit.config import BiLSTMOptions
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
        self.dropout = nn.Dropout(config.dropout)
        self.output_dim = 2 * config.hidden_size

    def forward(self, x: torch.Tensor, mask: torch.Tensor, lattice: LatticeWords | None = None) -> torch.Tensor:
        # x (B, T, D), mask (B, T) bool, left-aligned; the lattice is ignored.
        lengths = mask.sum(1).clamp(min=1).cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))  # (B, T, 2H)
        return self.dropout(out)
