"""Linear-chain CRF head whose decoding can never produce an invalid tag sequence.

Parameters come from pytorch-crf (its likelihood is the tests' reference); the scheme masks (BIO / BIOES /
BMES), the log-likelihood (plain and constrained) and a batch-vectorised constrained Viterbi are ours.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torchcrf import CRF as TorchCRF

from nerkit.config import CRF_ALGORITHMS
from nerkit.data.tags import Span, continues, detect_scheme, spans_to_tags, split_tag, tags_to_spans, transition_table
from nerkit.model.crf_numpy import FORBIDDEN
from nerkit.model.viterbi import StreamingViterbi

# Score given to a forbidden transition in the log-likelihood. Finite on purpose: with -inf, a tag that
# no valid path can reach would make logsumexp see only -inf and its backward pass would give NaN.
# exp(-1e30) is exactly 0, so forbidden paths still get no probability mass. It stays far from the
# float32 limit (3.4e38) even when summed over a long invalid gold path. Defined once in crf_numpy,
# the deliberate numpy copy of the forward-backward (an export's scores without torch), which
# tests/test_crf.py holds equal to this one's.
_FORBIDDEN_IN_LIKELIHOOD = FORBIDDEN




_REDUCTIONS = ("sum", "mean", "token_mean")


ALGORITHMS = CRF_ALGORITHMS  # crf.algorithm's values, defined once in nerkit.config


# `auto` takes the scan on a GPU up to this many tags: its (B, T/2, K, K, K) first level grows with K^3.
SCAN_MAX_TAGS = 32


def allowed_transitions(tags: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(start_ok (K,), trans_ok (K, K) with trans_ok[i, j] = tag i may be followed by tag j, end_ok (K,)),
    bool tensors of nerkit.data.tags' rules (any E- or S- tag means BIOES/BMES, otherwise BIO)."""
    start_ok, trans_ok, end_ok = transition_table(tags)
    return (
        torch.tensor(start_ok, dtype=torch.bool),
        torch.tensor(trans_ok, dtype=torch.bool),
        torch.tensor(end_ok, dtype=torch.bool),
    )


