"""`nerkit plot attention --data`: how much of each layer's attention goes to Transformer-XL's memory,
by distance. A model with `encoder.memory` reads the sentences of a corpus that are longer than one
segment as `nerkit predict` reads them (`MemoryReader`), its attention weights are recorded, and each
(query, key) weight is added to the key's distance behind the query (0: itself; a key of the memory
is at least the query's place in its segment + 1 behind it). The figure (nerkit.tools.reports.plot's style)
shows the mean weight by distance and, by the query's place in its segment, the share on the memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from nerkit.errors import UserError
from nerkit.files import check_output
from nerkit.tools.reports.plot import _save, image_format


@dataclass
class MemoryAttention:
    """What `memory_attention` found, per layer: `weight` (layers, 2 * span + 1) the attention summed
    by distance (index: distance + span, span = memory + segment; negative distances are keys after
    the query, in its segment), `pairs` how many (query, key) pairs each distance has, `shares` the
    share of all weight on the memory, and `by_place` (layers, segment) the mean share on the memory
    of a query at each place of a segment that has a memory."""

    weight: torch.Tensor
    pairs: torch.Tensor
    shares: list[float]
    by_place: torch.Tensor
    memory: int
    segment: int
    sentences: int


def memory_attention(pipe, texts: list[list[str]]) -> MemoryAttention:
    """Read each of `texts` with `pipe`'s memory and sum its attention by distance and place."""
    from nerkit.inference.recurrence import MemoryReader
    from nerkit.model.encoders.attention import recorded_attention

    options = pipe.config.encoder.options
    layers, memory, segment = options.num_layers, options.memory, options.segment
    span = memory + segment
    weight = torch.zeros(layers, 2 * span + 1, dtype=torch.float64)
    pairs = torch.zeros(layers, 2 * span + 1, dtype=torch.float64)
    on_memory, total = torch.zeros(layers, dtype=torch.float64), torch.zeros(layers, dtype=torch.float64)
    by_place = torch.zeros(layers, segment, dtype=torch.float64)
    queries = torch.zeros(layers, segment, dtype=torch.float64)
    reader = MemoryReader(pipe)
    pipe.model.eval()
    with torch.inference_mode(), recorded_attention(pipe.model) as recorded:
        for tokens in texts:
            recorded.clear()
            reader.read(tokens)
            for k, w in enumerate(recorded):  # each segment's layers in order
                layer = k % layers
                w = w[0].double().mean(0)  # (L, K), averaged over heads; K = memory kept + L
                length, keys = w.shape
                kept = keys - length  # memory positions before this segment's first character
                query = torch.arange(length)[:, None] + kept  # (L, 1): the query's place in [memory ; segment]
                distance = (query - torch.arange(keys)[None, :] + span).flatten()  # (L * K,), shifted to index
                weight[layer].index_add_(0, distance, w.flatten())
                pairs[layer].index_add_(0, distance, torch.ones(length * keys, dtype=torch.float64))
                on_memory[layer] += w[:, :kept].sum()
                total[layer] += w.sum()
                if kept:
                    by_place[layer, :length] += w[:, :kept].sum(1)
                    queries[layer, :length] += 1
    shares = (on_memory / total.clamp(min=1e-12)).tolist()
    return MemoryAttention(weight, pairs, shares, by_place / queries.clamp(min=1), memory, segment, len(texts))


def memory_figure(found: MemoryAttention):
    """Mean weight by distance (log scale) per layer, beside the share on the memory by place."""
    from matplotlib.figure import Figure

    span = found.memory + found.segment
    mean = found.weight / found.pairs.clamp(min=1)  # (layers, 2 * span + 1)
    figure = Figure(figsize=(11, 3.8), layout="constrained")
    axes, places = figure.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    distances = torch.arange(-span, span + 1)
    for layer, share in enumerate(found.shares):
        seen = found.pairs[layer] > 0
        axes.plot(distances[seen].numpy(), mean[layer][seen].numpy(),
                  label=f"layer {layer + 1} ({100 * share:.0f}% on memory)")
        places.plot(range(found.segment), (100 * found.by_place[layer]).numpy(), label=f"layer {layer + 1}")
    axes.axvline(0, color="grey", linewidth=0.5)
    axes.set_xlabel("distance of the key behind the query (characters; > segment place: in the memory)")
    axes.set_ylabel("mean attention weight")
    axes.set_yscale("log")
    axes.set_title(f"Attention by distance, memory {found.memory}, segment {found.segment}")
    axes.legend()
    places.set_xlabel("query's place in its segment (after the first segment)")
    places.set_ylabel("% of its attention on the memory")
    places.set_title("Share on the memory by place")
    places.legend()
    return figure


def plot_memory_attention(model_dir: str | Path, data: str | Path, out: str | Path, limit: int = 400,
                          device: str = "cpu") -> tuple[Path, list[dict]]:
    """Draw `memory_figure` for the model in `model_dir` on at most `limit` sentences of the corpus
    `data` longer than a segment; returns the path and, per layer, its share of attention on the
    memory and the mean share of a segment's first, middle and last query."""
    from nerkit.data.corpus import read_corpus
    from nerkit.inference.pipeline import Pipeline

    image_format(out)
    check_output(out, data)
    pipe = Pipeline.load(model_dir, device=device)
    memory = getattr(pipe.config.encoder.options, "memory", 0)
    if not memory:
        raise UserError(f"the model's encoder ({pipe.config.encoder.name}) has no memory (encoder.memory)",
                        where=str(model_dir), fix="plot a model trained with encoder.memory, or draw one sentence's "
                                                  "maps with --text")
    segment = pipe.config.encoder.options.segment
    texts = [s.tokens for s in read_corpus(data, repair=True).sentences if len(s) > segment][:limit]
    if not texts:
        raise UserError(f"no sentence is longer than a segment ({segment} characters), so none reads the memory",
                        where=str(data), fix="give a corpus with longer sentences")
    found = memory_attention(pipe, texts)
    rows = [{"layer": layer + 1, "on_memory": share, "first": found.by_place[layer, 0].item(),
             "middle": found.by_place[layer, segment // 2].item(), "last": found.by_place[layer, -1].item()}
            for layer, share in enumerate(found.shares)]
    return _save(memory_figure, out, "", found), rows
