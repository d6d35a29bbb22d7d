"""Tests for nerkit.model.crf: likelihood and Viterbi against brute-force enumeration of tag paths, and
decoded paths checked by the tests' reference of the schemes (scheme_reference.py), written independently of
nerkit.data.tags.
"""

from __future__ import annotations

import itertools
import random
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scheme_reference import is_valid_path

from nerkit.model.crf import CRF, allowed_transitions

BIO = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
BIOES = ["O", "B-PER", "I-PER", "E-PER", "S-PER"]
BMES = ["B-GPE.NAM", "M-GPE.NAM", "E-GPE.NAM", "S-GPE.NAM"]
# Tag order shuffled and a type with a hyphen, so nothing depends on O being id 0 or on the type name.
BIOES_MIXED = ["S-ORG-X", "B-LOC", "O", "E-ORG-X", "I-LOC", "B-ORG-X", "E-LOC", "I-ORG-X", "S-LOC"]


# ---------------------------------------------------------------- independent reference code


def crf_scores(crf: CRF) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    inner = crf.torch_crf
    params = (inner.start_transitions, inner.transitions, inner.end_transitions)
    return tuple(p.detach().double().numpy() for p in params)


def all_path_scores(crf: CRF, emissions: np.ndarray, valid_only: bool) -> tuple[np.ndarray, np.ndarray]:
    """Every tag path over emissions (L, K) and its unconstrained CRF score: (N, L) ids, (N,) scores."""
    start, trans, end = crf_scores(crf)
    length, num_tags = emissions.shape
    paths = np.array(list(itertools.product(range(num_tags), repeat=length)))  # (N, L)
    if valid_only:
        keep = [is_valid_path(crf.tags, [crf.tags[i] for i in p]) for p in paths]
        paths = paths[np.array(keep)]
    scores = (
        start[paths[:, 0]]
        + emissions[np.arange(length), paths].sum(1)
        + trans[paths[:, :-1], paths[:, 1:]].sum(1)
        + end[paths[:, -1]]
    )
    return paths, scores


def logsumexp(values: np.ndarray) -> float:
    top = values.max()
    return float(top + np.log(np.exp(values - top).sum()))


def randomize(crf: CRF, generator: torch.Generator, scale: float = 1.0) -> CRF:
    """Transition scores large enough to matter next to the emissions (pytorch-crf inits to +-0.1)."""
    with torch.no_grad():
        for param in crf.parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * scale)
    return crf


def lengths_to_mask(lengths: list[int], seq_len: int) -> torch.Tensor:
    return torch.arange(seq_len).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)  # (B, T)


# ---------------------------------------------------------------- log-likelihood


@pytest.mark.parametrize("algorithm", ["loop", "scan"])
@pytest.mark.parametrize("constrain_training", [False, True])
@pytest.mark.parametrize("tags", [BIO[:3], BIO, BMES], ids=["BIO-3", "BIO-5", "BMES-4"])
def test_nll_matches_brute_force(tags, constrain_training, algorithm):
    generator = torch.Generator().manual_seed(len(tags) + 10 * constrain_training)
    crf = randomize(CRF(tags, constrain_training=constrain_training, algorithm=algorithm).double(), generator)
    lengths = [4, 1, 3, 2]
    emissions = torch.randn(len(lengths), 4, len(tags), generator=generator, dtype=torch.float64)  # (B, T, K)
    mask = lengths_to_mask(lengths, 4)
    rng = np.random.default_rng(0)

    gold = torch.full((len(lengths), 4), -100, dtype=torch.long)  # padding label never looked at
    expected = []
    for row, length in enumerate(lengths):
        paths, scores = all_path_scores(crf, emissions[row, :length].numpy(), valid_only=constrain_training)
        # Gold paths are valid ones in both modes (that is what a corpus contains).
        valid_rows = [i for i, p in enumerate(paths) if is_valid_path(tags, [tags[j] for j in p])]
        pick = rng.choice(valid_rows)
        gold[row, :length] = torch.from_numpy(paths[pick])
        expected.append(-(scores[pick] - logsumexp(scores)))

    nll = crf.neg_log_likelihood(emissions, gold, mask, reduction="sum")
    assert nll.item() == pytest.approx(sum(expected), abs=1e-5)


# ---------------------------------------------------------------- partial labels


def random_allowed(generator: torch.Generator, shape: tuple[int, int, int], unknown: float) -> torch.Tensor:
    """(B, T, K) bool: each position, with probability `unknown`, any non-empty set of tags, else one tag."""
    batch, length, num_tags = shape
    allowed = torch.zeros(shape, dtype=torch.bool)
    for b, t in itertools.product(range(batch), range(length)):
        if torch.rand(1, generator=generator).item() < unknown:
            while not allowed[b, t].any():
                allowed[b, t] = torch.rand(num_tags, generator=generator) < 0.6
        else:
            allowed[b, t, torch.randint(num_tags, (1,), generator=generator)] = True
    return allowed


