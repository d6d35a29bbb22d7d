"""Bidirectional LSTM encoder: the classic BiLSTM-CRF baseline (Huang et al. 2015; Lample et al. 2016)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


@dataclass
class BiLSTMConfig:
    hidden_size: int = 200  # per direction
    num_layers: int = 1
    dropout: float = 0.3  # between stacked layers and on the output


class BiLSTM(nn.Module):
    Config = BiLSTMConfig

    def __init__(self, input_dim: int, config: BiLSTMConfig):
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

    def forward(self, x: torch.Tensor, mask: torch.Tensor, lattice=None) -> torch.Tensor:
        # x (B, T, D), mask (B, T) bool, left-aligned; the lattice is ignored.
        lengths = mask.sum(1).clamp(min=1).cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))  # (B, T, 2H)
        return self.dropout(out)
