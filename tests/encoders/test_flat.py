"""Tests for the FLAT encoder: the efficient attention (split W_r, queries moved into R's space, R built
per block of query rows and rebuilt in backward) against a naive reference that materialises every pair
as the paper writes it, in outputs and gradients; padding, batching, shift invariance, gradients for
every parameter; and training, saving and loading a FLAT model end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from nerkit.config import FLATOptions, load_config
from nerkit.data.corpus import read_corpus
from nerkit.errors import ConfigError
from nerkit.inference.pipeline import Pipeline
from nerkit.model.encoders import ENCODERS, LatticeWords
from nerkit.model.encoders.attention import NodeSpans
from nerkit.model.encoders.flat import FLAT

REPO = Path(__file__).resolve().parents[2]

HEADS, HEAD_DIM = 2, 4
D_MODEL = HEADS * HEAD_DIM
INPUT_DIM, WORD_DIM = 5, 3
PAPER_FUSIONS = {"four": ("hh", "ht", "th", "tt"), "two": ("hh", "tt")}  # written out, not read from flat.py


def make_encoder(fusion="four", chunk=3, seed=0, **overrides):
    torch.manual_seed(seed)
    options = dict(n_heads=HEADS, head_dim=HEAD_DIM, num_layers=2, ff_ratio=1.5, dropout=0.0, attn_dropout=0.0,
                   fusion=fusion, attention_chunk=chunk)
    config = FLATOptions(**{**options, **overrides})
    return FLAT(INPUT_DIM, config, word_dim=WORD_DIM).double()


def make_batch(chars, words, seed=0):
    """Random characters and lattices: sentence b has chars[b] characters and words[b] words, each word
    spanning 2..4 characters inside its sentence. Padding positions hold zeros, as collate makes them."""
    generator = torch.Generator().manual_seed(seed)
    batch, length, width = len(chars), max(chars), max(1, max(words))
    x = torch.randn(batch, length, INPUT_DIM, generator=generator, dtype=torch.float64)
    mask = torch.arange(length)[None, :] < torch.tensor(chars)[:, None]  # (B, T)
    x = x * mask[..., None]
    embedded = torch.randn(batch, width, WORD_DIM, generator=generator, dtype=torch.float64)
    heads = torch.zeros(batch, width, dtype=torch.long)
    tails = torch.zeros(batch, width, dtype=torch.long)
    word_mask = torch.arange(width)[None, :] < torch.tensor(words)[:, None]  # (B, W)
    for b, (n, k) in enumerate(zip(chars, words)):
        for w in range(k):
            head = int(torch.randint(0, n - 1, (1,), generator=generator))
            tail = min(n - 1, head + int(torch.randint(1, 4, (1,), generator=generator)))
            heads[b, w], tails[b, w] = head, tail
    return x, mask, LatticeWords(embedded * word_mask[..., None], heads, tails, word_mask)


def sinusoid_of(distance: torch.Tensor, dim: int) -> torch.Tensor:
    """P_d as in Vaswani et al.: P[2m] = sin(d / 10000^(2m/dim)), P[2m+1] = cos(d / 10000^(2m/dim))."""
    out = torch.empty(*distance.shape, dim, dtype=torch.float64)
    for m in range(dim // 2):
        angle = distance.double() / 10000 ** (2 * m / dim)
        out[..., 2 * m], out[..., 2 * m + 1] = torch.sin(angle), torch.cos(angle)
    return out


def naive_flat(encoder: FLAT, x, mask, lattice, fusion: str, key_projection: bool = False, scale: bool = False):
    """FLAT as the paper writes it, every pair materialised: the (B, L, L, 4 d_model) concatenation of
    the four distance encodings, W_r applied to each pair, W_R R_ij computed for each pair and head,
    and the four terms of eq. (11) added one by one. Shares the encoder's parameters."""
    batch, length, _ = x.shape
    chars = x @ encoder.char_projection.weight.T + encoder.char_projection.bias  # (B, T, D)
    words = lattice.words @ encoder.word_projection.weight.T + encoder.word_projection.bias  # (B, W, D)
    nodes = torch.cat([chars, words], dim=1)  # (B, L, D)
    positions = torch.arange(length).expand(batch, length)
    heads = torch.cat([positions, lattice.heads], dim=1)  # (B, L)
    tails = torch.cat([positions, lattice.tails], dim=1)
    node_mask = torch.cat([mask, lattice.mask], dim=1)
    distance = {  # (B, L, L) each
        "hh": heads[:, :, None] - heads[:, None, :],
        "ht": heads[:, :, None] - tails[:, None, :],
        "th": tails[:, :, None] - heads[:, None, :],
        "tt": tails[:, :, None] - tails[:, None, :],
    }
    concatenated = torch.cat([sinusoid_of(distance[k], D_MODEL) for k in PAPER_FUSIONS[fusion]], dim=-1)
    for layer in encoder.layers:
        attention, positions_module = layer.attention, layer.attention.positions
        fusion_layer, w_big_r = positions_module.fusion, positions_module.projection.weight
        relative = torch.relu(concatenated @ fusion_layer.weight.T + fusion_layer.bias)  # (B, L, L, D): R_ij
        projected = (relative @ w_big_r.T).view(batch, -1, nodes.size(1), HEADS, HEAD_DIM)  # W_R R_ij per head
        q = (nodes @ attention.query.weight.T).view(batch, -1, HEADS, HEAD_DIM)  # (B, L, H, d)
        k = nodes @ attention.key.weight.T if key_projection else nodes
        k = k.view(batch, -1, HEADS, HEAD_DIM)
        v = (nodes @ attention.value.weight.T).view(batch, -1, HEADS, HEAD_DIM)
        u, v_bias = attention.content_bias, positions_module.position_bias  # (H, d)
        a = torch.einsum("bihd,bjhd->bhij", q, k)  # q_i . k_j
        b = torch.einsum("bihd,bijhd->bhij", q, projected)  # q_i . W_R R_ij
        c = torch.einsum("hd,bjhd->bhj", u, k)[:, :, None, :]  # u . k_j, the same for every i
        d = torch.einsum("hd,bijhd->bhij", v_bias, projected)  # v . W_R R_ij
        scores = a + b + c + d
        if scale:
            scores = scores / math.sqrt(HEAD_DIM)
        scores = scores.masked_fill(~node_mask[:, None, None, :], float("-inf"))
        alpha = scores.softmax(dim=-1)  # (B, H, L, L)
        heads_out = torch.einsum("bhij,bjhd->bihd", alpha, v).reshape(batch, -1, D_MODEL)
        attended = heads_out @ attention.output.weight.T + attention.output.bias
        nodes = layer.attention_norm(nodes + attended)
        first, second = layer.feed_forward[0], layer.feed_forward[3]
        hidden = torch.relu(nodes @ first.weight.T + first.bias) @ second.weight.T + second.bias
        nodes = layer.feed_forward_norm(nodes + hidden)
    return nodes[:, :length] * mask[..., None]


