"""The one shape every head decodes a sentence into, torch-free (an export on ONNX Runtime decodes
into it too): a list of `Found`, (start, end exclusive, type index, score or None), the type an index
into the model's sorted entity types; and a tag path read as that list."""

from __future__ import annotations

from nerkit.data.tags import tags_to_spans

# (start, end exclusive, type index, probability, or None where the head was not asked to score)
Found = tuple[int, int, int, "float | None"]


def path_entities(path: list[int], tags: list[str], types: list[str], scores: list | None = None) -> list[Found]:
    """The entities of one tag path (tag ids into `tags`), in order, each with its score from
    `scores` (one per entity, in order) or None."""
    spans = tags_to_spans([tags[t] for t in path])
    scores = scores if scores is not None else [None] * len(spans)
    index = {t: k for k, t in enumerate(types)}
    return [(s.start, s.end, index[s.type], p) for s, p in zip(spans, scores)]
