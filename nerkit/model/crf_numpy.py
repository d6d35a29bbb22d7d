"""The CRF's entity probabilities in numpy, for an exported model on ONNX Runtime (no torch): the same
forward-backward as `CRF.entity_probabilities` (nerkit.model.crf, whose docstring gives the rule),
computed from the graph's emissions output and the CRF's scores saved beside the graph. float64
throughout, so the two agree to far below the 1e-5 a test holds them to.

Why here and not in the graph: the forward and backward passes are T dependent steps each, which
ONNX can only express as a Loop (slow to build, and float32 there); the emissions are already an
output of the graph, and this costs a few numpy operations per step of a batch.
"""

from __future__ import annotations

import numpy as np

from nerkit.data.tags import continues, split_tag, tags_to_spans, transition_table

# A score whose exp is exactly 0, finite so that no row is all -inf. The torch CRF (nerkit.model.crf)
# imports it: this module is the deliberate second copy of its forward-backward, in numpy for an
# export without torch, and tests/test_crf.py holds the two's probabilities equal.
FORBIDDEN = -1e30


def masked_scores(tags: list[str], start: np.ndarray, transitions: np.ndarray, end: np.ndarray):
    """The CRF's start (K,), transition (K, K) and end (K,) scores, float64, with the tag scheme's
    forbidden moves (nerkit.data.tags) at FORBIDDEN."""
    start_ok, trans_ok, end_ok = (np.asarray(x, dtype=bool) for x in transition_table(tags))
    return (np.where(start_ok, start, FORBIDDEN).astype(np.float64),
            np.where(trans_ok, transitions, FORBIDDEN).astype(np.float64),
            np.where(end_ok, end, FORBIDDEN).astype(np.float64))


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    top = x.max(axis=axis, keepdims=True)
    return (top + np.log(np.exp(x - top).sum(axis=axis, keepdims=True))).squeeze(axis)


def entity_probabilities(tags: list[str], scores, emissions: np.ndarray, lengths: list[int],
                         paths: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
    """For each path, the probability of each of its entities in the order of `tags_to_spans`;
    `scores`: `masked_scores`' (start, transitions, end); emissions (B, T, K)."""
    start, trans, end = (s / temperature for s in scores)
    emissions = np.asarray(emissions, dtype=np.float64) / temperature
    batch_size, seq_len, _ = emissions.shape
    mask = np.arange(seq_len)[None, :] < np.asarray(lengths)[:, None]  # (B, T)
    alpha = np.empty_like(emissions)
    alpha[:, 0] = start + emissions[:, 0]
    for t in range(1, seq_len):
        stepped = _logsumexp(alpha[:, t - 1, :, None] + trans, axis=1) + emissions[:, t]
        alpha[:, t] = np.where(mask[:, t, None], stepped, alpha[:, t - 1])
    beta = np.empty_like(emissions)
    beta[:, -1] = end
    for t in range(seq_len - 2, -1, -1):
        stepped = _logsumexp((emissions[:, t + 1] + beta[:, t + 1])[:, None, :] + trans, axis=2)
        beta[:, t] = np.where(mask[:, t + 1, None], stepped, end)
    log_z = _logsumexp(alpha[:, -1] + end, axis=1)
    carries: dict[str, np.ndarray] = {}  # per type, the tags that would continue an entity of it: (K,)
    out: list[list[float]] = []
    for b, path in enumerate(paths):
        path = np.asarray(path, dtype=np.int64)
        step = emissions[b, np.arange(len(path)), path]
        step[1:] += trans[path[:-1], path[1:]]
        running = np.cumsum(step)
        found = []
        for span in tags_to_spans([tags[i] for i in path]):
            s, e = span.start, span.end
            inside = alpha[b, s, path[s]] + running[e - 1] - running[s]
            if e == len(path):
                onward = end[path[e - 1]]
            else:
                if span.type not in carries:
                    carries[span.type] = np.array([continues(t) and split_tag(t)[1] == span.type for t in tags])
                onward = _logsumexp(np.where(carries[span.type], -np.inf, trans[path[e - 1]] + emissions[b, e] + beta[b, e]), 0)
            found.append(min(1.0, float(np.exp(inside + onward - log_z[b]))))
        out.append(found)
    return out
