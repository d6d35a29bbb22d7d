"""Transformer-XL's segment-level recurrence in the Transformer encoder (`encoder.memory`,
`encoder.segment`): off, or with a segment longer than the text, it is today's encoder exactly; the
memory each layer carries is its inputs to the previous segments, trimmed and detached; no gradient
reaches across a segment boundary; and absolute positions are refused with it. The attention over
[memory ; segment] is checked against a by-hand reference in test_relative.py, and batching and
save/load in the contract suite."""

from __future__ import annotations

import pytest
import torch

from nerkit.config import RELATIVE_ATTENTIONS, TenerOptions, build_config
from nerkit.errors import ConfigError
from nerkit.model.encoders.transformer import Transformer

RELATIVE = RELATIVE_ATTENTIONS


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
        # The segment step itself, over [an empty memory ; the whole text]: the rectangular attention
        # over masked memory slots reads as the encoder without memory.
        empty = [(torch.randn(3, 4, 8, dtype=torch.float64), torch.zeros(3, 4, dtype=torch.bool))
                 for _ in remembering.layers]
        stepped, kept = remembering.encode(x, mask, empty)
    torch.testing.assert_close(stepped, plain(x, mask), atol=1e-12, rtol=0)
    assert len(kept) == len(remembering.layers) and all(state.shape[1] == 4 for state, _ in kept)


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
                    assert not state.requires_grad
                    for row in range(x.size(0)):  # its last 6 real positions, padding (if any) first
                        real = so_far[row][mask[row, :start + 4]][-6:]
                        padding = state.size(1) - len(real)
                        assert torch.equal(state[row, padding:], real)
                        assert state_mask[row].tolist() == [False] * padding + [True] * len(real)
    finally:
        for hook in hooks:
            hook.remove()


@pytest.mark.parametrize("attention", RELATIVE)
def test_streams_read_side_by_side_equal_each_stream_read_alone(attention):
    """Document training and streamed prediction read B streams at once, each batch the next segment
    of every stream, and the segments differ in length (a row's padding ends it). A stream's outputs
    do not depend on the streams beside it: its memory stays adjacent to its next segment."""
    encoder = make_encoder(attention, memory=5, segment=4)
    lengths = [[4, 4, 4], [3, 2, 4], [1, 4, 0]]  # each stream's segment lengths, batch by batch
    pieces = [inputs([4], seed=k)[0][0, :n] for k, n in enumerate((4, 4, 4, 3, 2, 4, 1, 4))]  # (n, D) each
    streams = [pieces[0:3], pieces[3:6], pieces[6:8] + [pieces[0][:0]]]
    with torch.no_grad():
        together, memory = [], None
        for step in range(3):
            x = torch.zeros(3, 4, pieces[0].size(-1), dtype=torch.float64)
            mask = torch.zeros(3, 4, dtype=torch.bool)
            for row in range(3):
                n = lengths[row][step]
                x[row, :n], mask[row, :n] = streams[row][step], True
            out, memory = encoder.encode(x, mask, memory)
            together.append(out)
        for row in range(3):
            alone, memory = [], None
            for step in range(3):
                n = lengths[row][step]
                if n == 0:
                    continue
                out, memory = encoder.encode(streams[row][step][None], torch.ones(1, n, dtype=torch.bool), memory)
                torch.testing.assert_close(together[step][row, :n], out[0], atol=1e-10, rtol=0)


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
