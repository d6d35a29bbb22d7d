"""`nerkit data select`: which texts of a pool to annotate next (active learning), each written as a
task with the model's pre-annotations and their scores.

`uncertainty` ranks the texts by the probability of the model's own best tag path, normalised by
length: the mean log-probability per character, (1/n) log P(best path) (the "maximum normalised
log-probability" that Shen et al., 2018, found as good as costlier measures for NER, and which needs
nothing but the CRF's forward pass). Unlike the lowest entity score it also ranks the texts where
the model finds nothing, which are where it misses entities; unlike the raw path probability it does
not simply pick the longest texts. `random` draws N texts with a seed: the baseline to measure
against. A text longer than the model's window is scored over its windows (their log-probabilities
summed, over its length).
"""

from __future__ import annotations

import math
import random
from typing import Literal

import torch

from nerkit.features.batch import bucketed_batches, collate_padded
from nerkit.inference.windows import text_windows

STRATEGIES = ("uncertainty", "random")
Strategy = Literal[STRATEGIES]  # the CLI's choices


def path_confidence(pipe, texts: list[str], batch_size: int = 64, window: int | None = None) -> list[float]:
    """Per text, the mean log-probability per character of the model's best path (0 for an empty text)."""
    window = pipe.check_window(window)
    pieces = [(i, a, b) for i, text in enumerate(texts) for a, b in text_windows(len(text), window)]
    examples = [pipe.featurizer.example(list(texts[i][a:b])) for i, a, b in pieces]
    totals = [0.0] * len(texts)
    pipe.model.eval()
    with torch.inference_mode():
        for idx in bucketed_batches([len(e) for e in examples], batch_size):
            batch = collate_padded([examples[j] for j in idx], batch_size, window).to(pipe.device)
            emissions = pipe.model.emissions(batch)
            paths = pipe.model.crf.decode(emissions, batch.mask)
            probs = pipe.model.crf.path_probabilities(emissions, batch.mask, paths, pipe.score_temperature)
            for j, p in zip(idx, probs):
                totals[pieces[j][0]] += math.log(max(p, 1e-300))
    return [total / len(text) if text else 0.0 for total, text in zip(totals, texts)]


def select(pipe, texts: list[str], n: int, strategy: str = "uncertainty", seed: int = 0,
           batch_size: int = 64, window: int | None = None) -> list[int]:
    """The indices of the `n` texts to annotate next, in the order to annotate them: the least sure
    first (`uncertainty`), or a seeded random draw (`random`). Empty texts are never chosen."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, not {strategy!r}")
    candidates = [i for i, text in enumerate(texts) if text.strip()]
    if strategy == "random":
        return random.Random(seed).sample(candidates, min(n, len(candidates)))
    confidence = path_confidence(pipe, [texts[i] for i in candidates], batch_size, window)
    ranked = sorted(range(len(candidates)), key=lambda k: (confidence[k], candidates[k]))
    return [candidates[k] for k in ranked[:n]]