@pytest.mark.parametrize("algorithm", ["loop", "scan"])
@pytest.mark.parametrize("constrain_training", [False, True])
@pytest.mark.parametrize("tags", [BIO, BIOES, BMES, BIOES_MIXED[:5]], ids=["BIO", "BIOES", "BMES", "mixed"])
def test_partial_label_nll_matches_brute_force(tags, constrain_training, algorithm):
    """Partial labels: minus log of the summed exp-scores of the valid paths (decoding's forbidden
    transitions, always) through the allowed tags, over all paths (valid ones with constrain_training),
    by enumeration."""
    generator = torch.Generator().manual_seed(len(tags) + 7 * constrain_training)
    crf = randomize(CRF(tags, constrain_training=constrain_training, algorithm=algorithm).double(), generator)
    lengths = [4, 1, 3, 2]
    emissions = torch.randn(len(lengths), 4, len(tags), generator=generator, dtype=torch.float64)
    mask = lengths_to_mask(lengths, 4)
    allowed = random_allowed(generator, tuple(emissions.shape), unknown=0.5)
    allowed[0, :2] = True  # a run of unknown positions
    expected = []
    for row, length in enumerate(lengths):
        paths, scores = all_path_scores(crf, emissions[row, :length].numpy(), valid_only=constrain_training)
        valid_paths, valid_scores = all_path_scores(crf, emissions[row, :length].numpy(), valid_only=True)
        through = np.array([all(allowed[row, t, p[t]] for t in range(length)) for p in valid_paths])
        if not through.any():  # no valid path through this row's allowed tags: leave the row out of the sum
            allowed[row, :length] = True
            through[:] = True
        expected.append(-(logsumexp(valid_scores[through]) - logsumexp(scores)))
    gold = torch.zeros(mask.shape, dtype=torch.long)  # not read with `allowed`
    nll = crf.neg_log_likelihood(emissions, gold, mask, reduction="sum", allowed=allowed)
    assert nll.item() == pytest.approx(sum(expected), abs=1e-6)


@pytest.mark.parametrize("constrain_training", [False, True])
def test_partial_labels_with_nothing_unknown_are_the_full_likelihood_and_batch_like_one_at_a_time(constrain_training):
    generator = torch.Generator().manual_seed(3)
    crf = randomize(CRF(BIOES, constrain_training=constrain_training), generator, scale=0.5)
    lengths = [6, 2, 5]
    emissions = torch.randn(3, 6, len(BIOES), generator=generator)
    mask = lengths_to_mask(lengths, 6)
    gold = torch.tensor([[1, 2, 3, 0, 4, 0], [4, 0, 0, 0, 0, 0], [0, 1, 3, 4, 0, 0]])
    known = torch.nn.functional.one_hot(gold, len(BIOES)).bool()
    for reduction in ("sum", "mean", "token_mean"):
        assert crf.neg_log_likelihood(emissions, gold, mask, reduction, allowed=known).item() == pytest.approx(
            crf.neg_log_likelihood(emissions, gold, mask, reduction).item(), rel=1e-5)
    allowed = known.clone()
    allowed[0, 3:5] = True  # unknown between two known entities
    allowed[2, :2] = True
    together = crf.neg_log_likelihood(emissions, gold, mask, "sum", allowed=allowed)
    alone = sum(crf.neg_log_likelihood(emissions[i:i + 1, :n], gold[i:i + 1, :n], mask[i:i + 1, :n], "sum",
                                       allowed=allowed[i:i + 1, :n]) for i, n in enumerate(lengths))
    assert together.item() == pytest.approx(alone.item(), rel=1e-5)
    assert together.item() < crf.neg_log_likelihood(emissions, gold, mask, "sum").item()  # fewer paths ruled out


def test_partial_labels_reach_every_parameter_and_no_unknown_emission_is_pushed_down():
    """Every parameter gets a gradient; an unknown position's emissions are pulled only towards the
    paths the known tags allow (with every tag allowed there and nothing known, the gradient is 0)."""
    generator = torch.Generator().manual_seed(5)
    crf = randomize(CRF(BIO, constrain_training=True), generator, scale=0.5)
    emissions = torch.randn(2, 5, len(BIO), generator=generator, requires_grad=True)
    mask = lengths_to_mask([5, 5], 5)
    allowed = torch.ones(2, 5, len(BIO), dtype=torch.bool)
    allowed[0, 0] = False
    allowed[0, 0, 1] = True  # one known tag in the first row
    crf.neg_log_likelihood(emissions, torch.zeros(2, 5, dtype=torch.long), mask, allowed=allowed).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in crf.parameters())
    assert emissions.grad[0].abs().sum() > 0
    assert emissions.grad[1].abs().max() < 1e-6  # nothing known in the second row: nothing to learn
    with pytest.raises(ValueError, match="allowed must be"):
        crf.neg_log_likelihood(emissions, torch.zeros(2, 5, dtype=torch.long), mask, allowed=allowed[:, :4])


@pytest.mark.parametrize("algorithm", ["loop", "scan"])
@pytest.mark.parametrize("constrain_training", [False, True])
@pytest.mark.parametrize(
    "reduction, divisor",
    [("sum", 1), ("mean", 3), ("token_mean", 3 + 1 + 2)],  # 3 sequences, 6 real tokens
    ids=["sum", "mean", "token_mean"],
)
def test_nll_reductions(reduction, divisor, constrain_training, algorithm):
    generator = torch.Generator().manual_seed(7)
    crf = randomize(CRF(BIOES, constrain_training=constrain_training, algorithm=algorithm).double(), generator)
    lengths = [3, 1, 2]
    emissions = torch.randn(3, 3, len(BIOES), generator=generator, dtype=torch.float64)
    gold = torch.tensor([[1, 3, 0], [4, 0, 0], [0, 4, 0]])  # B E O | S | O S
    total = 0.0
    for row, length in enumerate(lengths):
        paths, scores = all_path_scores(crf, emissions[row, :length].numpy(), valid_only=constrain_training)
        gold_index = next(i for i, p in enumerate(paths) if list(p) == gold[row, :length].tolist())
        total += -(scores[gold_index] - logsumexp(scores))
    nll = crf.neg_log_likelihood(emissions, gold, lengths_to_mask(lengths, 3), reduction=reduction)
    assert nll.item() == pytest.approx(total / divisor, abs=1e-5)