CASES = [  # (fusion, attention_chunk, key_projection, scale)
    ("four", 3, False, False),
    ("four", 0, False, False),
    ("two", 3, False, False),
    ("two", 0, False, False),
    ("four", 4, True, True),
]


@pytest.mark.parametrize("fusion, chunk, key_projection, scale", CASES)
def test_efficient_equals_naive_reference_in_outputs_and_gradients(fusion, chunk, key_projection, scale):
    encoder = make_encoder(fusion, chunk, key_projection=key_projection, scale=scale).train()  # dropout 0
    x, mask, lattice = make_batch([7, 3, 5], [4, 0, 2], seed=1)  # L = 11 nodes, blocks of 3: 3 + 3 + 3 + 2
    x.requires_grad_(True)
    lattice.words.requires_grad_(True)
    readout = torch.randn(x.size(0), x.size(1), D_MODEL, dtype=torch.float64)  # weighs each output differently
    inputs = [x, lattice.words, *encoder.parameters()]
    fast = encoder(x, mask, lattice)
    naive = naive_flat(encoder, x, mask, lattice, fusion, key_projection, scale)
    torch.testing.assert_close(fast, naive, atol=1e-9, rtol=1e-9)
    fast_grads = torch.autograd.grad((fast * readout).sum(), inputs)
    naive_grads = torch.autograd.grad((naive * readout).sum(), inputs)
    names = ["x", "words"] + [name for name, _ in encoder.named_parameters()]
    for name, got, expected in zip(names, fast_grads, naive_grads):
        torch.testing.assert_close(got, expected, atol=1e-9, rtol=1e-9, msg=lambda m: f"{name}: {m}")


