"""Tests for the vanilla Transformer encoder: its attention against a naive loop over query/key pairs,
the properties of absolute sinusoids (distance without direction), padding invariance and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from nerkit.config import TransformerOptions
from nerkit.model.encoders import ENCODERS
from nerkit.model.encoders.attention import MultiHeadAttention, SinusoidTable, sinusoid
from nerkit.model.encoders.transformer import Transformer

HEADS, HEAD_DIM = 2, 4
D_MODEL = HEADS * HEAD_DIM


def make_batch(lengths, dim, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), max(lengths), dim, generator=generator, dtype=torch.float64)
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]  # (B, L)
    return x, mask


def make_encoder(**overrides):
    torch.manual_seed(0)
    config = TransformerOptions(n_heads=HEADS, head_dim=HEAD_DIM, dropout=0.0, attn_dropout=0.0, **overrides)
    return Transformer(5, config).double()


def test_sinusoid_follows_vaswani():
    table = sinusoid(torch.arange(-3, 40), 6)  # (43, 6)
    for row, p in enumerate(range(-3, 40)):
        for i in range(3):
            angle = p / 10000 ** (2 * i / 6)
            assert table[row, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert table[row, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)


def test_absolute_sinusoid_dot_product_depends_on_distance_only_and_not_direction():
    table = sinusoid(torch.arange(0, 200), 16)  # (200, 16): P_0 .. P_199
    for k in range(0, 30):
        forward = (table[30:170] * table[30 + k : 170 + k]).sum(-1)  # P_i . P_{i+k} for i = 30..169
        backward = (table[30:170] * table[30 - k : 170 - k]).sum(-1)  # P_i . P_{i-k}
        torch.testing.assert_close(forward, forward[:1].expand_as(forward), atol=1e-9, rtol=0)  # not on i
        torch.testing.assert_close(backward, forward, atol=1e-9, rtol=0)  # symmetric in k


def test_sinusoid_table_grows_and_keeps_its_rows():
    table = SinusoidTable(8, radius=4)
    like = torch.zeros((), dtype=torch.float64)
    before = table(-3, 4, like).clone()
    grown = table(0, 50, like)  # beyond the radius
    assert grown.shape == (50, 8) and table.radius >= 49
    torch.testing.assert_close(table(-3, 4, like), before, atol=0, rtol=0)
    torch.testing.assert_close(grown, sinusoid(torch.arange(50), 8), atol=0, rtol=0)
    assert table(0, 3, like.float()).dtype == torch.float32  # cast to the input's dtype on use
    assert not table.state_dict()  # derived, never saved


def naive_attention(attention, x, mask):
    """softmax_j(q_i . k_j / sqrt(d)) v_j over the real keys only, pair by pair; real positions only."""
    d = HEAD_DIM
    rows = []
    for b in range(x.size(0)):
        n = int(mask[b].sum())
        for i in range(n):
            heads = []
            for h in range(HEADS):
                head = slice(h * d, (h + 1) * d)
                q_i = (attention.query.weight @ x[b, i])[head]
                keys = [(attention.key.weight @ x[b, j])[head] for j in range(n)]
                scores = torch.stack([q_i @ k_j / math.sqrt(d) for k_j in keys])
                alpha = scores.softmax(0)
                heads.append(sum(alpha[j] * (attention.value.weight @ x[b, j])[head] for j in range(n)))
            rows.append(attention.output.weight @ torch.cat(heads) + attention.output.bias)
    return torch.stack(rows)


def test_attention_equals_naive_reference():
    torch.manual_seed(0)
    attention = MultiHeadAttention(HEADS, HEAD_DIM, attn_dropout=0.0).double()
    x, mask = make_batch([5, 2, 4], D_MODEL)
    x.requires_grad_(True)
    readout = torch.randn(int(mask.sum()), D_MODEL, dtype=torch.float64)
    fast = attention(x, mask)[mask]
    naive = naive_attention(attention, x, mask)
    torch.testing.assert_close(fast, naive, atol=1e-10, rtol=1e-10)
    inputs = [x, *attention.parameters()]
    fast_grads = torch.autograd.grad((fast * readout).sum(), inputs)
    naive_grads = torch.autograd.grad((naive * readout).sum(), inputs)
    for got, expected in zip(fast_grads, naive_grads):
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)


def test_absolute_positions_make_scores_depend_on_where_the_sentence_starts():
    # The counterpart of the relative encoder's shift-invariance test: the same check fails here.
    torch.manual_seed(0)
    attention = MultiHeadAttention(HEADS, HEAD_DIM, attn_dropout=0.0).double()
    sentence, _ = make_batch([5], D_MODEL, seed=2)
    positions = sinusoid(torch.arange(8), D_MODEL)  # (8, d_model)
    with torch.no_grad():
        at_start = attention.logits(sentence + positions[:5])
        shifted = attention.logits(sentence + positions[3:8])
    assert not torch.allclose(at_start, shifted, atol=1e-3)


def test_encoder_adds_positions_from_zero():
    encoder = make_encoder()
    seen = []
    encoder.layers[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    with torch.no_grad():
        encoder.input_projection.weight.zero_()
        encoder.input_projection.bias.zero_()
        encoder(*make_batch([6, 2], 5))
    torch.testing.assert_close(seen[0], sinusoid(torch.arange(6), D_MODEL).expand(2, 6, D_MODEL))


def test_learned_positions_add_row_t_of_the_table_to_position_t():
    """BERT's way, term by term: layer 0 reads input_projection(x)[t] + E[t] at every position t,
    whatever the batch's padding; a text longer than the table is refused."""
    encoder = make_encoder(attention="learned", max_positions=9).eval()
    seen = []
    encoder.layers[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    x, mask = make_batch([6, 2], 5)
    with torch.no_grad():
        torch.nn.init.normal_(encoder.learned_positions.weight)
        encoder(x, mask)
        W, b, E = encoder.input_projection.weight, encoder.input_projection.bias, encoder.learned_positions.weight
        for row in range(2):
            for t in range(6):
                expected = sum(W[:, i] * x[row, t, i] for i in range(5)) + b + E[t]
                torch.testing.assert_close(seen[0][row, t], expected, atol=1e-12, rtol=0)
        with pytest.raises(ValueError, match="learned positions end at 9"):
            encoder(*make_batch([10], 5))


def test_all_padding_row_stays_finite():
    encoder = make_encoder()
    x, mask = make_batch([4, 1], 5)
    mask[1] = False
    x.requires_grad_(True)
    out = encoder(x, mask)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()


def test_every_parameter_gets_a_gradient():
    encoder = make_encoder()
    x, mask = make_batch([6, 4], 5)
    # A random readout: the plain sum of a LayerNorm output has zero gradient.
    readout = torch.randn(2, 6, encoder.output_dim, dtype=torch.float64)
    (encoder(x, mask) * readout).sum().backward()
    for name, param in encoder.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_sizes_are_derived():
    encoder = Transformer(37, TransformerOptions(n_heads=3, head_dim=10, ff_ratio=2.0, num_layers=1))
    assert encoder.output_dim == 30
    assert encoder.layers[0].feed_forward[0].out_features == 60
    assert ENCODERS["transformer"] is Transformer
