"""The interface every head follows: what turns the encoder's output (B, T, H) into entities. A head
is trained by `loss`, decodes into the one shape of `nerkit.model.decoded` (`decode`), says how sure
it is of its decision (`decision_log_probabilities`, for choosing what to annotate next) and gives
an ONNX export its raw outputs (`export_forward`). What it can do beyond that, callers ask of its
`traits` (`nerkit.config.HeadTraits`: has_tags, supports_marginals, has_threshold, reads_memory,
export_outputs), never its name."""

from __future__ import annotations

import torch
from torch import nn

from nerkit.config import HeadTraits
from nerkit.features.batch import Batch
from nerkit.model.decoded import Found


class Head(nn.Module):
    """A head built from the config, the encoder's width and the model's tags (`tags`; its entity
    types are theirs, sorted). Its parameters are saved under the names they had on the tagger
    itself before heads were components (the tagger drops the `head.` prefix)."""

    traits: HeadTraits

    def __init__(self, config, input_dim: int, tags: list[str]):
        super().__init__()

    def loss(self, hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The mean training loss of the batch from the encoder's output `hidden` (B, T, H)."""
        raise NotImplementedError

    def decode(self, hidden: torch.Tensor, mask: torch.Tensor, scores: bool = False, temperature: float = 1.0,
               threshold: float | None = None, score_map: tuple[float, float] | None = None) -> list[list[Found]]:
        """Each sentence's entities (start, end exclusive, type index, score or None), ordered by start.
        `scores`: whether to score them (a head whose entities carry their probabilities anyway
        scores them always); `temperature`, `threshold`, `score_map`: what calibration fitted, for
        the heads that read them (None: the head's own)."""
        raise NotImplementedError

    def decision_log_probabilities(self, hidden: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0,
                                   threshold: float | None = None,
                                   score_map: tuple[float, float] | None = None) -> list[float]:
        """Per sentence, the log-probability of what the head decides in it (a CRF's best path, a
        span head's set of spans)."""
        raise NotImplementedError

    def grow_from(self, old: "Head", score_map: tuple[float, float] | None = None) -> dict[str, torch.Tensor]:
        """Take the weights of `old`, a head of the same kind whose entity types are some of this
        head's (adding types to a trained model, nerkit.training.grow): every old tag or type keeps
        its exact weights, and the new ones start so that the model predicts what `old` did until
        it learns them. `score_map`: what calibration fitted to `old`'s scores, for a head that
        reads one (folded into the old types' weights, so that they score as `old` predicted).
        Returns where each parameter holds `old`'s weights: its name here -> a bool mask of its shape
        (what grow.anchor anchors; the new tags' or types' entries are False)."""
        raise NotImplementedError

    def nothing_shared(self) -> dict[str, torch.Tensor]:
        """`grow_from`'s masks before it marks what it copies: every entry False."""
        return {name: torch.zeros_like(p, dtype=torch.bool) for name, p in self.named_parameters()}

    def export_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """What an ONNX graph computes before any decoding (`traits.export_outputs` names it last),
        traceable: no Python decisions on tensor values."""
        raise NotImplementedError