def test_backward_keeps_no_pairwise_position_tensor():
    # The (B, L, L, d_model) R of every pair is rebuilt in the backward pass, never saved by the forward
    # pass; the biggest thing autograd may keep is a (B, H, L, L) attention map. One block (chunk 0) so
    # that a saved R would be a single tensor of that size.
    encoder = make_encoder(chunk=0).train()
    x, mask, lattice = make_batch([7, 3, 5], [4, 0, 2])
    sizes = []

    def pack(tensor):
        sizes.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = encoder(x.requires_grad_(True), mask, lattice)
    out.sum().backward()
    batch, nodes = 3, 7 + 4
    assert sizes and max(sizes) < batch * nodes * nodes * D_MODEL / 2


def test_batched_equals_one_at_a_time():
    encoder = make_encoder(seed=2, dropout=0.3, attn_dropout=0.2).eval()
    chars, words = [7, 2, 5, 4], [4, 0, 3, 1]
    x, mask, lattice = make_batch(chars, words, seed=3)
    with torch.no_grad():
        batched = encoder(x, mask, lattice)
        for b, (n, k) in enumerate(zip(chars, words)):
            alone = LatticeWords(lattice.words[b:b + 1, :k], lattice.heads[b:b + 1, :k], lattice.tails[b:b + 1, :k],
                            lattice.mask[b:b + 1, :k])
            out = encoder(x[b:b + 1, :n], mask[b:b + 1, :n], alone)[0]
            torch.testing.assert_close(batched[b, :n], out, atol=1e-10, rtol=1e-10)
    assert (batched[~mask] == 0).all()


def test_padding_content_never_reaches_real_nodes():
    encoder = make_encoder(seed=4).eval()
    x, mask, lattice = make_batch([6, 3], [3, 1], seed=5)
    with torch.no_grad():
        clean = encoder(x, mask, lattice)
        garbage = torch.randn(x.shape, dtype=torch.float64) * 100
        noisy_x = torch.where(mask[..., None], x, garbage)
        word_garbage = torch.randn(lattice.words.shape, dtype=torch.float64) * 100
        noisy_words = torch.where(lattice.mask[..., None], lattice.words, word_garbage)
        anywhere = torch.randint(0, 3, lattice.heads.shape)
        noisy_heads = torch.where(lattice.mask, lattice.heads, anywhere)
        noisy_tails = torch.where(lattice.mask, lattice.tails, anywhere + 2)
        noisy = encoder(noisy_x, mask, LatticeWords(noisy_words, noisy_heads, noisy_tails, lattice.mask))
    torch.testing.assert_close(noisy, clean, atol=1e-10, rtol=1e-10)


def test_every_parameter_gets_a_gradient():
    encoder = make_encoder(fusion="four").train()
    x, mask, lattice = make_batch([6, 4], [3, 2], seed=6)
    readout = torch.randn(2, 6, encoder.output_dim, dtype=torch.float64)  # a plain sum of LayerNorm is flat
    (encoder(x, mask, lattice) * readout).sum().backward()
    for name, param in encoder.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    fusion = encoder.layers[0].attention.positions.fusion.weight.grad  # (D, 4D): each distance's block
    assert all(block.abs().sum() > 0 for block in fusion.split(D_MODEL, dim=1))


def layer_logits(encoder, nodes, heads, tails):
    with torch.no_grad():
        return encoder.layers[0].attention.logits(nodes, NodeSpans(heads, tails))  # (B, H, L, L)