def test_constrained_likelihood_differs_from_plain():
    # Same parameters: the constrained partition function sums over fewer paths, so a valid gold
    # path gets a strictly smaller loss. Guards against the flag being silently ignored.
    generator = torch.Generator().manual_seed(3)
    plain = randomize(CRF(BIOES).double(), generator)
    constrained = CRF(BIOES, constrain_training=True).double()
    constrained.load_state_dict(plain.state_dict())
    emissions = torch.randn(2, 4, len(BIOES), generator=generator, dtype=torch.float64)
    gold = torch.tensor([[1, 2, 3, 0], [4, 0, 4, 0]])
    mask = torch.ones(2, 4, dtype=torch.bool)
    constrained_nll = constrained.neg_log_likelihood(emissions, gold, mask)
    assert constrained_nll < plain.neg_log_likelihood(emissions, gold, mask) - 1e-3


def test_bad_reduction_raises():
    crf = CRF(BIO)
    with pytest.raises(ValueError, match="reduction"):
        crf.neg_log_likelihood(
            torch.zeros(1, 2, 5), torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool), "none"
        )


@pytest.mark.parametrize("algorithm", ["loop", "scan"])
@pytest.mark.parametrize("constrain_training", [False, True])
def test_every_parameter_gets_a_gradient(constrain_training, algorithm):
    generator = torch.Generator().manual_seed(1)
    crf = CRF(BIOES_MIXED, constrain_training=constrain_training, algorithm=algorithm)
    emissions = torch.randn(2, 5, len(BIOES_MIXED), generator=generator, requires_grad=True)
    tag = BIOES_MIXED.index
    gold = torch.tensor(
        [
            [tag("B-LOC"), tag("I-LOC"), tag("E-LOC"), tag("O"), tag("S-ORG-X")],
            [tag("B-ORG-X"), tag("E-ORG-X"), tag("S-LOC"), 0, 0],
        ]
    )
    mask = lengths_to_mask([5, 3], 5)
    crf.neg_log_likelihood(emissions, gold, mask, reduction="mean").backward()
    assert emissions.grad is not None and emissions.grad.abs().sum() > 0
    names = [name for name, _ in crf.named_parameters()]
    assert len(names) == 3, names  # start, transitions, end
    for name, param in crf.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name


@pytest.mark.parametrize("algorithm", ["loop", "scan"])
def test_constrained_gradients_stay_finite_with_an_unreachable_tag(algorithm):
    # I-LOC without B-LOC can never be reached under BIO; a naive -inf mask turns its all -inf
    # logsumexp into NaN gradients.
    tags = ["O", "B-PER", "I-PER", "I-LOC"]
    crf = CRF(tags, constrain_training=True, algorithm=algorithm)
    emissions = torch.randn(2, 3, len(tags), generator=torch.Generator().manual_seed(2), requires_grad=True)
    gold = torch.tensor([[1, 2, 0], [0, 1, 0]])
    loss = crf.neg_log_likelihood(emissions, gold, lengths_to_mask([3, 2], 3))
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(emissions.grad).all()
    assert all(torch.isfinite(param.grad).all() for param in crf.parameters())


