"""The tagger: embedder (char + bichar) -> encoder -> linear -> CRF.

It exposes `loss(batch)` and `decode(batch)` and does no I/O; the pipeline builds it from a config
and the featuriser's table sizes, and owns saving and loading.
"""

from __future__ import annotations

import torch
from torch import nn

from nerkit.crf import CRF
from nerkit.encoders import ENCODERS, LatticeWords
from nerkit.features import Batch


def embedding(num: int, dim: int, init: str) -> nn.Embedding:
    """A table whose row 0 (padding) is zero; `init` as `embeddings.init` (normal | scaled)."""
    table = nn.Embedding(num, dim, padding_idx=0)
    if init == "scaled":
        bound = (3.0 / dim) ** 0.5
        with torch.no_grad():
            table.weight.uniform_(-bound, bound)
            table.weight[0].zero_()
    return table


class Embedder(nn.Module):
    """Concatenated character and bigram embeddings, with dropout."""

    def __init__(self, num_chars: int, num_bichars: int, char_dim: int, bichar_dim: int, dropout: float,
                 init: str = "normal"):
        super().__init__()
        self.chars = embedding(num_chars, char_dim, init)
        self.bichars = embedding(num_bichars, bichar_dim, init) if bichar_dim > 0 else None
        self.dropout = nn.Dropout(dropout)
        self.output_dim = char_dim + bichar_dim

    def forward(self, char_ids: torch.Tensor, bichar_ids: torch.Tensor) -> torch.Tensor:
        x = self.chars(char_ids)  # (B, T, Dc)
        if self.bichars is not None:
            x = torch.cat([x, self.bichars(bichar_ids)], dim=-1)  # (B, T, Dc + Db)
        return self.dropout(x)


class Tagger(nn.Module):
    def __init__(self, config, num_chars: int, num_bichars: int, tags: list[str], num_words: int = 0):
        super().__init__()
        emb = config.embeddings
        self.embedder = Embedder(num_chars, num_bichars, emb.char_dim, emb.bichar_dim, emb.dropout, emb.init)
        encoder_cls = ENCODERS[config.encoder.name]
        self.uses_lattice = encoder_cls.uses_lattice
        self.words = embedding(num_words, emb.word_dim, emb.init) if self.uses_lattice else None
        self.word_dropout = nn.Dropout(emb.dropout)
        self.encoder = encoder_cls(self.embedder.output_dim, config.encoder.options, emb.word_dim)
        self.output_dropout = nn.Dropout(config.crf.dropout)
        self.emission = nn.Linear(self.encoder.output_dim, len(tags))
        self.crf = CRF(tags, constrain_training=config.crf.constrain_training, algorithm=config.crf.algorithm)

    def emissions(self, batch: Batch) -> torch.Tensor:
        x = self.embedder(batch.char_ids, batch.bichar_ids)  # (B, T, D)
        lattice = None
        if self.uses_lattice:
            lattice = LatticeWords(self.word_dropout(self.words(batch.word_ids)), batch.word_heads,
                              batch.word_tails, batch.word_mask)
        h = self.encoder(x, batch.mask, lattice)  # (B, T, H)
        return self.emission(self.output_dropout(h))  # (B, T, K)

    def loss(self, batch: Batch) -> torch.Tensor:
        """Mean negative log-likelihood per sentence."""
        return self.crf.neg_log_likelihood(self.emissions(batch), batch.tag_ids, batch.mask, reduction="mean")

    @torch.no_grad()
    def decode(self, batch: Batch) -> list[list[int]]:
        return self.crf.decode(self.emissions(batch), batch.mask)
