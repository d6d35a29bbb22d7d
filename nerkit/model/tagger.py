"""The tagger: embedder (char + bichar [+ language-model features]) -> encoder -> a head
(nerkit.model.heads: `model.head` names it in HEADS), which learns and decodes entities.

It exposes `loss(batch)` and `decode(batch)` and does no I/O; the pipeline builds it from a config
and the featuriser's table sizes, and owns saving and loading.
"""

from __future__ import annotations

import torch
from torch import nn

from nerkit.features.batch import Batch
from nerkit.model.decoded import Found
from nerkit.model.dropout import Dropout
from nerkit.model.encoders import ENCODERS, LatticeWords
from nerkit.model.encoders.transformer import forget
from nerkit.model.heads import HEADS

UNK_ID = 1  # features.Vocab: 0 is padding, 1 the unknown token


def embedding(num: int, dim: int, init: str) -> nn.Embedding:
    """A table whose row 0 (padding) is zero; `init` as `embeddings.init` (normal | scaled)."""
    table = nn.Embedding(num, dim, padding_idx=0)
    if init == "scaled":
        bound = (3.0 / dim) ** 0.5
        with torch.no_grad():
            table.weight.uniform_(-bound, bound)
            table.weight[0].zero_()
    return table


def token_dropout(ids: torch.Tensor, p: float) -> torch.Tensor:
    """Training tokens replaced by <unk> with probability p (padding stays), so that the <unk> row
    learns what an unseen token should look like (the official code's `word_dropout`)."""
    drop = (torch.rand(ids.shape, device=ids.device) < p) & (ids > 0)
    return ids.masked_fill(drop, UNK_ID)


