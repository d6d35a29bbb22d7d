"""Transformer-XL's segment-level recurrence in the Transformer encoder (`encoder.memory`,
`encoder.segment`): off, or with a segment longer than the text, it is today's encoder exactly; the
memory each layer carries is its inputs to the previous segments, trimmed and detached; no gradient
reaches across a segment boundary; and absolute positions are refused with it. The attention over
[memory ; segment] is checked against a by-hand reference in test_relative.py, and batching and
save/load in the contract suite."""

from __future__ import annotations

import pytest
import torch

from nerkit.config import TenerOptions, build_config
from nerkit.errors import ConfigError
from nerkit.model.encoders.transformer import Transformer

RELATIVE = ["tener", "xl", "shaw", "rope", "alibi"]


def make_encoder(attention: str, memory: int = 0, segment: int = 0, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    options = TenerOptions(n_heads=2, head_dim=4, num_layers=2, dropout=0.0, attn_dropout=0.0,
                           attention=attention, max_relative_distance=3, memory=memory, segment=segment)
    return Transformer(5, options).double().eval()


def inputs(lengths: list[int], seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), max(lengths), 5, generator=generator, dtype=torch.float64)
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
    return x, mask


@pytest.mark.parametrize("attention", RELATIVE)
def test_off_or_a_segment_longer_than_the_text_is_todays_encoder(attention):
    plain = make_encoder(attention)
    remembering = make_encoder(attention, memory=4, segment=12)  # same seed: same weights
    x, mask = inputs([12, 7, 3])
    with torch.no_grad():
        assert torch.equal(remembering(x, mask), plain(x, mask))


@pytest.mark.parametrize("attention", RELATIVE)
def test_segments_with_memory_read_context_that_segments_alone_do_not(attention):
    encoder = make_encoder(attention, memory=4, segment=4)
    x, mask = inputs([12])
    with torch.no_grad():
        read = encoder(x, mask)  # three segments, each with the memory of the ones before
        alone = encoder.encode(x[:, 4:8], mask[:, 4:8])[0]  # the second segment without its memory
        first = encoder.encode(x[:, :4], mask[:, :4])[0]
    torch.testing.assert_close(read[:, :4], first, atol=1e-12, rtol=0)  # the first has no memory anyway
    assert not torch.allclose(read[:, 4:8], alone)


@pytest.mark.parametrize("attention", RELATIVE)
def test_the_memory_is_each_layers_input_to_the_previous_segments_trimmed(attention):
    encoder = make_encoder(attention, memory=6, segment=4)
    x, mask = inputs([12, 9])
    seen: list[torch.Tensor] = []
    hooks = [layer.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
             for layer in encoder.layers]
    try:
        memory, history = None, [[] for _ in encoder.layers]  # every input each layer has had
        with torch.no_grad():
            for start in (0, 4, 8):
                seen.clear()
                _, memory = encoder.encode(x[:, start:start + 4], mask[:, start:start + 4], memory)
                for k, state in enumerate(seen):
                    history[k].append(state)
                for k, (state, state_mask) in enumerate(memory):
                    so_far = torch.cat(history[k], dim=1)  # (B, start + 4, d_model)
                    assert torch.equal(state, so_far[:, -6:]) and not state.requires_grad
                    assert torch.equal(state_mask, mask[:, :start + 4][:, -6:])
    finally:
        for hook in hooks:
            hook.remove()


@pytest.mark.parametrize("attention", RELATIVE)
def test_no_gradient_crosses_a_segment_boundary(attention):
    """The paper's stop-gradient: a loss on the second segment's outputs trains nothing through the
    first segment's inputs, which reach it only as memory."""
    encoder = make_encoder(attention, memory=4, segment=4).train()
    x, mask = inputs([8])
    x.requires_grad_(True)
    out = encoder(x, mask)
    out[:, 4:].pow(2).sum().backward()
    assert torch.equal(x.grad[:, :4], torch.zeros_like(x.grad[:, :4]))
    assert x.grad[:, 4:].abs().sum() > 0


@pytest.mark.parametrize("attention", ["absolute", "learned"])
def test_absolute_positions_with_memory_are_refused_when_the_config_loads(attention):
    with pytest.raises(ConfigError, match="absolute positions repeat in every segment") as info:
        build_config({"encoder": {"name": "transformer", "attention": attention, "memory": 64, "segment": 64}})
    assert "use attention: tener, xl, shaw, rope or alibi" in str(info.value)


@pytest.mark.parametrize("encoder, words", [
    ({"memory": 64}, "needs segment"),
    ({"segment": 64}, "without memory"),
])
def test_memory_and_segment_come_together(encoder, words):
    with pytest.raises(ConfigError, match=words):
        build_config({"encoder": {"name": "tener", **encoder}})


def test_learned_positions_cover_the_longest_sentence():
    with pytest.raises(ConfigError, match="max_positions"):
        build_config({"encoder": {"name": "transformer", "attention": "learned", "max_positions": 100},
                      "data": {"max_len": 250}})
    build_config({"encoder": {"name": "transformer", "attention": "learned", "max_positions": 256},
                  "data": {"max_len": 250}})
