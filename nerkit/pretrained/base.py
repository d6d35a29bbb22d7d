"""What every language model kind shares: overlapping windows for long sentences, the learned scalar
mix of layers and `CharFeatures`, the module that turns characters into per-character features
(fine-tuned or frozen). The character vocabulary, torch-free, is nerkit.pretrained.vocab's."""

from __future__ import annotations

import hashlib
import json
import math
import re

import torch
from torch import nn

from nerkit.config import LM_LAYERS
from nerkit.errors import UserError
from nerkit.pretrained.vocab import CharVocab, _read_optional_json  # noqa: F401 (re-exported: their home before)

LAYERS = LM_LAYERS  # embeddings.lm.layers's values, defined once in nerkit.config

# A parameter of a numbered layer: BERT's and RoBERTa's `encoder.layer.3.`, XLNet's `layer.3.`, LAC's `layers.3.`
NUMBERED_LAYER = re.compile(r"(?:^|\.)layers?\.(\d+)\.")


OPTIONS_FILE = "nerkit_lm.json"


MIX_FILE = "mix.safetensors"


# ------------------------------------------------------------------------------------ windows

def lm_windows(length: int, size: int) -> list[tuple[int, int, int, int]]:
    """Overlapping windows of at most `size` characters over a sentence of `length`, each as
    (start, end, take_start, take_end): the window covers [start, end) and supplies the features of
    [take_start, take_end), the characters for which it is the window where they are most central
    (the earlier window on a tie). Windows advance by half their size; the last one ends the sentence.
    """
    if length <= size:
        return [(0, length, 0, length)]
    stride = max(1, size // 2)
    starts = list(range(0, length - size, stride)) + [length - size]
    centres = [s + (size - 1) / 2 for s in starts]
    # Centres increase, so each window takes one run, cut halfway between neighbouring centres.
    cuts = [0] + [math.floor((a + b) / 2) + 1 for a, b in zip(centres, centres[1:])] + [length]
    return [(s, s + size, cuts[k], cuts[k + 1]) for k, s in enumerate(starts)]


# ------------------------------------------------------------------------------------ the module

class ScalarMix(nn.Module):
    """ELMo's learned mix of layers: gamma * sum_k softmax(w)_k * h_k (as in AllenNLP)."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, stack: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.weights, dim=0)  # (S,)
        return self.gamma * torch.einsum("btsd,s->btd", stack, weights)  # (B, T, D)


class CharFeatures(nn.Module):
    """A pretrained encoder `lm` read as per-character features: what `LMEmbedder` and nerkit.pretrained.lac's
    `LACEmbedder` share. A subclass defines `states`, the encoder's S layer states of width
    `output_dim` per character; `combine` reduces them to one feature per character.

    `layers`: "last" (the top layer) or "mix" (a learned scalar mix of the embeddings and every
    layer). `finetune`: train the LM's weights; when False the LM stays in eval mode and runs under
    no_grad (the scalar mix, if any, still learns). `bf16`: run the LM under bf16 autocast.
    """

    def __init__(self, lm: nn.Module, vocab: CharVocab, layers: str, finetune: bool, bf16: bool,
                 num_layers: int, output_dim: int):
        super().__init__()
        if layers not in LAYERS:
            raise UserError(f"unknown LM layers option {layers!r}", fix=f"use one of {', '.join(LAYERS)}")
        self.lm, self.vocab = lm, vocab
        self.layers, self.finetune, self.bf16 = layers, finetune, bf16
        self.num_states = num_layers + 1 if layers == "mix" else 1
        self.output_dim = output_dim
        self.terms = None  # its licence (nerkit.pretrained.licences.Terms), set where it is read from a directory
        self.scalar_mix = ScalarMix(self.num_states) if layers == "mix" else None
        self.lm.requires_grad_(finetune)
        self.train(False)  # ready for inference, as Hugging Face's from_pretrained leaves a model

    def parameter_depths(self) -> list[tuple[nn.Parameter, int]]:
        """Each of the LM's parameters with its depth, what `embeddings.lm.layer_decay` scales its
        rate by: k for the k-th numbered layer (`layer.3.` or `layers.3.` is the 4th), 0 for the
        embeddings, the top layer's depth for what sits above the layers (a final norm)."""
        named = [(p, NUMBERED_LAYER.search(name), name) for name, p in self.lm.named_parameters()]
        numbered = [int(found.group(1)) + 1 for _, found, _ in named if found]
        if not numbered:
            raise UserError("embeddings.lm.layer_decay: this language model has no numbered layers to decay over",
                            fix="leave layer_decay at 1 for it")
        top = max(numbered)
        return [(p, int(found.group(1)) + 1 if found else 0 if "emb" in name else top) for p, found, name in named]

    def train(self, mode: bool = True) -> "CharFeatures":
        super().train(mode)
        if not self.finetune:
            self.lm.eval()  # a frozen LM never drops out, whatever the model around it does
        return self

    def forward(self, lm_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """lm_ids (B, T) long per character, no [CLS]/[SEP]; mask (B, T) bool, left-aligned.
        Returns (B, T, output_dim), zero at padding."""
        return self.combine(self.states(lm_ids, mask), mask)

    def read(self, lm_ids: torch.Tensor | None, mask: torch.Tensor, cached: torch.Tensor | None = None) -> torch.Tensor:
        """The features (B, T, output_dim): from `cached`, a frozen LM's layer states (B, T, S, D)
        read from nerkit.pretrained.cache, when given, else by running the LM on lm_ids (B, T)."""
        if cached is not None:
            return self.combine(cached, mask)  # (B, T, D)
        return self(lm_ids, mask)  # (B, T, D)

    @property
    def sources(self) -> list["CharFeatures"]:
        """The feature sources this module stands for: itself (nerkit.pretrained.stacked's `Stacked`
        holds several), so that the optimiser, the cache and the model directory treat both alike."""
        return [self]

    def example_states(self, per_source: list[torch.Tensor | None]) -> torch.Tensor | None:
        """What an example's `lm_states` holds, given each source's cached (T, S, D) states: its one."""
        return per_source[0]

    def states(self, lm_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T, S, D) float32 layer states, zero at padding: S = 1 for "last", else the embeddings
        and each layer."""
        raise NotImplementedError

    def combine(self, stack: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T, S, D) layer states, from `states` or the cache, and the mask (B, T) -> (B, T, D)."""
        if self.scalar_mix is None:
            return stack[:, :, -1]  # (B, T, D)
        return self.scalar_mix(stack)

    def fingerprint(self) -> str:
        """A checksum of everything that decides the features: config, vocabulary, weights."""
        digest = hashlib.sha256()
        digest.update(json.dumps(self.lm.config.to_dict(), sort_keys=True, default=str).encode("utf-8"))
        digest.update(self.vocab.fingerprint().encode("ascii"))
        for name, tensor in sorted(self.lm.state_dict().items()):
            digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}".encode("utf-8"))
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy())
        return digest.hexdigest()


def _gist(error: Exception) -> str:
    """The first sentence of a library's error message."""
    text = str(error).strip()
    if not text:
        return type(error).__name__
    return text.splitlines()[0].split(". ")[0].rstrip(".")
