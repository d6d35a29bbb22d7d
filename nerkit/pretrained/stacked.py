"""Stacked feature sources, as flair's `StackedEmbeddings`: several language models (or LAC-small)
read side by side, each character's features the concatenation of every source's, in the order
`embeddings.lm` lists them. Each source keeps its own options (fine-tuned or frozen, layers, bf16);
a frozen one is cached on its own (nerkit.pretrained.cache keys it by its checksum as it keys one).

The featuriser asks the stack's vocabulary for ids and gets one row per source, a tuple; batched,
they are (B, N, T), and a frozen source's cached states ride along as that source's entry of a tuple
of N (or None where a source runs live)."""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from nerkit.pretrained.base import CharFeatures


class StackedVocab:
    """The sources' vocabularies side by side: `ids` gives one row of ids per source."""

    def __init__(self, vocabs: list):
        self.vocabs = vocabs

    def ids(self, chars: list[str]) -> tuple[list[int], ...]:
        """(N rows of T ids): each source's ids of the characters, as that source looks them up."""
        return tuple(vocab.ids(chars) for vocab in self.vocabs)

    def fingerprint(self) -> str:
        return hashlib.sha256(" ".join(v.fingerprint() for v in self.vocabs).encode("ascii")).hexdigest()


class Stacked(nn.Module):
    """Feature sources (`CharFeatures`) whose per-character features are concatenated in order;
    `output_dim` is the sum of theirs. A source's weights, options and learning rate stay its own
    (`sources[k]`), so the optimiser and the model directory treat each as they treat one LM."""

    def __init__(self, sources: list[CharFeatures]):
        super().__init__()
        if len(sources) < 2:
            raise ValueError("a stack holds two sources or more; one source is used as it is")
        self.sources = nn.ModuleList(sources)
        self.vocab = StackedVocab([source.vocab for source in sources])
        self.output_dim = sum(source.output_dim for source in sources)

    def forward(self, lm_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """lm_ids (B, N, T), one row of ids per source; mask (B, T). Returns (B, T, output_dim)."""
        return self.read(lm_ids, mask)

    def read(self, lm_ids: torch.Tensor | None, mask: torch.Tensor,
             cached: tuple[torch.Tensor | None, ...] | None = None) -> torch.Tensor:
        """Every source's features (`CharFeatures.read`), concatenated: a source with cached layer
        states (B, T, S_k, D_k) in `cached` reads them, the others run on their ids lm_ids[:, k]."""
        parts = []
        for k, source in enumerate(self.sources):
            states = cached[k] if cached is not None else None
            ids = lm_ids[:, k] if lm_ids is not None else None  # (B, T)
            parts.append(source.read(ids, mask, states))  # (B, T, D_k)
        return torch.cat(parts, dim=-1)  # (B, T, sum of D_k)

    def example_states(self, per_source: list[torch.Tensor | None]) -> tuple[torch.Tensor | None, ...]:
        """What an example's `lm_states` holds: each source's cached (T, S_k, D_k), or None."""
        return tuple(per_source)