@pytest.mark.parametrize("constrain_training", [False, True])
def test_scan_equals_loop_on_long_padded_batches(constrain_training):
    """The log-depth forward algorithm against the sequential one:
    values and every gradient, over lengths that are odd, even, 1 and powers of two +- 1."""
    generator = torch.Generator().manual_seed(11)
    loop = randomize(CRF(BMES, constrain_training=constrain_training, algorithm="loop").double(), generator)
    scan = CRF(BMES, constrain_training=constrain_training, algorithm="scan").double()
    scan.load_state_dict(loop.state_dict())
    lengths = [1, 2, 7, 16, 17, 31, 33, 64, 70]
    seq_len = max(lengths)
    emissions = torch.randn(len(lengths), seq_len, len(BMES), generator=generator, dtype=torch.float64) * 3
    mask = lengths_to_mask(lengths, seq_len)
    # A valid gold path of each length (BMES has no O): random entities, B M* E or a lone S, so that
    # the constrained likelihood is finite and its gradients are compared for real.
    rnd = random.Random(5)
    gold = torch.zeros(len(lengths), seq_len, dtype=torch.long)
    for b, length in enumerate(lengths):
        path, position = [], 0
        while position < length:
            size = min(rnd.choice([1, 1, 2, 3, 5]), length - position)
            path += ["S-GPE.NAM"] if size == 1 else ["B-GPE.NAM"] + ["M-GPE.NAM"] * (size - 2) + ["E-GPE.NAM"]
            position += size
        gold[b, :length] = torch.tensor([BMES.index(t) for t in path])
    results = []
    for crf in (loop, scan):
        crf.zero_grad()
        e = emissions.clone().requires_grad_()
        nll = crf.neg_log_likelihood(e, gold, mask, reduction="sum")
        nll.backward()
        results.append((nll.detach(), e.grad, [p.grad.clone() for p in crf.parameters()]))
    (nll_a, grad_a, params_a), (nll_b, grad_b, params_b) = results
    assert 0 < nll_a.item() < 1e4  # a real likelihood, not the 1e31 of an impossible gold path
    assert nll_b.item() == pytest.approx(nll_a.item(), rel=1e-10)
    torch.testing.assert_close(grad_b, grad_a, rtol=1e-8, atol=1e-10)
    for a, b in zip(params_a, params_b):
        torch.testing.assert_close(b, a, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("reduction", ["sum", "mean", "token_mean"])
def test_unconstrained_loop_equals_pytorch_crf(reduction):
    """nerkit's own forward algorithm (twice as fast on a CPU) against pytorch-crf's likelihood, which
    it replaced: the value and every gradient, over padded batches of mixed lengths."""
    generator = torch.Generator().manual_seed(3)
    crf = randomize(CRF(BIOES_MIXED, algorithm="loop").double(), generator)
    lengths = [1, 2, 9, 16, 33, 40]
    emissions = torch.randn(len(lengths), max(lengths), len(BIOES_MIXED), generator=generator, dtype=torch.float64) * 3
    gold = torch.randint(0, len(BIOES_MIXED), emissions.shape[:2], generator=generator)
    mask = lengths_to_mask(lengths, max(lengths))
    results = []
    for likelihood in (lambda e: crf.neg_log_likelihood(e, gold, mask, reduction=reduction),
                       lambda e: -crf.torch_crf(e, gold, mask=mask, reduction=reduction)):
        crf.zero_grad()
        e = emissions.clone().requires_grad_()
        nll = likelihood(e)
        nll.backward()
        results.append([nll.detach(), e.grad, *(p.grad.clone() for p in crf.parameters())])
    for ours, reference in zip(*results):
        torch.testing.assert_close(ours, reference, rtol=1e-10, atol=1e-10)


def test_auto_algorithm_takes_the_loop_on_cpu_and_checks_its_name():
    crf = CRF(BIO)
    assert not crf._use_scan(torch.zeros(1, 3, len(BIO)))
    assert CRF(BIO, algorithm="scan")._use_scan(torch.zeros(1, 3, len(BIO)))
    with pytest.raises(ValueError, match="algorithm"):
        CRF(BIO, algorithm="fast")


# ---------------------------------------------------------------- Viterbi


@pytest.mark.parametrize(
    "tags",
    [BIO, BIOES, BMES, BIOES_MIXED[:5] + ["E-LOC", "S-LOC"]],
    ids=["BIO", "BIOES", "BMES", "BIOES-mixed"],
)
def test_viterbi_matches_brute_force(tags):
    generator = torch.Generator().manual_seed(len(tags))
    crf = randomize(CRF(tags).double(), generator, scale=2.0)
    lengths = [4, 1, 3, 4, 2]
    emissions = 2 * torch.randn(len(lengths), 4, len(tags), generator=generator, dtype=torch.float64)  # (B, T, K)
    decoded = crf.decode(emissions, lengths_to_mask(lengths, 4))
    for row, length in enumerate(lengths):
        paths, scores = all_path_scores(crf, emissions[row, :length].numpy(), valid_only=True)
        assert decoded[row] == paths[scores.argmax()].tolist(), row


def test_unconstrained_viterbi_agrees_with_pytorch_crf_on_long_sequences():
    # Brute force stops at T=4; with every transition allowed our Viterbi must equal pytorch-crf's.
    generator = torch.Generator().manual_seed(9)
    crf = randomize(CRF(BIOES_MIXED), generator)
    for allowed in (crf.start_ok, crf.trans_ok, crf.end_ok):
        allowed.fill_(True)
    lengths = [40, 1, 17, 33]
    emissions = torch.randn(len(lengths), 40, len(BIOES_MIXED), generator=generator)
    mask = lengths_to_mask(lengths, 40)
    assert crf.decode(emissions, mask) == crf.torch_crf.decode(emissions, mask)


def test_decode_resists_huge_emissions_for_invalid_tags():
    crf = CRF(BIOES)
    emissions = torch.zeros(1, 3, len(BIOES))
    emissions[0, :, BIOES.index("I-PER")] = 1e30  # every token screams I-PER, which cannot start or end
    path = crf.decode(emissions, torch.ones(1, 3, dtype=torch.bool))[0]
    assert is_valid_path(BIOES, [BIOES[i] for i in path])
    assert [BIOES[i] for i in path] == ["B-PER", "I-PER", "E-PER"]


def test_batched_decode_equals_one_at_a_time():
    generator = torch.Generator().manual_seed(5)
    crf = randomize(CRF(BIOES_MIXED), generator)
    lengths = [7, 1, 4, 2, 7, 5]
    emissions = torch.randn(len(lengths), 7, len(BIOES_MIXED), generator=generator)  # (B, T, K)
    mask = lengths_to_mask(lengths, 7)
    # Garbage in the padding must not leak into real positions.
    emissions = torch.where(mask.unsqueeze(2), emissions, torch.full_like(emissions, 1e4))
    batched = crf.decode(emissions, mask)
    assert [len(path) for path in batched] == lengths
    for row, length in enumerate(lengths):
        alone = crf.decode(emissions[row : row + 1, :length], torch.ones(1, length, dtype=torch.bool))
        assert batched[row] == alone[0], row


TYPE_NAMES = ["PER", "GPE.NAM", "ORG-X"]


@st.composite
def tag_sets(draw):
    scheme = draw(st.sampled_from(["BIO", "BIOES", "BMES"]))
    types = TYPE_NAMES[: draw(st.integers(1, 3))]
    prefixes = {"BIO": "BI", "BIOES": "BIES", "BMES": "BMES"}[scheme]
    tags = [f"{p}-{t}" for t in types for p in prefixes] + ([] if scheme == "BMES" else ["O"])
    return draw(st.permutations(tags))


@settings(max_examples=60, deadline=None)
@given(
    tags=tag_sets(),
    lengths=st.lists(st.integers(1, 8), min_size=1, max_size=4),
    scale=st.sampled_from([1.0, 100.0, 1e4]),
    quantize=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_decoded_paths_are_always_valid(tags, lengths, scale, quantize, seed):
    rng = np.random.default_rng(seed)
    crf = CRF(tags)
    with torch.no_grad():  # learned transitions can be large too, and favour invalid moves
        for param in crf.parameters():
            param.copy_(torch.from_numpy(rng.normal(0, scale, param.shape)))
    seq_len = max(lengths)
    emissions = rng.normal(0, scale, (len(lengths), seq_len, len(tags)))  # (B, T, K)
    if quantize:  # many exact ties
        emissions = np.round(emissions / scale)
    decoded = crf.decode(torch.from_numpy(emissions).float(), lengths_to_mask(lengths, seq_len))
    assert [len(path) for path in decoded] == lengths
    for path in decoded:
        assert is_valid_path(tags, [tags[i] for i in path]), [tags[i] for i in path]


# ---------------------------------------------------------------- allowed_transitions and tag parsing


def test_allowed_transitions_bio():
    start_ok, trans_ok, end_ok = allowed_transitions(BIO)
    assert start_ok.dtype == trans_ok.dtype == end_ok.dtype == torch.bool
    assert start_ok.shape == end_ok.shape == (5,) and trans_ok.shape == (5, 5)
    i = BIO.index
    assert not trans_ok[i("O"), i("I-PER")]
    assert trans_ok[i("B-PER"), i("I-PER")]
    assert trans_ok[i("I-PER"), i("I-PER")]
    assert not trans_ok[i("B-PER"), i("I-LOC")]
    assert not trans_ok[i("I-LOC"), i("I-PER")]
    assert trans_ok[i("I-PER"), i("B-LOC")] and trans_ok[i("O"), i("B-PER")]
    assert not start_ok[i("I-PER")] and start_ok[i("B-PER")] and start_ok[i("O")]
    assert end_ok.all()


def test_allowed_transitions_bmes_and_bioes():
    start_ok, trans_ok, end_ok = allowed_transitions(BMES)
    i = BMES.index
    assert not start_ok[i("M-GPE.NAM")] and not start_ok[i("E-GPE.NAM")]
    assert start_ok[i("B-GPE.NAM")] and start_ok[i("S-GPE.NAM")]
    assert not end_ok[i("B-GPE.NAM")] and not end_ok[i("M-GPE.NAM")]
    assert end_ok[i("E-GPE.NAM")] and end_ok[i("S-GPE.NAM")]
    assert trans_ok[i("B-GPE.NAM"), i("M-GPE.NAM")] and trans_ok[i("M-GPE.NAM"), i("E-GPE.NAM")]
    assert not trans_ok[i("B-GPE.NAM"), i("S-GPE.NAM")] and not trans_ok[i("E-GPE.NAM"), i("M-GPE.NAM")]

    _, trans_ok, _ = allowed_transitions(BIOES_MIXED)
    j = BIOES_MIXED.index
    # The type is everything after the first '-': ORG-X is one type, distinct from LOC.
    assert trans_ok[j("B-ORG-X"), j("I-ORG-X")] and trans_ok[j("I-ORG-X"), j("E-ORG-X")]
    assert not trans_ok[j("B-ORG-X"), j("E-LOC")] and not trans_ok[j("B-LOC"), j("O")]
    assert trans_ok[j("E-LOC"), j("S-ORG-X")] and not trans_ok[j("O"), j("I-LOC")]


@pytest.mark.parametrize("bad", ["X-PER", "BPER", "B-", "o"])
def test_unknown_prefix_raises(bad):
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        allowed_transitions(["O", "B-PER", bad])
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        CRF(["O", "B-PER", bad])


def test_tag_set_without_one_token_path_raises():
    # Only B-/E-: no one-token sentence can be tagged, so decoding could not promise a valid path.
    with pytest.raises(ValueError, match="one-token"):
        CRF(["B-PER", "E-PER"])


# ---------------------------------------------------------------- devices


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    generator = torch.Generator().manual_seed(11)
    crf = randomize(CRF(BIOES_MIXED, constrain_training=True), generator)
    lengths = [6, 1, 3]
    emissions = torch.randn(3, 6, len(BIOES_MIXED), generator=generator)
    gold = torch.zeros(3, 6, dtype=torch.long).fill_(BIOES_MIXED.index("O"))
    mask = lengths_to_mask(lengths, 6)
    cpu_nll = crf.neg_log_likelihood(emissions, gold, mask)
    cpu_paths = crf.decode(emissions, mask)
    crf.cuda()
    cuda_nll = crf.neg_log_likelihood(emissions.cuda(), gold.cuda(), mask.cuda())
    assert cuda_nll.item() == pytest.approx(cpu_nll.item(), rel=1e-5)
    assert crf.decode(emissions.cuda(), mask.cuda()) == cpu_paths


# ---------------------------------------------------------------- decoding a sequence piece by piece


def streamed(crf: CRF, emissions: np.ndarray, cuts: list[int], limit: int = 4096) -> tuple[list[int], int]:
    """The tags of emissions (T, K) pushed at `cuts` (sorted positions), and the longest unsettled tail."""
    decoder = crf.streaming(limit)
    tags, longest = [], 0
    for a, b in zip([0, *cuts], [*cuts, len(emissions)]):
        tags += decoder.push(emissions[a:b])
        longest = max(longest, len(decoder.pointers))
    return tags + decoder.finish(), longest


@settings(max_examples=80, deadline=None)
@given(
    tags=tag_sets(),
    length=st.integers(1, 60),
    scale=st.sampled_from([1.0, 10.0]),
    quantize=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_streamed_viterbi_equals_decoding_the_whole(tags, length, scale, quantize, seed):
    """Pushed in random pieces (empty ones too), the tags are `decode`'s over the whole sequence,
    ties included: nothing is settled before every later path goes through it."""
    rng = np.random.default_rng(seed)
    crf = randomize(CRF(tags), torch.Generator().manual_seed(seed % 1000), scale=scale)
    emissions = rng.normal(0, scale, (length, len(tags))).astype(np.float32)
    if quantize:
        emissions = np.round(emissions / scale).astype(np.float32)
    whole = crf.decode(torch.from_numpy(emissions)[None], torch.ones(1, length, dtype=torch.bool))[0]
    cuts = sorted(rng.integers(0, length + 1, size=rng.integers(0, 6)).tolist())
    assert streamed(crf, emissions, cuts)[0] == whole


def test_streamed_viterbi_keeps_a_short_tail_and_starts_again_after_finish():
    """On NER-like emissions (mostly O) the paths meet within a few positions, so the unsettled
    tail stays short however long the sequence; after `finish` the next push is a new sequence."""
    generator = torch.Generator().manual_seed(3)
    crf = randomize(CRF(BIOES), generator)
    rng = np.random.default_rng(3)
    emissions = rng.normal(0, 1, (5000, len(BIOES))).astype(np.float32)
    emissions[:, BIOES.index("O")] += 3.0
    whole = crf.decode(torch.from_numpy(emissions)[None], torch.ones(1, 5000, dtype=torch.bool))[0]
    tags, longest = streamed(crf, emissions, list(range(128, 5000, 128)))
    assert tags == whole and longest < 128
    decoder = crf.streaming()
    first = decoder.push(emissions[:10]) + decoder.finish()
    second = decoder.push(emissions[10:30]) + decoder.finish()
    assert decoder.finish() == []  # nothing pushed since: an empty sequence
    assert first == crf.decode(torch.from_numpy(emissions[None, :10]), torch.ones(1, 10, dtype=torch.bool))[0]
    assert second == crf.decode(torch.from_numpy(emissions[None, 10:30]), torch.ones(1, 20, dtype=torch.bool))[0]


def test_a_tail_whose_paths_never_meet_is_settled_at_the_limit():
    """Two entity types whose paths never meet (every step stays inside either type): memory is
    bounded by `limit`; the forced settling is counted, and the tags stay a valid sequence."""
    crf = CRF(BIO)
    emissions = np.full((200, len(BIO)), -50.0, dtype=np.float32)
    emissions[:, BIO.index("I-PER")] = emissions[:, BIO.index("I-LOC")] = 10.0
    emissions[0, BIO.index("B-PER")] = emissions[0, BIO.index("B-LOC")] = 10.0
    for a in range(0, 200, 30):  # a growing lead for each type in turn: the best path swaps type every 30
        emissions[a:a + 30, BIO.index("I-PER" if a % 60 else "I-LOC")] += 0.5 * (a // 30 + 1)
    decoder = crf.streaming(limit=16)
    tags, longest = [], 0
    for a in range(0, 200, 8):
        tags += decoder.push(emissions[a:a + 8])
        longest = max(longest, len(decoder.pointers))
    tags += decoder.finish()
    assert decoder.forced > 0 and longest <= 16 + 8 and len(tags) == 200
    assert is_valid_path(BIO, [BIO[i] for i in tags])


# ---------------------------------------------------------------- marginals and entity probabilities


def reference_entities(path: list[str]) -> set[tuple[int, int, str]]:
    """(start, end exclusive, type) of a valid path, read from the schemes' definition: B- or S-
    opens an entity, which runs on over the I-, M- and E- tags of its type that follow."""
    found, i = set(), 0
    while i < len(path):
        prefix, _, kind = path[i].partition("-")
        if prefix in ("B", "S"):
            j = i + 1
            while prefix != "S" and j < len(path) and path[j][0] in "IME" and path[j][2:] == kind:
                j += 1
                if path[j - 1][0] == "E":
                    break
            found.add((i, j, kind))
            i = j
        else:
            i += 1
    return found


def brute_force(crf: CRF, emissions: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Every valid path of one sentence (N, L) and its probability (N,)."""
    paths, scores = all_path_scores(crf, emissions.numpy(), valid_only=True)
    return paths, np.exp(scores - logsumexp(scores))


@pytest.mark.parametrize("tags", [BIO, BIOES, BMES, BIOES_MIXED], ids=["BIO", "BIOES", "BMES", "BIOES-mixed"])
def test_marginals_and_entity_probabilities_match_brute_force(tags):
    generator = torch.Generator().manual_seed(len(tags))
    crf = randomize(CRF(tags).double(), generator)
    lengths = [4, 1, 3] if len(tags) < 9 else [3, 1, 2]
    seq_len = max(lengths)
    emissions = torch.randn(len(lengths), seq_len, len(tags), generator=generator, dtype=torch.float64) * 2
    mask = lengths_to_mask(lengths, seq_len)
    marginals = crf.marginals(emissions, mask)
    paths = crf.decode(emissions, mask)
    scores = crf.entity_probabilities(emissions, mask, paths)
    for row, length in enumerate(lengths):
        every, probs = brute_force(crf, emissions[row, :length])
        expected = np.zeros((length, len(tags)))
        for path, p in zip(every, probs):
            expected[np.arange(length), path] += p
        np.testing.assert_allclose(marginals[row, :length].numpy(), expected, atol=1e-9)
        assert marginals[row, length:].abs().sum() == 0  # padding
        decoded = [tags[i] for i in paths[row]]
        entities = sorted(reference_entities(decoded))
        assert len(scores[row]) == len(entities)
        by_start = dict(zip([(s, e, k) for s, e, k in entities], scores[row]))
        for entity, score in by_start.items():
            mass = sum(p for path, p in zip(every, probs) if entity in reference_entities([tags[i] for i in path]))
            assert score == pytest.approx(mass, abs=1e-9), (decoded, entity)


@pytest.mark.parametrize("tags", [BIO, BIOES, BMES, BIOES_MIXED], ids=["BIO", "BIOES", "BMES", "BIOES-mixed"])
def test_the_numpy_entity_probabilities_equal_the_torch_ones(tags):
    """crf_numpy is the deliberate second copy of the forward-backward (an export's scores, without
    torch): its forbidden score is the torch CRF's, and its probabilities are the torch CRF's."""
    from nerkit.model import crf as torch_crf
    from nerkit.model.crf_numpy import FORBIDDEN, entity_probabilities, masked_scores

    assert torch_crf._FORBIDDEN_IN_LIKELIHOOD == FORBIDDEN
    generator = torch.Generator().manual_seed(7 + len(tags))
    crf = randomize(CRF(tags).double(), generator, scale=2.0)
    lengths = [9, 4, 1, 6]
    emissions = torch.randn(len(lengths), 9, len(tags), generator=generator, dtype=torch.float64) * 3
    mask = lengths_to_mask(lengths, 9)
    paths = crf.decode(emissions, mask)
    scores = masked_scores(tags, *(p.detach().numpy() for p in (crf.torch_crf.start_transitions,
                                                                crf.torch_crf.transitions, crf.torch_crf.end_transitions)))
    for temperature in (1.0, 1.7):
        expected = crf.entity_probabilities(emissions, mask, paths, temperature)
        found = entity_probabilities(tags, scores, emissions.numpy(), lengths, paths, temperature)
        assert any(expected) and [len(row) for row in found] == [len(row) for row in expected]
        for a, b in zip(found, expected):
            assert a == pytest.approx(b, abs=1e-12)


def test_marginals_sum_to_one_and_forbid_what_decoding_forbids():
    generator = torch.Generator().manual_seed(5)
    crf = randomize(CRF(BIO), generator, scale=3.0)
    emissions = torch.randn(3, 7, len(BIO), generator=generator) * 5
    mask = lengths_to_mask([7, 4, 1], 7)
    marginals = crf.marginals(emissions, mask)
    sums = marginals.sum(2)
    torch.testing.assert_close(sums[mask], torch.ones(int(mask.sum()), dtype=sums.dtype))
    assert (marginals[:, 0, [BIO.index("I-PER"), BIO.index("I-LOC")]] == 0).all()  # no I- can open a sentence


def test_entity_probabilities_batched_equal_one_at_a_time_and_the_path_probability():
    generator = torch.Generator().manual_seed(11)
    crf = randomize(CRF(BIOES_MIXED), generator)
    lengths = [9, 3, 6, 1]
    emissions = torch.randn(len(lengths), 9, len(BIOES_MIXED), generator=generator) * 3
    mask = lengths_to_mask(lengths, 9)
    paths = crf.decode(emissions, mask)
    batched = crf.entity_probabilities(emissions, mask, paths)
    for row, length in enumerate(lengths):
        alone = crf.entity_probabilities(emissions[row:row + 1, :length], mask[row:row + 1, :length], [paths[row]])
        assert alone[0] == pytest.approx(batched[row], abs=1e-9)
        # the best path's own probability bounds each of its entities from below
        path_prob = crf.path_probabilities(emissions[row:row + 1, :length], mask[row:row + 1, :length], [paths[row]])
        assert all(path_prob[0] - 1e-6 <= p <= 1 for p in batched[row])


def test_path_probability_is_exp_score_minus_log_z():
    generator = torch.Generator().manual_seed(2)
    crf = randomize(CRF(BIOES).double(), generator)
    lengths = [4, 2]
    emissions = torch.randn(2, 4, len(BIOES), generator=generator, dtype=torch.float64)
    mask = lengths_to_mask(lengths, 4)
    paths = crf.decode(emissions, mask)
    found = crf.path_probabilities(emissions, mask, paths)
    for row, length in enumerate(lengths):
        every, probs = brute_force(crf, emissions[row, :length])
        index = next(i for i, p in enumerate(every) if list(p) == paths[row])
        assert found[row] == pytest.approx(probs[index], abs=1e-9)
        assert probs[index] == pytest.approx(probs.max())  # the decoded path is the most probable


def test_a_temperature_divides_every_score():
    """At temperature 2 the probabilities are those of a CRF whose every score is halved."""
    generator = torch.Generator().manual_seed(4)
    crf = randomize(CRF(BIOES), generator, scale=2.0)
    halved = CRF(BIOES)
    halved.load_state_dict({k: v / 2 for k, v in crf.state_dict().items()})
    emissions = torch.randn(2, 6, len(BIOES), generator=generator) * 4
    mask = lengths_to_mask([6, 3], 6)
    paths = crf.decode(emissions, mask)
    assert paths == halved.decode(emissions / 2, mask)  # the best path does not move
    warm, cool = crf.entity_probabilities(emissions, mask, paths, 2.0), halved.entity_probabilities(emissions / 2, mask, paths)
    assert [len(row) for row in warm] == [len(row) for row in cool] and any(warm)
    for a, b in zip(warm, cool):
        assert a == pytest.approx(b, abs=1e-6)
    torch.testing.assert_close(crf.marginals(emissions, mask, temperature=2.0), halved.marginals(emissions / 2, mask))
    assert crf.path_probabilities(emissions, mask, paths, 2.0) == pytest.approx(
        halved.path_probabilities(emissions / 2, mask, paths), abs=1e-9)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_scores_match_cpu():
    generator = torch.Generator().manual_seed(9)
    crf = randomize(CRF(BIOES_MIXED), generator)
    emissions = torch.randn(3, 40, len(BIOES_MIXED), generator=generator) * 3
    mask = lengths_to_mask([40, 17, 1], 40)
    paths = crf.decode(emissions, mask)
    on_gpu = crf.cuda()
    assert on_gpu.decode(emissions.cuda(), mask.cuda()) == paths
    cpu = CRF(BIOES_MIXED)
    cpu.load_state_dict({k: v.cpu() for k, v in on_gpu.state_dict().items()})
    for a, b in zip(on_gpu.entity_probabilities(emissions.cuda(), mask.cuda(), paths, 1.3),
                    cpu.entity_probabilities(emissions, mask, paths, 1.3)):
        assert a == pytest.approx(b, abs=1e-9)
    torch.testing.assert_close(on_gpu.marginals(emissions.cuda(), mask.cuda()).cpu(), cpu.marginals(emissions, mask))


@pytest.mark.parametrize("tags", [BIO, BIOES, BMES, BIOES_MIXED], ids=["BIO", "BIOES", "BMES", "BIOES-mixed"])
def test_span_probabilities_and_allowed_paths_match_brute_force(tags):
    """The audit's exact scores: every span's probability of being exactly one entity of each type,
    and the mass of the paths through allowed tags (a labelled path, or a partial annotation), each
    against the sum over every valid path."""
    generator = torch.Generator().manual_seed(3 + len(tags))
    crf = randomize(CRF(tags).double(), generator)
    lengths = [4, 1, 3] if len(tags) < 9 else [3, 1, 2]
    seq_len = max(lengths)
    emissions = torch.randn(len(lengths), seq_len, len(tags), generator=generator, dtype=torch.float64) * 2
    mask = lengths_to_mask(lengths, seq_len)
    types = sorted({t.split("-", 1)[1] for t in tags if t != "O"})
    for temperature in (1.0, 1.6):
        band = crf.span_log_probabilities(emissions, mask, 3, temperature).exp()  # (B, types, T, W)
        allowed = torch.rand(emissions.shape, generator=generator) < 0.6
        allowed[..., 0] = True  # every position allows something
        allowed |= ~mask[..., None]
        allowed_lp = crf.allowed_log_probabilities(emissions, mask, allowed, temperature)
        for row, length in enumerate(lengths):
            every, probs = brute_force(crf_at(crf, temperature), emissions[row, :length] / temperature)
            for k, kind in enumerate(types):
                for s in range(seq_len):
                    for w in range(3):
                        if s + w + 1 > length:
                            assert band[row, k, s, w] == 0
                            continue
                        mass = sum(p for path, p in zip(every, probs)
                                   if (s, s + w + 1, kind) in reference_entities([tags[i] for i in path]))
                        assert band[row, k, s, w].item() == pytest.approx(mass, abs=1e-9), (row, kind, s, w)
            through = sum(p for path, p in zip(every, probs) if all(allowed[row, t, i] for t, i in enumerate(path)))
            assert allowed_lp[row].exp().item() == pytest.approx(through, abs=1e-9)


def crf_at(crf: CRF, temperature: float) -> CRF:
    """A copy of `crf` with its transition scores divided by `temperature` (brute force's reference at it)."""
    import copy

    scaled = copy.deepcopy(crf)
    with torch.no_grad():
        for p in (scaled.torch_crf.start_transitions, scaled.torch_crf.transitions, scaled.torch_crf.end_transitions):
            p /= temperature
    return scaled
