"""How much of each layer's attention goes to Transformer-XL's memory, by distance: a model with
`encoder.memory` reads the sentences of a gold corpus that are longer than one segment (as
`nerkit predict` reads them, `MemoryReader`), its attention weights are recorded, and for every
(query, key) pair the weight is added to the key's distance behind the query (0: itself; a key of
the memory is at least the query's place in the segment + 1 behind it). Writes a figure and prints,
per layer, the share of attention on the memory and the mean weight per distance bucket.

    python scripts/plot_xl_attention.py --model runs/M --data $NERKIT_DATA/msra/test.char.bmes \
        --out docs/img/xl_attention.png
"""

from __future__ import annotations

import argparse

import torch

from nerkit.data.corpus import read_corpus
from nerkit.inference.pipeline import Pipeline
from nerkit.inference.recurrence import MemoryReader
from nerkit.model.encoders.attention import recorded_attention
from nerkit.tools.plot import load_matplotlib


def collect(pipe: Pipeline, texts: list[list[str]], layers: int):
    """Per layer: the attention weight summed by distance behind the query (layers, D) float64, how
    many (query, key) pairs each distance has (layers, D), the share of weight on the memory, and
    the weight on the memory summed by the query's place in its segment with the count of queries
    there (layers, S) each. Distances < 0 are keys after the query, inside the segment."""
    memory, segment = pipe.config.encoder.options.memory, pipe.config.encoder.options.segment
    span = memory + segment
    weight = torch.zeros(layers, 2 * span + 1, dtype=torch.float64)  # index: distance + span
    pairs = torch.zeros(layers, 2 * span + 1, dtype=torch.float64)
    on_memory, total = [0.0] * layers, [0.0] * layers
    by_place = torch.zeros(layers, segment, dtype=torch.float64)
    queries = torch.zeros(layers, segment, dtype=torch.float64)
    reader = MemoryReader(pipe)
    with recorded_attention(pipe.model) as recorded:
        for tokens in texts:
            recorded.clear()
            reader.read(tokens)
            for k, w in enumerate(recorded):
                layer = k % layers
                w = w[0].double().mean(0)  # (L, K): averaged over heads; K = memory kept + L
                length, keys = w.shape
                kept = keys - length  # memory positions before this segment's first character
                query = torch.arange(length)[:, None] + kept  # (L, 1): the query's place in [memory ; segment]
                distance = query - torch.arange(keys)[None, :]  # (L, K)
                weight[layer].index_add_(0, (distance + span).flatten(), w.flatten())
                pairs[layer].index_add_(0, (distance + span).flatten(), torch.ones(length * keys, dtype=torch.float64))
                on_memory[layer] += float(w[:, :kept].sum())
                total[layer] += float(w.sum())
                if kept:
                    by_place[layer, :length] += w[:, :kept].sum(1)
                    queries[layer, :length] += 1
    shares = [m / t if t else 0.0 for m, t in zip(on_memory, total)]
    return weight, pairs, shares, by_place / queries.clamp(min=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", default="docs/img/xl_attention.png")
    ap.add_argument("--limit", type=int, default=400, help="at most this many long sentences")
    args = ap.parse_args()
    pipe = Pipeline.load(args.model)
    options = pipe.config.encoder.options
    texts = [s.tokens for s in read_corpus(args.data).sentences if len(s) > options.segment][: args.limit]
    pipe.model.eval()
    weight, pairs, shares, place_share = collect(pipe, texts, options.num_layers)
    span = options.memory + options.segment
    mean = weight / pairs.clamp(min=1)  # (layers, 2 * span + 1): mean weight a key at that distance gets
    print(f"{len(texts)} sentences longer than a segment ({options.segment}), memory {options.memory}")
    for layer, share in enumerate(shares):
        row = place_share[layer]
        print(f"layer {layer + 1}: {100 * share:.1f}% of attention on the memory; by the query's place in a "
              f"segment after the first: first {100 * row[0]:.1f}%, middle {100 * row[len(row) // 2]:.1f}%, "
              f"last {100 * row[-1]:.1f}%")
    matplotlib = load_matplotlib()
    from matplotlib.figure import Figure

    del matplotlib
    figure = Figure(figsize=(11, 3.8))
    axes, places = figure.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    distances = torch.arange(-span, span + 1)
    for layer in range(options.num_layers):
        seen = pairs[layer] > 0
        axes.plot(distances[seen].numpy(), mean[layer][seen].numpy(),
                  label=f"layer {layer + 1} ({100 * shares[layer]:.0f}% on memory)")
    axes.axvline(0, color="grey", linewidth=0.5)
    axes.set_xlabel("distance of the key behind the query (characters; > segment place: in the memory)")
    axes.set_ylabel("mean attention weight")
    axes.set_yscale("log")
    axes.set_title(f"Attention by distance, memory {options.memory}, segment {options.segment}")
    axes.legend()
    for layer in range(options.num_layers):
        places.plot(range(options.segment), (100 * place_share[layer]).numpy(), label=f"layer {layer + 1}")
    places.set_xlabel("query's place in its segment (after the first segment)")
    places.set_ylabel("% of its attention on the memory")
    places.set_title("Share on the memory by place")
    places.legend()
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
