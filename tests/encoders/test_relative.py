"""Tests for the relative-position encoder (TENER, Transformer-XL and Shaw attention): the efficient
attention against a naive loop that follows each paper term by term, the direction and shift properties
of relative scores, padding invariance, gradients, and long inputs."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from nerkit.config import RELATIVE_ATTENTIONS, TenerOptions
from nerkit.errors import ConfigError
from nerkit.model.encoders import ENCODERS
from nerkit.model.encoders.attention import SinusoidTable
from nerkit.model.encoders.relative import VARIANTS, relative_attention
from nerkit.model.encoders.transformer import Transformer

HEADS, HEAD_DIM = 2, 4
D_MODEL = HEADS * HEAD_DIM
CLIP = 2  # Shaw's k, small so that the test lengths are clipped
ATTENTIONS = RELATIVE_ATTENTIONS


def make_batch(lengths, dim, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), max(lengths), dim, generator=generator, dtype=torch.float64)
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]  # (B, L)
    return x, mask


def make_attention(name, seed=0):
    torch.manual_seed(seed)
    attention = relative_attention(VARIANTS[name], HEADS, HEAD_DIM, attn_dropout=0.0, max_distance=CLIP)
    return attention.double()


def paper_sinusoid(p, dim):
    """R_p as written in the papers: [..., sin(p / 10000^(2i/d)), cos(p / 10000^(2i/d)), ...]."""
    values = []
    for i in range(dim // 2):
        values += [math.sin(p / 10000 ** (2 * i / dim)), math.cos(p / 10000 ** (2 * i / dim))]
    return torch.tensor(values, dtype=torch.float64)


# Each paper's choices, written out here rather than read from the module under test.
PAPERS = {
    "tener": SimpleNamespace(key_projection=False, scale=False, learned_table=False, position_projection=False,
                             global_biases=True, value_positions=False),
    "xl": SimpleNamespace(key_projection=True, scale=True, learned_table=False, position_projection=True,
                          global_biases=True, value_positions=False),
    "shaw": SimpleNamespace(key_projection=True, scale=True, learned_table=True, position_projection=False,
                            global_biases=False, value_positions=True),
    "rope": SimpleNamespace(key_projection=True, scale=True, learned_table=False, position_projection=False,
                            global_biases=False, value_positions=False, rotary=True),
    "alibi": SimpleNamespace(key_projection=True, scale=True, learned_table=False, position_projection=False,
                             global_biases=False, value_positions=False, alibi=True),
}


def paper_rotation(vector, p):
    """RoPE as written: each pair (v[2m], v[2m+1]) turned by the angle p * 10000^(-2m/d)."""
    d, out = vector.numel(), vector.clone()
    for m in range(d // 2):
        theta = p * 10000 ** (-2 * m / d)
        a, b = vector[2 * m], vector[2 * m + 1]
        out[2 * m], out[2 * m + 1] = a * math.cos(theta) - b * math.sin(theta), a * math.sin(theta) + b * math.cos(theta)
    return out


def naive_attention(attention, name, x, mask, memory=None):
    """One (query, key) pair at a time, each term spelled out; softmax over the real keys only.
    Returns the outputs of the real positions, (N, d_model), sentence by sentence. With `memory`
    (B, M, d_model), all real, the keys are [memory ; sentence] and query i is at position M + i."""
    variant = PAPERS[name]
    positions = attention.positions
    d = HEAD_DIM
    rows = []
    for b in range(x.size(0)):
        n = int(mask[b].sum())
        context = x[b, :n] if memory is None else torch.cat([memory[b], x[b, :n]])  # (M + n, d_model)
        shift = context.size(0) - n  # M
        for i in range(n):
            heads = []
            for h in range(HEADS):
                head = slice(h * d, (h + 1) * d)
                q_i = (attention.query.weight @ x[b, i])[head]
                if getattr(variant, "rotary", False):
                    q_i = paper_rotation(q_i, shift + i)

                def key(j):
                    k_j = (attention.key.weight @ context[j])[head] if variant.key_projection else context[j, head]
                    return paper_rotation(k_j, j) if getattr(variant, "rotary", False) else k_j

                def position_key(j):
                    i_at = shift + i  # the query's position among the keys: distances are i_at - j
                    if getattr(variant, "rotary", False) or getattr(variant, "alibi", False):
                        return torch.zeros(d, dtype=x.dtype)  # no position key: RoPE rotates, ALiBi biases
                    if variant.learned_table:
                        # Shaw: a^K_ij = w^K_{clip(j - i, k)}; the table holds w reversed (row k + clip(i-j)).
                        return positions.key_table[CLIP + max(-CLIP, min(CLIP, i_at - j))]
                    if variant.position_projection:  # XL: W_{k,R} R_{i-j}, R of width d_model
                        return (positions.projection.weight @ paper_sinusoid(i_at - j, D_MODEL))[head]
                    return paper_sinusoid(i_at - j, d)  # TENER: R_{t-j} of width d_k, no projection

                scores = []
                for j in range(context.size(0)):
                    k_j, r_ij = key(j), position_key(j)
                    score = q_i @ k_j + q_i @ r_ij  # (a) content + (b) content-dependent position
                    if variant.global_biases:
                        u, v = attention.content_bias[h], positions.position_bias[h]
                        score = score + u @ k_j + v @ r_ij  # (c) global content + (d) global position bias
                    if variant.scale:
                        score = score / math.sqrt(d)
                    if getattr(variant, "alibi", False):  # the paper's slopes 2^(-8h/H), h from 1
                        score = score - 2.0 ** (-8.0 * (h + 1) / HEADS) * abs(shift + i - j)
                    scores.append(score)
                alpha = torch.softmax(torch.stack(scores), dim=0)  # (M + n,)
                z = 0
                for j in range(context.size(0)):
                    value = (attention.value.weight @ context[j])[head]
                    if variant.value_positions:  # Shaw's a^V_ij
                        value = value + positions.value_table[CLIP + max(-CLIP, min(CLIP, shift + i - j))]
                    z = z + alpha[j] * value
                heads.append(z)
            rows.append(attention.output.weight @ torch.cat(heads) + attention.output.bias)
    return torch.stack(rows)


@pytest.mark.parametrize("name", ATTENTIONS)
def test_efficient_attention_equals_naive_reference(name):
    attention = make_attention(name)
    x, mask = make_batch([6, 3, 5], D_MODEL)
    fast = attention(x, mask)[mask]  # (N, d_model)
    torch.testing.assert_close(fast, naive_attention(attention, name, x, mask), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", ATTENTIONS)
def test_attention_over_memory_equals_naive_reference(name):
    """Transformer-XL's memory: keys [memory ; segment], every (query, key) distance built by hand as
    (M + i) - j, and the same weights as without memory."""
    attention = make_attention(name, seed=4)
    x, mask = make_batch([6, 3, 5], D_MODEL, seed=4)
    memory, _ = make_batch([4, 4, 4], D_MODEL, seed=5)
    memory_mask = torch.ones(3, 4, dtype=torch.bool)
    fast = attention(x, mask, None, memory, memory_mask)[mask]  # (N, d_model)
    torch.testing.assert_close(fast, naive_attention(attention, name, x, mask, memory), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", ATTENTIONS)
def test_efficient_attention_gradients_equal_naive_reference(name):
    attention = make_attention(name, seed=1)
    x, mask = make_batch([5, 2, 4], D_MODEL, seed=1)
    x.requires_grad_(True)
    readout = torch.randn(int(mask.sum()), D_MODEL, dtype=torch.float64)  # weighs every output differently
    inputs = [x, *attention.parameters()]
    fast = torch.autograd.grad((attention(x, mask)[mask] * readout).sum(), inputs)
    naive = torch.autograd.grad((naive_attention(attention, name, x, mask) * readout).sum(), inputs)
    for got, expected in zip(fast, naive):
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)


def test_tener_relative_score_tells_left_from_right():
    # Absolute sinusoids give P_i . P_{i+k} = P_i . P_{i-k}; TENER's R_k keeps the sign (sin is odd).
    table = SinusoidTable(HEAD_DIM)(-5, 6, like=torch.zeros((), dtype=torch.float64))  # (11, d): -5..5
    q = torch.randn(HEAD_DIM, dtype=torch.float64)
    for k in range(1, 6):
        assert abs(q @ table[5 + k] - q @ table[5 - k]) > 1e-4
    # And through the module: identical content everywhere, so scores differ only by position.
    attention = make_attention("tener")
    q = torch.randn(1, HEADS, 1, HEAD_DIM, dtype=torch.float64).expand(1, HEADS, 7, HEAD_DIM)
    logits = attention.positions.logits(q)[0, 0]  # (L, L)
    assert not torch.allclose(logits, logits.T)


@pytest.mark.parametrize("name", ATTENTIONS)
def test_relative_scores_are_invariant_to_shifting_positions(name):
    attention = make_attention(name)
    sentence, _ = make_batch([5], D_MODEL, seed=2)
    context, _ = make_batch([9], D_MODEL, seed=3)
    shift = 3
    shifted = torch.cat([context[:, :shift], sentence, context[:, shift:]], dim=1)  # sentence at 3..7
    with torch.no_grad():
        alone = attention.logits(sentence)  # (1, H, 5, 5)
        inside = attention.logits(shifted)[:, :, shift : shift + 5, shift : shift + 5]
    torch.testing.assert_close(inside, alone, atol=1e-10, rtol=1e-10)


def make_encoder(name, **overrides):
    torch.manual_seed(0)
    config = TenerOptions(
        n_heads=HEADS, head_dim=HEAD_DIM, num_layers=2, dropout=0.0, attn_dropout=0.0,
        attention=name, max_relative_distance=CLIP, **overrides,
    )
    return Transformer(5, config).double()


@pytest.mark.parametrize("name", ATTENTIONS)
def test_all_padding_row_stays_finite(name):
    encoder = make_encoder(name)
    x, mask = make_batch([4, 1], 5)
    mask[1] = False  # an empty sentence: every key of its queries is padding
    x.requires_grad_(True)
    out = encoder(x, mask)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in encoder.parameters())


@pytest.mark.parametrize("name", ATTENTIONS)
def test_every_parameter_gets_a_gradient(name):
    encoder = make_encoder(name)
    x, mask = make_batch([8, 6], 5)  # longer than CLIP + 1, so every row of Shaw's tables is used
    # A random readout: the plain sum of a LayerNorm output has zero gradient.
    readout = torch.randn(2, 8, encoder.output_dim, dtype=torch.float64)
    (encoder(x, mask) * readout).sum().backward()
    for param_name, param in encoder.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, param_name
        if param_name.endswith("_table"):  # each distance row on its own
            assert (param.grad.abs().sum(-1) > 0).all(), param_name


def test_defaults_are_tener_on_msra():
    config = TenerOptions()
    encoder = Transformer(100, config)
    assert encoder.output_dim == 480
    attention = encoder.layers[0].attention
    assert attention.key is None and attention.scale == 1.0  # no key projection, un-scaled softmax
    assert encoder.layers[0].feed_forward[0].out_features == 960
    assert ENCODERS["tener"] is Transformer


def test_paper_choices_can_be_overridden():
    attention = make_encoder("tener", key_projection=True, scale=True).layers[0].attention
    assert attention.key is not None and attention.scale == pytest.approx(1 / math.sqrt(HEAD_DIM))
    assert make_encoder("xl").layers[0].attention.key is not None


def test_unknown_attention_names_the_closest():
    from nerkit.config import build_config

    with pytest.raises(ConfigError, match="did you mean 'shaw'"):
        build_config({"encoder": {"name": "tener", "attention": "shaww"}})


def test_long_input_grows_the_table():
    torch.manual_seed(0)
    encoder = Transformer(3, TenerOptions(n_heads=1, head_dim=4, num_layers=1)).eval()
    sinusoids = encoder.layers[0].attention.positions.sinusoids
    x, mask = torch.randn(1, 3000, 3), torch.ones(1, 3000, dtype=torch.bool)
    short_rows = sinusoids(-9, 10, like=x).clone()
    with torch.no_grad():
        out = encoder(x, mask)
    assert out.shape == (1, 3000, 4) and torch.isfinite(out).all()
    assert sinusoids.radius >= 2999
    torch.testing.assert_close(sinusoids(-9, 10, like=x), short_rows, atol=0, rtol=0)
