"""The CRF head: a linear layer gives each character's tag scores (emissions) and a constrained CRF
(nerkit.model.crf) learns and decodes one tag per character, so entities never overlap; its
entities are scored by exact marginals."""

from __future__ import annotations

import math

import torch
from torch import nn

from nerkit.config import HEAD_TRAITS
from nerkit.data.tags import split_tag
from nerkit.features.batch import Batch
from nerkit.model.crf import CRF
from nerkit.model.decoded import Found, path_entities
from nerkit.model.dropout import Dropout
from nerkit.model.heads.base import Head


class CrfHead(Head):
    traits = HEAD_TRAITS["crf"]

    def __init__(self, config, input_dim: int, tags: list[str]):
        super().__init__(config, input_dim, tags)
        self.tags = list(tags)
        self.types = sorted({split_tag(t)[1] for t in tags if t != "O"})
        self.output_dropout = Dropout(config.crf.dropout)
        self.emission = nn.Linear(input_dim, len(tags))
        self.crf = CRF(tags, constrain_training=config.crf.constrain_training, algorithm=config.crf.algorithm)

    def emissions(self, hidden: torch.Tensor) -> torch.Tensor:
        """Each character's tag scores (B, T, K) from the encoder's output (B, T, H)."""
        return self.emission(self.output_dropout(hidden))

    def loss(self, hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The CRF's mean negative log-likelihood per sentence; with partial labels (`batch.known`),
        that of every path through the known tags, any tag allowed where nothing is known; with
        `batch.allowed` (a corpus labelled for some types only), through the tags each position allows."""
        allowed = batch.allowed
        if allowed is None and batch.known is not None:
            allowed = nn.functional.one_hot(batch.tag_ids, len(self.tags)).bool() | ~batch.known[..., None]
        return self.crf.neg_log_likelihood(self.emissions(hidden), batch.tag_ids, batch.mask, reduction="mean",
                                           allowed=allowed)

    def soft_loss(self, hidden: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor,
                  temperature: float = 1.0, merged: torch.Tensor | None = None) -> torch.Tensor:
        """Distillation's soft-target loss: KL(teachers' marginals `targets` (B, T, K) || the model's),
        per sentence (`CRF.posterior_kl`; `merged`: the tags the teacher lacks, counted as its O)."""
        return self.crf.posterior_kl(self.emissions(hidden), mask, targets, temperature, merged)

    @torch.no_grad()
    def grow_from(self, old: "CrfHead", score_map: tuple[float, float] | None = None) -> dict[str, torch.Tensor]:
        """`Head.grow_from`: the old tags' emission rows and start, transition and end scores copied
        exactly; the new tags' transitions as the CRF initialises them, and their emission rows
        O's row with its bias lowered by `new_tag_margin`, so that no best path holds a new tag until
        training raises them (the proof is `new_tag_margin`'s)."""
        index = torch.tensor([self.tags.index(t) for t in old.tags])  # each old tag's row here
        new = torch.tensor([k for k, t in enumerate(self.tags) if t not in old.tags], dtype=torch.long)
        self.emission.weight[index] = old.emission.weight.to(self.emission.weight)
        self.emission.bias[index] = old.emission.bias.to(self.emission.bias)
        mine, theirs = self.crf.torch_crf, old.crf.torch_crf
        mine.start_transitions[index] = theirs.start_transitions.to(mine.start_transitions)
        mine.end_transitions[index] = theirs.end_transitions.to(mine.end_transitions)
        mine.transitions[index[:, None], index[None, :]] = theirs.transitions.to(mine.transitions)
        o = self.tags.index("O")
        self.emission.weight[new] = self.emission.weight[o].clone()
        self.emission.bias[new] = self.emission.bias[o].clone() - self.new_tag_margin()
        shared = self.nothing_shared()
        for name in ("emission.weight", "emission.bias", "crf.torch_crf.start_transitions",
                     "crf.torch_crf.end_transitions"):
            shared[name][index] = True
        shared["crf.torch_crf.transitions"][index[:, None], index[None, :]] = True
        return shared

    @torch.no_grad()
    def new_tag_margin(self) -> float:
        """How far below O's a new tag's emission starts: more than twice the spread R (largest minus
        smallest) of the start, transition and end scores that decoding allows. A path through new
        tags loses to the same path with each run of them (L positions) replaced by O, which stays
        valid in every scheme: the run's L emissions gain more than 2R each, and the L + 1 scores
        into, inside and out of it change by at most R each, L x 2R >= (L + 1) x R. So the grown
        model's best path is the old model's, on any input."""
        start, trans, end = self.crf._masked_scores(float("nan"))
        scores = torch.cat([start.flatten(), trans.flatten(), end.flatten()])
        scores = scores[~scores.isnan()]
        return 2 * float(scores.max() - scores.min()) + 1.0

    def paths(self, hidden: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
        """Each sentence's best tag path (tag ids, as long as the sentence)."""
        return self.crf.decode(self.emissions(hidden), mask)

    @torch.no_grad()
    def decode(self, hidden: torch.Tensor, mask: torch.Tensor, scores: bool = False, temperature: float = 1.0,
               threshold: float | None = None, score_map: tuple[float, float] | None = None) -> list[list[Found]]:
        """The entities of each sentence's best path; with `scores`, each with its probability
        (`CRF.entity_probabilities`, at `temperature`)."""
        emissions = self.emissions(hidden)
        paths = self.crf.decode(emissions, mask)
        probabilities = self.crf.entity_probabilities(emissions, mask, paths, temperature) if scores else [None] * len(paths)
        return [path_entities(path, self.tags, self.types, probs) for path, probs in zip(paths, probabilities)]

    @torch.no_grad()
    def decision_log_probabilities(self, hidden: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0,
                                   threshold: float | None = None,
                                   score_map: tuple[float, float] | None = None) -> list[float]:
        """The log-probability of each sentence's best path."""
        emissions = self.emissions(hidden)
        paths = self.crf.decode(emissions, mask)
        return [math.log(max(p, 1e-300)) for p in self.crf.path_probabilities(emissions, mask, paths, temperature)]

    def export_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """The emissions (B, T, K): the graph decodes them with the CRF's Viterbi (`tag_ids`)."""
        return self.emissions(hidden)