def test_relative_scores_are_invariant_to_shifting_every_position():
    encoder = make_encoder(seed=7)
    nodes = torch.randn(1, 6, D_MODEL, dtype=torch.float64)
    heads = torch.tensor([[0, 1, 2, 3, 0, 2]])  # 4 characters, then words 0..1 and 2..3
    tails = torch.tensor([[0, 1, 2, 3, 1, 3]])
    shifted = layer_logits(encoder, nodes, heads + 37, tails + 37)
    torch.testing.assert_close(shifted, layer_logits(encoder, nodes, heads, tails), atol=1e-10, rtol=1e-10)
    # Not vacuous: moving one word's tail alone does change the scores.
    moved = tails.clone()
    moved[0, 4] = 2
    assert not torch.allclose(layer_logits(encoder, nodes, heads, moved), layer_logits(encoder, nodes, heads, tails))


def test_sentence_without_words_and_empty_lattice_agree():
    encoder = make_encoder(seed=8).eval()
    x, mask, _ = make_batch([5], [0])
    no_words = LatticeWords(torch.zeros(1, 1, WORD_DIM, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.long),
                       torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.bool))  # as collate pads
    with torch.no_grad():
        torch.testing.assert_close(encoder(x, mask, no_words), encoder(x, mask, None), atol=1e-10, rtol=1e-10)


def test_config_errors_and_defaults():
    # The config is the validator: a bad fusion or chunk fails when it loads, before any model is built.
    from nerkit.config import build_config

    with pytest.raises(ConfigError, match="did you mean 'four'"):
        build_config({"encoder": {"name": "flat", "fusion": "fuor"}})
    with pytest.raises(ConfigError, match="attention_chunk"):
        build_config({"encoder": {"name": "flat", "attention_chunk": -1}})
    assert ENCODERS["flat"] is FLAT and FLAT.uses_lattice
    defaults = FLAT(100, FLATOptions(), word_dim=50)  # the official code's MSRA setting
    attention = defaults.layers[0].attention
    assert defaults.output_dim == 160 and len(defaults.layers) == 1 and attention.n_heads == 8
    assert attention.key is None and attention.scale == 1.0
    assert defaults.layers[0].feed_forward[0].out_features == 480


@pytest.mark.parametrize("name", ["msra_flat", "peopledaily_flat"])
def test_the_flat_configs_load(name):
    config = load_config(REPO / "configs" / f"{name}.yaml")
    assert config.encoder.name == "flat" and config.train.batch_size == 10 and config.lexicon.max_words == 400


def test_train_save_load_end_to_end(tmp_path):
    from nerkit.training.loop import train

    sample = REPO / "data" / "sample"
    sentences = read_corpus(sample / "train.bio").sentences
    words = sorted({s.text[span.start:span.end] for s in sentences for span in s.spans() if span.end - span.start > 1})
    lexicon = tmp_path / "words.txt"
    lexicon.write_text("\n".join(words[:300]) + "\n", encoding="utf-8")
    overrides = [
        "encoder.name=flat", "encoder.n_heads=2", "encoder.head_dim=8", "encoder.attention_chunk=16",
        f"lexicon.source={lexicon}", "embeddings.word_dim=16", "embeddings.char_dim=16", "embeddings.bichar_dim=8",
        f"data.train={sample / 'train.bio'}", f"data.dev={sample / 'dev.bio'}", f"data.test={sample / 'test.bio'}",
        "train.epochs=4", "train.lr=0.02", "train.device=cpu",
    ]
    out = tmp_path / "model"
    train(load_config(REPO / "configs" / "demo.yaml", overrides), out=out, progress_bar=False)
    loaded = Pipeline.load(out)
    assert loaded.model.uses_lattice and len(loaded.featurizer.words) > 2
    recorded = json.loads((out / "metrics.json").read_text())["dev"]
    again = loaded.evaluate(sample / "dev.bio")  # the in-memory model's dev score, reproduced after loading
    assert again["counts"] == recorded["counts"]
    texts = [s.text for s in read_corpus(sample / "test.bio").sentences[:40]]
    predicted = loaded.predict(texts)
    loaded.save(tmp_path / "again")
    assert Pipeline.load(tmp_path / "again").predict(texts) == predicted
    assert sum(len(p) for p in predicted) > 0  # the comparison saw entities