def piece_sequences(emissions: torch.Tensor, tag_ids: torch.Tensor, pieces: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The CRF sequences inside a batch of segments: emissions (B, L, K) and tag_ids (B, L) re-sliced
    into one left-aligned row per piece, with its mask. `pieces` (N, 3): row, start, length."""
    rows, starts, lengths = pieces.unbind(1)  # (N,) each
    offsets = torch.arange(int(lengths.max()), device=emissions.device)  # (P,)
    mask = offsets[None, :] < lengths[:, None]  # (N, P)
    columns = (starts[:, None] + offsets[None, :]).clamp(max=emissions.size(1) - 1)  # (N, P), padding in range
    return emissions[rows[:, None], columns], tag_ids[rows[:, None], columns], mask  # (N, P, K), (N, P), (N, P)


class Embedder(nn.Module):
    """Concatenated character and bigram embeddings and, with a language model, its features for
    each character; dropout on the whole. `lm`: a `nerkit.pretrained.base.CharFeatures` (LM or LAC),
    a `nerkit.pretrained.stacked.Stacked` of several (their features in order), or None."""

    def __init__(self, num_chars: int, num_bichars: int, char_dim: int, bichar_dim: int, dropout: float,
                 init: str = "normal", token_dropout: float = 0.0, lm: nn.Module | None = None):
        super().__init__()
        self.chars = embedding(num_chars, char_dim, init) if char_dim > 0 else None  # 0: the LM's features alone
        self.bichars = embedding(num_bichars, bichar_dim, init) if bichar_dim > 0 else None
        self.lm = lm
        self.dropout = Dropout(dropout)
        self.token_dropout = token_dropout
        self.output_dim = char_dim + bichar_dim + (lm.output_dim if lm is not None else 0)

    def forward(self, batch: Batch) -> torch.Tensor:
        char_ids, bichar_ids = batch.char_ids, batch.bichar_ids
        if self.training and self.token_dropout:
            char_ids, bichar_ids = token_dropout(char_ids, self.token_dropout), token_dropout(bichar_ids, self.token_dropout)
        parts = []
        if self.chars is not None:
            parts.append(self.chars(char_ids))  # (B, T, Dc)
        if self.bichars is not None:
            parts.append(self.bichars(bichar_ids))  # (B, T, Db)
        if self.lm is not None:  # a frozen LM's cached states where the batch has them, else the LM run
            parts.append(self.lm.read(batch.lm_ids, batch.mask, batch.lm_states))  # (B, T, D_lm)
        return self.dropout(torch.cat(parts, dim=-1))  # (B, T, output_dim)


HEAD_PREFIX = "head."  # the head's parameters are saved without it: as they were named before heads were components


def _unprefixed_head(module, state: dict, prefix: str, local_metadata) -> None:
    """state_dict's hook: the head's tensors under their saved names (`emission.weight`, `crf.*`,
    `span.*`), so that model directories and checkpoints keep their keys."""
    for key in [k for k in state if k.startswith(prefix + HEAD_PREFIX)]:
        state[prefix + key[len(prefix + HEAD_PREFIX):]] = state.pop(key)


def _prefixed_head(module, state: dict, prefix: str, *args) -> None:
    """load_state_dict's pre-hook: the saved names back under the head."""
    for key in [k for k in state if k.startswith(prefix)]:
        name = key[len(prefix):].split(".", 1)[0]
        if name in module.head._modules:
            state[prefix + HEAD_PREFIX + key[len(prefix):]] = state.pop(key)


class Tagger(nn.Module):
    def __init__(self, config, num_chars: int, num_bichars: int, tags: list[str], num_words: int = 0,
                 lm: nn.Module | None = None):
        super().__init__()
        emb = config.embeddings
        self.embedder = Embedder(num_chars, num_bichars, emb.width("char"), emb.width("bichar"), emb.dropout,
                                 emb.init, emb.token_dropout, lm)
        encoder_cls = ENCODERS[config.encoder.name]
        self.uses_lattice = encoder_cls.uses_lattice
        self.words = embedding(num_words, emb.width("word"), emb.init) if self.uses_lattice else None
        self.word_dropout = Dropout(emb.dropout)
        self.encoder = encoder_cls(self.embedder.output_dim, config.encoder.options, emb.width("word"))
        self.head = HEADS[config.model.head](config, self.encoder.output_dim, tags)
        self.register_state_dict_post_hook(_unprefixed_head)
        self.register_load_state_dict_pre_hook(_prefixed_head)

    @property
    def lm(self) -> nn.Module | None:
        """The language model's feature module (nerkit.pretrained), or None."""
        return self.embedder.lm

    def lm_sources(self) -> list[nn.Module]:
        """The language models whose features the model reads, in order (several when stacked)."""
        return list(self.embedder.lm.sources) if self.embedder.lm is not None else []

    def lm_parameters(self) -> list[list[nn.Parameter]]:
        """Each language model's own weights (not the layers above them), one list per source in
        order, for each source's own learning rate."""
        return [list(source.lm.parameters()) for source in self.lm_sources()]

    @torch.no_grad()
    def load_rows(self, kind: str, ids: list[int], rows: torch.Tensor, freeze: bool) -> None:
        """Pretrained vectors into the `kind` table (char, bichar, word): row ids[i] becomes rows[i]
        (len(ids), width); a frozen table is left out of training."""
        table = {"char": self.embedder.chars, "bichar": self.embedder.bichars, "word": self.words}[kind]
        if ids:
            table.weight[list(ids)] = rows.to(table.weight)
        table.weight.requires_grad_(not freeze)

    def hidden(self, batch: Batch) -> torch.Tensor:
        """The encoder's output (B, T, H) at the characters (FLAT's lattice words left out)."""
        x = self.embedder(batch)  # (B, T, D)
        lattice = None
        if self.uses_lattice:
            word_ids = batch.word_ids
            if self.training and self.embedder.token_dropout:
                word_ids = token_dropout(word_ids, self.embedder.token_dropout)
            lattice = LatticeWords(self.word_dropout(self.words(word_ids)), batch.word_heads,
                                   batch.word_tails, batch.word_mask)
        return self.encoder(x, batch.mask, lattice)  # (B, T, H)

    def loss(self, batch: Batch) -> torch.Tensor:
        """The head's mean training loss over the batch (`Head.loss`)."""
        return self.head.loss(self.hidden(batch), batch)

    @torch.no_grad()
    def decode(self, batch: Batch, scores: bool = False, temperature: float = 1.0, threshold: float | None = None,
               score_map: tuple[float, float] | None = None) -> list[list[Found]]:
        """Each sentence's entities (start, end exclusive, type index, score or None), whatever the
        head (`Head.decode`, which says what the other arguments mean)."""
        return self.head.decode(self.hidden(batch), batch.mask, scores, temperature, threshold, score_map)

    @torch.no_grad()
    def decision_log_probabilities(self, batch: Batch, temperature: float = 1.0, threshold: float | None = None,
                                   score_map: tuple[float, float] | None = None) -> list[float]:
        """Per sentence, the log-probability of what the head decides in it (`Head.decision_log_probabilities`)."""
        return self.head.decision_log_probabilities(self.hidden(batch), batch.mask, temperature, threshold, score_map)

    # What only a head with tags (`traits.has_tags`) has: emissions, tag paths, and what reads them.

    def emissions(self, batch: Batch) -> torch.Tensor:
        """The tag scores (B, T, K) of a head with tags."""
        return self.head.emissions(self.hidden(batch))  # (B, T, K)

    @torch.no_grad()
    def paths(self, batch: Batch) -> list[list[int]]:
        """Each sentence's best tag path (tag ids) of a head with tags."""
        return self.head.paths(self.hidden(batch), batch.mask)

    def read_segment(self, batch: Batch, memory: list | None = None, keep: int | None = None
                     ) -> tuple[torch.Tensor, list | None]:
        """Transformer-XL's step (a Transformer with `encoder.memory`, a head that `reads_memory`): the
        emissions (B, L, K) of one segment of B streams, and the memory the next segment of the same
        streams reads (None: every stream starts here; `keep`: only the first `keep` positions go into
        it, the rest being a look-ahead). Document training and streamed prediction read a stream with it."""
        h, memory = self.encoder.encode(self.embedder(batch), batch.mask, memory, keep)  # (B, L, H)
        return self.head.emissions(h), memory  # (B, L, K)

    def segment_loss(self, batch: Batch, memory: list | None = None) -> tuple[torch.Tensor, list | None]:
        """Document training's loss (`data.context: document`): one segment of B streams read with
        the memory of their segments before (dropped in the rows of `batch.resets`, whose document
        starts here), and the mean negative log-likelihood per sentence piece (`batch.pieces`, each
        its own CRF sequence, as a sentence is in `loss`); also the memory the next segment reads."""
        emissions, memory = self.read_segment(batch, forget(memory, batch.resets))  # (B, L, K)
        emissions, tag_ids, mask = piece_sequences(emissions, batch.tag_ids, batch.pieces)  # (N, P, K), (N, P)
        return self.head.crf.neg_log_likelihood(emissions, tag_ids, mask, reduction="mean"), memory

    def loss_with_teacher(self, batch: Batch, merged: torch.Tensor, weight: float) -> torch.Tensor:
        """A grown model's loss with soft targets (nerkit.training.grow; a head that `supports_marginals`):
        the head's loss of the new labels (`Head.loss`), plus `weight` x the KL of the source model's
        marginals `batch.teacher` (B, T, K) against the model's, the tags it lacks (`merged` (K,)) counted
        as its O; the encoder runs once for both."""
        h = self.hidden(batch)
        return self.head.loss(h, batch) + weight * self.head.soft_loss(h, batch.mask, batch.teacher, 1.0, merged)

    def soft_loss(self, batch: Batch, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """Distillation's soft-target loss (a head that `supports_marginals`): KL(teachers' marginals
        `targets` (B, T, K) || the model's), per sentence."""
        return self.head.soft_loss(self.hidden(batch), batch.mask, targets, temperature)
