"""Document streams, how `data.context: document` trains (Transformer-XL's language-model training):
the training documents, cut into segments (nerkit.data.documents), are dealt each epoch to B rows
of balanced length; each step reads the next segment of every row, with the memory of the row's
segments before, and a row whose document changes starts without memory."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from nerkit.data.documents import Piece, documents, segments
from nerkit.data.records import Sentence
from nerkit.data.tags import spans_to_tags, tags_to_spans
from nerkit.features.batch import Batch, collate
from nerkit.features.featurizer import Example, Featurizer


@dataclass
class Segment:
    """One segment of a document, as model input: its pieces' characters and tags, and the length
    of each piece (a CRF sequence of its own), in order."""

    example: Example
    pieces: list[int]

    def __len__(self) -> int:
        return len(self.example)


# One step of an epoch: for each row, its next segment and whether its document (or part) starts
# there; None where the row has run out.
Step = list[tuple[Segment, bool] | None]


def segment_of(featurizer: Featurizer, document: list[Sentence], whole: list[Example], pieces: list[Piece]) -> Segment:
    """A segment as model input: its pieces cut from the features of their whole sentences (`whole`,
    the featuriser's examples of `document`), so that a character bigram at a cut inside a sentence
    is the sentence's, as streamed prediction reads it; each piece tagged on its own in the model's
    scheme (an entity a cut had to split is two)."""
    parts, tag_ids = [], []
    for index, start, end in pieces:
        parts.append(_cut(whole[index], start, end))
        spans = tags_to_spans(document[index].tags[start:end])
        tag_ids += [featurizer.tag_index[tag] for tag in spans_to_tags(end - start, spans, featurizer.scheme)]
    example = Example(sum((p.char_ids for p in parts), []), sum((p.bichar_ids for p in parts), []), tag_ids)
    if parts[0].lm_ids is not None:
        example.lm_ids = _joined([p.lm_ids for p in parts])
    return Segment(example, [end - start for _, start, end in pieces])


def _cut(example: Example, start: int, end: int) -> Example:
    """The ids of characters start:end of an example (a language model's too: a list, or a tuple of
    lists for stacked sources)."""
    lm_ids = example.lm_ids
    if lm_ids is not None:
        lm_ids = tuple(ids[start:end] for ids in lm_ids) if isinstance(lm_ids, tuple) else lm_ids[start:end]
    return Example(example.char_ids[start:end], example.bichar_ids[start:end], lm_ids=lm_ids)


def _joined(rows: list):
    """Per-character id lists (or tuples of them) one after another."""
    if isinstance(rows[0], tuple):
        return tuple(sum(source, []) for source in zip(*rows))
    return sum(rows, [])


def split_parts(docs: list[list[Segment]], rows: int) -> list[list[Segment]]:
    """Documents longer than a row's fair share (all characters / rows) cut into consecutive parts
    of at most that share, at segment boundaries, so that B rows can be filled evenly even from a
    corpus of one document (MSRA marks none): as Transformer-XL's `batchify` cuts its one stream
    into B, each part starts without memory."""
    share = math.ceil(sum(len(s) for doc in docs for s in doc) / rows)
    parts: list[list[Segment]] = []
    for doc in docs:
        length = share  # no open part yet
        for seg in doc:
            if length + len(seg) > share:
                parts.append([])
                length = 0
            parts[-1].append(seg)
            length += len(seg)
    return parts


def deal(lengths: list[int], rows: int, rng: random.Random) -> list[list[int]]:
    """Documents (by their `lengths`) dealt to `rows` rows: in a shuffled order, each to the row
    with the fewest characters so far (ties: the lowest row), so that the rows end close together."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    dealt: list[list[int]] = [[] for _ in range(rows)]
    totals = [0] * rows
    for doc in order:
        row = min(range(rows), key=lambda r: (totals[r], r))
        dealt[row].append(doc)
        totals[row] += lengths[doc]
    return dealt


class Streams:
    """The training documents as segments, ready to be dealt to rows each epoch."""

    def __init__(self, parts: list[list[Segment]], rows: int):
        self.parts, self.rows = parts, rows

    @classmethod
    def build(cls, featurizer: Featurizer, sentences: list[Sentence], segment: int, batch_size: int) -> "Streams":
        """The segments of `sentences`' documents, in at most `batch_size` rows (fewer when the
        corpus has fewer segments)."""
        docs = []
        for doc in documents(sentences):
            whole = [featurizer.example(sent.tokens) for sent in doc]
            docs.append([segment_of(featurizer, doc, whole, pieces) for pieces in segments(doc, segment)])
        rows = max(1, min(batch_size, sum(len(doc) for doc in docs)))
        return cls(split_parts(docs, rows), rows)

    @property
    def segments(self) -> int:
        return sum(len(part) for part in self.parts)

    def steps_per_epoch(self) -> int:
        """About how many steps an epoch takes (its dealing may make it a few more): the segments
        shared evenly by the rows; what the learning-rate schedule counts with."""
        return math.ceil(self.segments / self.rows)

    def epoch(self, rng: random.Random) -> list[Step]:
        """The epoch's steps: the parts dealt to the rows (shuffled by `rng`), each step the next
        segment of every row, until every row is done."""
        dealt = deal([sum(len(s) for s in part) for part in self.parts], self.rows, rng)
        rows = [[(seg, k == 0) for p in row for k, seg in enumerate(self.parts[p])] for row in dealt]
        n_steps = max(len(row) for row in rows)
        return [[row[t] if t < len(row) else None for row in rows] for t in range(n_steps)]


def step_batch(step: Step, empty: Example) -> Batch:
    """A step's Batch: one row per stream (`empty`, a featurised empty text, where a row has run
    out), with its pieces (row, start, length) and the rows whose memory is dropped (a document
    starts there, or the row is done)."""
    batch = collate([entry[0].example if entry else empty for entry in step])
    pieces = []
    for row, entry in enumerate(step):
        start = 0
        for length in entry[0].pieces if entry else ():
            pieces.append((row, start, length))
            start += length
    batch.pieces = torch.tensor(pieces, dtype=torch.long)  # (N, 3)
    batch.resets = torch.tensor([entry is None or entry[1] for entry in step])  # (B,)
    return batch


def step_chars(step: Step) -> int:
    return sum(len(entry[0]) for entry in step if entry)