class CRF(nn.Module):
    """CRF over `tags` (index = tag id). Decoding always respects the tagging scheme; with
    `constrain_training=True` the log-likelihood also gives probability mass only to valid paths.

    Everything is computed in the parameters' dtype (float32 unless the module is converted), so
    half-precision emissions from autocast are upcast here.
    """

    def __init__(self, tags: list[str], constrain_training: bool = False, algorithm: str = "auto"):
        super().__init__()
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        self.algorithm = algorithm
        start_ok, trans_ok, end_ok = allowed_transitions(tags)
        # Decoding is guaranteed valid only if a valid path of every length exists; a tag that can
        # start, end and repeat (O, B-X in BIO; O, S-X in BIOES) gives one, and for these schemes
        # a length-1 sentence needs exactly such a tag.
        if not (start_ok & end_ok & trans_ok.diagonal()).any():
            raise ValueError(
                f"tag set {tags!r} has no tag that can tag a one-token sentence (add O or S- tags)"
            )
        self.tags = list(tags)
        self.num_tags = len(tags)
        self.constrain_training = constrain_training
        self.torch_crf = TorchCRF(self.num_tags, batch_first=True)
        # Buffers follow .to(device); not persistent because they are derived from `tags`.
        self.register_buffer("start_ok", start_ok, persistent=False)  # (K,)
        self.register_buffer("trans_ok", trans_ok, persistent=False)  # (K, K)
        self.register_buffer("end_ok", end_ok, persistent=False)  # (K,)

    def extra_repr(self) -> str:
        return f"num_tags={self.num_tags}, constrain_training={self.constrain_training}, algorithm={self.algorithm}"

    def _use_scan(self, emissions: torch.Tensor) -> bool:
        """The forward algorithm as a log-depth tree of (K, K) products (`scan`) or as T sequential
        steps (`loop`). Both give the same value; the scan issues O(log T) kernels instead of O(T),
        which is what a GPU needs (there the loop's launches dominate a training step), while it does
        K times more arithmetic, which a CPU notices. `auto`: the scan on a GPU with at most
        SCAN_MAX_TAGS tags, else the loop."""
        if self.algorithm != "auto":
            return self.algorithm == "scan"
        return emissions.is_cuda and self.num_tags <= SCAN_MAX_TAGS

    def _masked_scores(self, forbidden: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Start (K,), transition (K, K) and end (K,) scores with forbidden entries set to `forbidden`."""
        crf = self.torch_crf
        return (
            crf.start_transitions.masked_fill(~self.start_ok, forbidden),
            crf.transitions.masked_fill(~self.trans_ok, forbidden),
            crf.end_transitions.masked_fill(~self.end_ok, forbidden),
        )

    def _check_shapes(
        self, emissions: torch.Tensor, mask: torch.Tensor, tag_ids: torch.Tensor | None = None
    ) -> None:
        if emissions.dim() != 3 or emissions.size(2) != self.num_tags:
            raise ValueError(f"emissions must be (B, T, {self.num_tags}), got {tuple(emissions.shape)}")
        if mask.shape != emissions.shape[:2]:
            raise ValueError(f"mask must be {tuple(emissions.shape[:2])}, got {tuple(mask.shape)}")
        if tag_ids is not None and tag_ids.shape != emissions.shape[:2]:
            raise ValueError(f"tag_ids must be {tuple(emissions.shape[:2])}, got {tuple(tag_ids.shape)}")

    def neg_log_likelihood(
        self, emissions: torch.Tensor, tag_ids: torch.Tensor, mask: torch.Tensor, reduction: str = "sum",
        allowed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """emissions (B, T, K) float, tag_ids (B, T) long, mask (B, T) bool (True = real token, left-aligned,
        every row has at least one True). reduction: 'sum' | 'mean' (per sequence) | 'token_mean'.

        Partial labels: `allowed` (B, T, K) bool, the tags each position may take (one where the
        annotation is known, several or all where it is not; every real position allows at least
        one). The likelihood is then that of every path through allowed tags, the forward algorithm
        over the lattice with the other tags' emissions forbidden, against all paths (Tsuboi et al.
        2008; Yang et al. 2018's partial-annotation CRF), only valid paths (decoding's forbidden
        transitions) counted; where each position allows exactly its `tag_ids` tag, a valid path, it
        is the full likelihood."""
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
        self._check_shapes(emissions, mask, tag_ids)
        if allowed is not None and allowed.shape != emissions.shape:
            raise ValueError(f"allowed must be {tuple(emissions.shape)}, got {tuple(allowed.shape)}")
        mask = mask.bool()
        emissions = emissions.to(self.torch_crf.transitions.dtype)
        # Padding labels may be an ignore index such as -100; they are never scored but are still
        # used as indices, so make them harmless.
        tag_ids = tag_ids.masked_fill(~mask, 0)
        scan = self._use_scan(emissions)
        # pytorch-crf's own likelihood gives the same value (the tests take it as the reference) in
        # twice the time on a CPU: its loop slices and multiplies by the mask at every step.
        if self.constrain_training:
            start, trans, end = self._masked_scores(_FORBIDDEN_IN_LIKELIHOOD)
        else:
            crf = self.torch_crf
            start, trans, end = crf.start_transitions, crf.transitions, crf.end_transitions
        partition = self._log_partition_scan if scan else self._log_partition
        if allowed is None:
            paths = self._gold_score(emissions, tag_ids, mask, start, trans, end)  # (B,)
        else:  # every valid path through the allowed tags: exp(_FORBIDDEN_IN_LIKELIHOOD) is exactly 0
            # Decoding's forbidden transitions hold here whatever constrain_training says: an unknown
            # region must not take mass through I-LOC after B-PER. A valid gold path is one such path.
            paths = partition(emissions.masked_fill(~allowed.bool(), _FORBIDDEN_IN_LIKELIHOOD), mask,
                              *self._masked_scores(_FORBIDDEN_IN_LIKELIHOOD))
        log_likelihood = paths - partition(emissions, mask, start, trans, end)  # (B,)
        if reduction == "sum":
            return -log_likelihood.sum()
        if reduction == "mean":
            return -log_likelihood.mean()
        return -log_likelihood.sum() / mask.sum()

    @staticmethod
    def _gold_score(emissions, tag_ids, mask, start, trans, end) -> torch.Tensor:
        """Score of the given tag path per sequence, (B,)."""
        emitted = emissions.gather(2, tag_ids.unsqueeze(2)).squeeze(2)  # (B, T)
        moved = trans[tag_ids[:, :-1], tag_ids[:, 1:]]  # (B, T-1)
        last_index = mask.sum(1, keepdim=True) - 1  # (B, 1)
        last_tag = tag_ids.gather(1, last_index).squeeze(1)  # (B,)
        return (
            start[tag_ids[:, 0]]
            + torch.where(mask, emitted, 0.0).sum(1)
            + torch.where(mask[:, 1:], moved, 0.0).sum(1)
            + end[last_tag]
        )

    @staticmethod
    def _alphas(emissions, mask, start, trans) -> list[torch.Tensor]:
        """The forward algorithm, which the partition and forward-backward share: log alpha at each
        position, T of (B, K), the log-sum over valid paths up to t ending in each tag (emission at
        t included); a padding position keeps the last real one's."""
        # One unbind, not a slice per step: each slice's backward fills a gradient of the whole (B, T, K).
        steps, real = emissions.unbind(1), mask.unsqueeze(2).unbind(1)  # T of (B, K) and of (B, 1)
        alphas = [start + steps[0]]  # (B, K) each
        for t in range(1, len(steps)):
            # (B, K, 1) + (K, K) -> reduce over the previous tag -> (B, K)
            stepped = torch.logsumexp(alphas[-1].unsqueeze(2) + trans, dim=1) + steps[t]
            alphas.append(torch.where(real[t], stepped, alphas[-1]))  # padding keeps the old value
        return alphas

    @staticmethod
    def _log_partition(emissions, mask, start, trans, end) -> torch.Tensor:
        """log of the summed exp-score of all paths per sequence (forward algorithm), (B,)."""
        return torch.logsumexp(CRF._alphas(emissions, mask, start, trans)[-1] + end, dim=1)

    @staticmethod
    def _log_partition_scan(emissions, mask, start, trans, end) -> torch.Tensor:
        """The same value as `_log_partition`, as a tree of products in the (logsumexp, +) semiring.

        Step t (t >= 1) is the matrix M_t[i, j] = trans[i, j] + emissions[t, j] (the identity at
        padding); log Z = logsumexp over paths of (start + emissions[0]) . M_1 . ... . M_{T-1} . end.
        Adjacent matrices are multiplied pairwise until one is left: log2(T) rounds of batched
        (B, n, K, K, K) work instead of T dependent steps.
        """
        batch_size, seq_len, num_tags = emissions.shape
        alpha = start + emissions[:, 0]  # (B, K)
        if seq_len > 1:
            # exp(_FORBIDDEN_IN_LIKELIHOOD) is exactly 0, so this is the semiring's identity, and finite
            eye = torch.full((num_tags, num_tags), _FORBIDDEN_IN_LIKELIHOOD, dtype=emissions.dtype,
                             device=emissions.device).fill_diagonal_(0.0)
            steps = trans + emissions[:, 1:].unsqueeze(2)  # (B, T-1, K_prev, K_next)
            steps = torch.where(mask[:, 1:, None, None], steps, eye)
            while steps.size(1) > 1:
                if steps.size(1) % 2:
                    steps = torch.cat([steps, eye.expand(batch_size, 1, num_tags, num_tags)], dim=1)
                left, right = steps[:, 0::2], steps[:, 1::2]  # (B, n, K, K) each
                # (i, k, 1) + (1, k, j) -> reduce over the middle tag k -> (i, j)
                steps = torch.logsumexp(left.unsqueeze(4) + right.unsqueeze(2), dim=3)
            alpha = torch.logsumexp(alpha.unsqueeze(2) + steps[:, 0], dim=1)  # (B, K)
        return torch.logsumexp(alpha + end, dim=1)

    def _scaled_scores(self, dtype: torch.dtype, temperature: float):
        """Start, transition and end scores under decoding's constraints (forbidden steps at a score
        whose exp is exactly 0), divided by `temperature`, in `dtype`."""
        return tuple(x.to(dtype) / temperature for x in self._masked_scores(_FORBIDDEN_IN_LIKELIHOOD))

    def _scaled(self, emissions: torch.Tensor, temperature: float):
        """Emissions in float64 and the constrained start, transition and end scores, every one
        divided by `temperature` (the path that decoding picks stays the best at any temperature)."""
        emissions = emissions.double() / temperature
        return (emissions, *self._scaled_scores(emissions.dtype, temperature))

    @staticmethod
    def _forward_backward(emissions, mask, start, trans, end):
        """log alpha (B, T, K), the log-sum over valid paths up to t ending in each tag (emission
        at t included); log beta (B, T, K), over what follows t from each tag (the end score at the
        last real position); log Z (B,); of scores as `_scaled` gives them. Padding rows are meaningless."""
        seq_len = emissions.size(1)
        alphas = CRF._alphas(emissions, mask, start, trans)  # T of (B, K)
        betas = [end.expand_as(alphas[0])]
        for t in range(seq_len - 2, -1, -1):
            # (B, 1, K_next) + (K, K_next) -> reduce over the next tag -> (B, K)
            stepped = torch.logsumexp((emissions[:, t + 1] + betas[-1]).unsqueeze(1) + trans, dim=2)
            betas.append(torch.where(mask[:, t + 1].unsqueeze(1), stepped, end))
        betas.reverse()
        log_z = torch.logsumexp(alphas[-1] + end, dim=1)  # the last alpha is the last real position's
        return torch.stack(alphas, 1), torch.stack(betas, 1), log_z

    @torch.no_grad()
    def marginals(self, emissions: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """P(tag k at position t) over every valid path, (B, T, K) (forward-backward, in float64);
        each real position sums to 1, forbidden tags get exactly 0, padding gets 0."""
        probs = self.log_marginals(emissions, mask, temperature).exp()  # (B, T, K)
        return probs.masked_fill(~mask.bool().unsqueeze(2), 0.0)

    def log_marginals(self, emissions: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """log P(tag k at position t) under the same constraints as `marginals`, (B, T, K), with
        gradients (a student's side of distillation), in float64; forbidden tags get about -1e30
        and padding rows are meaningless.

        Float64 because alpha + beta - log Z cancels numbers of the size of the sequence's summed
        scores: in float32, over a 250-character window of emissions about 10, the rounding gave the
        KL's gradient a steady component along the offset that every tag of a position shares,
        which the exact loss does not see (0 in float64, as large as the rest of the gradient in
        float32); Adam follows it, the emissions grow along it, the cancellation grows worse, and a
        distilled student diverged (docs/distillation.md)."""
        self._check_shapes(emissions, mask)
        mask = mask.bool()
        emissions, start, trans, end = self._scaled(emissions, temperature)
        alpha, beta, log_z = self._forward_backward(emissions, mask, start, trans, end)
        return alpha + beta - log_z[:, None, None]

    def posterior_kl(self, emissions: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor,
                     temperature: float = 1.0, merged: torch.Tensor | None = None) -> torch.Tensor:
        """Posterior distillation (Wang et al. 2020): KL(targets || this CRF's marginals) summed over
        each sequence's real positions, the mean over sequences, times temperature^2 (Hinton's
        scaling, so that the gradients keep their size whatever the temperature). `targets` (B, T, K):
        the teachers' marginals at the same temperature (each real position sums to 1, or is all
        zeros: a position left out). Zero exactly when the marginals are equal.

        `merged` (K,) bool: tags the teacher does not know (a grown model's new types, whose
        `targets` columns are 0): their marginal mass joins O's, since the teacher's O means "none
        of my types" (nerkit.training.grow)."""
        log_student = self.log_marginals(emissions, mask, temperature)  # (B, T, K)
        if merged is not None:
            o = self.tags.index("O")
            joined = merged.clone()
            joined[o] = True
            outside = torch.logsumexp(log_student[..., joined], dim=2, keepdim=True)  # (B, T, 1): O or a new tag
            log_student = log_student.index_copy(2, torch.tensor([o], device=log_student.device), outside)
        targets = targets.to(log_student.dtype)
        # xlogy: a tag the teacher gives no mass (a forbidden one) adds 0, not 0 * log 0
        per_tag = torch.xlogy(targets, targets) - targets * log_student
        per_position = per_tag.sum(2).masked_fill(~mask.bool(), 0.0)  # (B, T)
        return per_position.sum(1).mean() * temperature ** 2

    @torch.no_grad()
    def path_probabilities(self, emissions: torch.Tensor, mask: torch.Tensor, paths: list[list[int]],
                           temperature: float = 1.0) -> list[float]:
        """exp(score(path) - log Z) of each path (as `decode` gives them) among the valid paths."""
        self._check_shapes(emissions, mask)
        mask = mask.bool()
        emissions, start, trans, end = self._scaled(emissions, temperature)
        tag_ids = torch.zeros(mask.shape, dtype=torch.long, device=emissions.device)
        for row, path in enumerate(paths):
            tag_ids[row, :len(path)] = torch.tensor(path, dtype=torch.long)
        score = self._gold_score(emissions, tag_ids, mask, start, trans, end)
        log_z = self._log_partition(emissions, mask, start, trans, end)
        return (score - log_z).exp().clamp(max=1.0).tolist()

    @torch.no_grad()
    def allowed_log_probabilities(self, emissions: torch.Tensor, mask: torch.Tensor, allowed: torch.Tensor,
                                  temperature: float = 1.0) -> torch.Tensor:
        """(B,): log P(the path goes through the allowed tags), `allowed` (B, T, K) bool as
        `neg_log_likelihood` takes it: a labelled path's own log-probability where each position
        allows one tag, the mass of every path consistent with a partial annotation where unknown
        positions allow them all. Among valid paths, as `path_probabilities` counts them."""
        self._check_shapes(emissions, mask)
        mask = mask.bool()
        emissions, start, trans, end = self._scaled(emissions, temperature)
        inside = emissions.masked_fill(~allowed.bool(), _FORBIDDEN_IN_LIKELIHOOD)
        return (self._log_partition(inside, mask, start, trans, end)
                - self._log_partition(emissions, mask, start, trans, end))

    @torch.no_grad()
    def span_log_probabilities(self, emissions: torch.Tensor, mask: torch.Tensor, max_width: int,
                               temperature: float = 1.0) -> torch.Tensor:
        """(B, types, T, W) float64, W = `max_width`: cell (k, s, w) is log P(characters s..s+w are
        exactly one entity of type k), the mass of the paths that tag that segment as one entity of
        that type (its tags as the scheme spells it) and do not continue it past its end, as
        `entity_probabilities` scores a decoded entity, here for every span of every type (the
        layout of the span head's band; types sorted). Cells past a sentence's end get -inf.

        The segment's score is built a tag at a time from its start: a width's tags share their
        prefix with the next width's (B, I, I, ... in BIO), so each prefix is summed once."""
        self._check_shapes(emissions, mask)
        mask = mask.bool()
        emissions, start, trans, end = self._scaled(emissions, temperature)
        alpha, beta, log_z = self._forward_backward(emissions, mask, start, trans, end)  # (B, T, K) (B, T, K) (B,)
        batch_size, seq_len, _ = emissions.shape
        lengths = mask.sum(1)  # (B,)
        scheme = detect_scheme(self.tags)
        types = sorted({split_tag(t)[1] for t in self.tags if t != "O"})
        forbidden = torch.full((batch_size, seq_len), _FORBIDDEN_IN_LIKELIHOOD, dtype=emissions.dtype,
                               device=emissions.device)

        def shifted(values: torch.Tensor, by: int) -> torch.Tensor:
            """values[:, s + by] at s, (B, T); past the end, a score whose exp is 0."""
            return torch.cat([values[:, by:], forbidden[:, :by]], dim=1) if by else values

        positions = torch.arange(seq_len, device=emissions.device)
        last_real = positions[None, :] == (lengths - 1)[:, None]  # (B, T)
        out = torch.full((batch_size, len(types), seq_len, max_width), float("-inf"), dtype=emissions.dtype,
                         device=emissions.device)
        for k, kind in enumerate(types):
            goes_on = torch.tensor([continues(t) and split_tag(t)[1] == kind for t in self.tags],
                                   device=emissions.device)  # (K,): the tags that would continue it
            prefixes: dict[tuple[int, ...], torch.Tensor] = {}  # tag ids -> (B, T) score from each start
            for w in range(max_width):
                tag_ids = tuple(self.tags.index(t) for t in spans_to_tags(w + 1, [Span(0, w + 1, kind)], scheme))
                for j in range(len(tag_ids)):
                    if tag_ids[:j + 1] in prefixes:
                        continue
                    if j == 0:
                        prefixes[tag_ids[:1]] = alpha[:, :, tag_ids[0]]
                    else:
                        step = trans[tag_ids[j - 1], tag_ids[j]] + shifted(emissions[:, :, tag_ids[j]], j)
                        prefixes[tag_ids[:j + 1]] = prefixes[tag_ids[:j]] + step
                last = tag_ids[-1]
                # leaving the segment at position p: the sequence's end, or a next tag that does not continue it
                onward = trans[last][None, None, :] + emissions[:, 1:] + beta[:, 1:]  # (B, T - 1, K)
                onward = torch.logsumexp(onward.masked_fill(goes_on, float("-inf")), dim=2)
                onward = torch.cat([onward, forbidden[:, :1]], dim=1)  # (B, T): at p
                onward = torch.where(last_real, end[last], onward)
                score = prefixes[tag_ids] + shifted(onward, w) - log_z[:, None]  # (B, T)
                fits = positions[None, :] + w < lengths[:, None]  # (B, T)
                out[:, k, :, w] = score.masked_fill(~fits, float("-inf")).clamp(max=0.0)
        return out

    def entity_segments(self, mask: torch.Tensor, paths: list[list[int]]) -> "EntitySegments":
        """The entities of `paths` (as `decode` gives them) as `entity_probabilities` reads them: what
        it needs of the paths whatever the temperature, to be built once where many are tried."""
        mask = mask.bool()
        batch_size, seq_len = mask.shape
        device = mask.device
        tag_ids = torch.zeros(batch_size, seq_len, dtype=torch.long, device=device)
        rows, starts, stops, kinds = [], [], [], []
        for row, path in enumerate(paths):
            tag_ids[row, :len(path)] = torch.tensor(path, dtype=torch.long)
            for span in tags_to_spans([self.tags[i] for i in path]):
                rows.append(row), starts.append(span.start), stops.append(span.end), kinds.append(span.type)
        b, s, e = (torch.tensor(x, dtype=torch.long, device=device) for x in (rows, starts, stops))  # (N,), e exclusive
        types = sorted(set(kinds))
        goes_on = torch.tensor([[continues(t) and split_tag(t)[1] == kind for t in self.tags] for kind in types],
                               dtype=torch.bool, device=device).reshape(len(types), self.num_tags)
        # (types, K): the tags that would continue an entity of a type; (N, K) for each entity
        carried = goes_on[torch.tensor([types.index(k) for k in kinds], dtype=torch.long, device=device)]
        return EntitySegments(rows, tag_ids, b, s, e, carried, at_end=e == mask.sum(1)[b])

    @torch.no_grad()
    def entity_probabilities(self, emissions: torch.Tensor, mask: torch.Tensor, paths: list[list[int]],
                             temperature: float = 1.0, segments: "EntitySegments | None" = None) -> list[list[float]]:
        """For each path (as `decode` gives them) the probability of each of its entities, in the
        order of `tags_to_spans`: the probability that exactly that span carries exactly that type,
        the mass of the paths holding that tag segment and not continuing it (the next tag is not an
        inside tag of the type; in BIOES and BMES, E- and S- close it by themselves). Forward score
        into its first tag + the segment's own score + backward score out of its last tag - log Z.
        Every score divided by `temperature` (a fitted one calibrates the probabilities).
        `segments`: `entity_segments(mask, paths)`, when the caller keeps it for several temperatures."""
        self._check_shapes(emissions, mask)
        mask = mask.bool()
        found = segments or self.entity_segments(mask, paths)
        if not found.rows:
            return [[] for _ in paths]
        emissions, start, trans, end = self._scaled(emissions, temperature)
        alpha, beta, log_z = self._forward_backward(emissions, mask, start, trans, end)
        tag_ids, b, s, e = found.tag_ids, found.b, found.s, found.e
        # the path's own score, summed from its start: (B, T)
        step = emissions.gather(2, tag_ids.unsqueeze(2)).squeeze(2)
        step[:, 1:] += trans[tag_ids[:, :-1], tag_ids[:, 1:]]
        running = step.cumsum(1)
        first, last = tag_ids[b, s], tag_ids[b, e - 1]
        inside = alpha[b, s, first] + running[b, e - 1] - running[b, s]  # (N,)
        after = e.clamp(max=emissions.size(1) - 1)
        onward = trans[last] + emissions[b, after] + beta[b, after]  # (N, K): the next tag and what follows
        onward = torch.logsumexp(onward.masked_fill(found.carried, float("-inf")), dim=1)
        out = inside + torch.where(found.at_end, end[last], onward) - log_z[b]
        values = out.exp().clamp(max=1.0).tolist()
        grouped: list[list[float]] = [[] for _ in paths]
        for row, value in zip(found.rows, values):
            grouped[row].append(value)
        return grouped

    @torch.no_grad()
    def streaming(self, limit: int = 4096) -> StreamingViterbi:
        """A decoder for sequences that arrive a piece at a time (nerkit.model.viterbi), giving the
        tags `decode` gives, in memory that does not grow with the sequence."""
        start, trans, end = (t.detach().cpu().numpy() for t in self._masked_scores(float("-inf")))
        return StreamingViterbi(start, trans, end, limit)

    def decode(self, emissions: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
        """Best tag-id path per sequence (length = mask row sum), never violating the scheme."""
        self._check_shapes(emissions, mask)
        mask = mask.bool()
        emissions = emissions.to(self.torch_crf.transitions.dtype)
        # -inf is exact here (no gradients): a forbidden step loses against any finite score, however
        # large the emissions; the constructor guarantees a finite (valid) path always exists.
        start, trans, end = self._masked_scores(float("-inf"))
        batch_size, seq_len, num_tags = emissions.shape

        score = start + emissions[:, 0]  # (B, K): best path score ending in each tag
        # At padding steps the back-pointer is the identity, so backtracking carries the last real
        # tag through the padding and every row can be traced back in lockstep.
        identity = torch.arange(num_tags, device=emissions.device).expand(batch_size, num_tags)  # (B, K)
        back_pointers = []
        for t in range(1, seq_len):
            # (B, K, 1) + (K, K) -> best previous tag for each next tag -> (B, K)
            best_prev_score, best_prev = (score.unsqueeze(2) + trans).max(dim=1)
            real = mask[:, t].unsqueeze(1)  # (B, 1)
            score = torch.where(real, best_prev_score + emissions[:, t], score)
            back_pointers.append(torch.where(real, best_prev, identity))

        best_tag = (score + end).argmax(dim=1)  # (B,)
        path = [best_tag]
        for pointers in reversed(back_pointers):
            best_tag = pointers.gather(1, best_tag.unsqueeze(1)).squeeze(1)  # (B,)
            path.append(best_tag)
        path.reverse()

        lengths = mask.sum(1)  # (B,)
        # One host transfer for paths and lengths together: (B, 1 + T).
        rows = torch.cat([lengths.unsqueeze(1), torch.stack(path, dim=1)], dim=1).tolist()
        return [row[1 : 1 + row[0]] for row in rows]


@dataclass
class EntitySegments:
    """The entities of decoded paths, `CRF.entity_segments`: each entity's path, start and end, the
    tags that would continue it, and whether it ends its sequence (nothing of the scores)."""

    rows: list[int]  # the path of each entity, in order (N,)
    tag_ids: torch.Tensor  # (B, T) the paths, padded with 0
    b: torch.Tensor  # (N,) the path's row
    s: torch.Tensor  # (N,) first position
    e: torch.Tensor  # (N,) one past the last position
    carried: torch.Tensor  # (N, K) the tags that would continue it
    at_end: torch.Tensor  # (N,) it ends its sequence
