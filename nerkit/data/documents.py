"""Documents for `data.context: document`: consecutive sentences of a corpus file read as one stream
(a separator line starts a new one, `Sentence.document`), cut into segments of at most
`encoder.segment` characters that pack whole sentences, and a sentence longer than a segment cut
into pieces where no gold entity crosses. Each piece stays its own CRF sequence in training."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import replace

from nerkit.data.records import Sentence
from nerkit.data.tags import continues

DEV_BLOCKS = 10  # a dev set carved from one unmarked document is this many contiguous runs


def documents(sentences: list[Sentence]) -> list[list[Sentence]]:
    """The documents of `sentences`: maximal runs of consecutive sentences with the same
    `Sentence.document` (a file without separators is one document)."""
    found: list[list[Sentence]] = []
    for sent in sentences:
        if found and found[-1][-1].document == sent.document:
            found[-1].append(sent)
        else:
            found.append([sent])
    return found


def piece_starts(tags: list[str], segment: int) -> list[int]:
    """Where to cut a sentence of these tags into pieces of at most `segment` tokens: the start of
    each piece (the first is 0), each cut as far along as it can go before a token that does not
    continue an entity, so that no gold entity is split. An entity longer than `segment` leaves
    no such point: the piece is then cut at `segment`, inside the entity, whose two halves train
    as two entities (a segment never holds more than `segment` characters)."""
    starts, start = [0], 0
    while len(tags) - start > segment:
        cut = next((p for p in range(start + segment, start, -1) if not continues(tags[p])), start + segment)
        starts.append(cut)
        start = cut
    return starts


# A piece of a document's sentence: (the sentence's index in the document, start, end), end exclusive.
Piece = tuple[int, int, int]


def segments(document: list[Sentence], segment: int) -> list[list[Piece]]:
    """A document's segments, in order: its sentences cut at `piece_starts`, and the pieces packed
    (`pack`)."""
    return list(pack(((piece_starts(sent.tags, segment), len(sent)) for sent in document), segment))


def pack(lines: Iterable[tuple[list[int], int]], segment: int) -> Iterator[list[Piece]]:
    """Segments from consecutive lines, each given as (the starts of its pieces, its length): the
    pieces packed greedily, each segment as many consecutive pieces as fit in `segment` characters,
    so whole lines share a segment while they fit and a piece that does not fit starts the next.
    Training cuts its sentences where no entity crosses (`piece_starts`); prediction, which has no
    tags, every `segment` characters (`nerkit.inference.recurrence`). Empty lines make no piece."""
    packed: list[Piece] = []
    length = 0
    for index, (starts, size) in enumerate(lines):
        for start, end in zip(starts, [*starts[1:], size]):
            if end == start:
                continue
            if packed and length + end - start > segment:
                yield packed
                packed, length = [], 0
            packed.append((index, start, end))
            length += end - start
    if packed:
        yield packed


def contiguous_dev_split(sentences: list[Sentence], fraction: float, seed: int
                         ) -> tuple[list[Sentence], list[Sentence]]:
    """A reproducible dev set carved in contiguous blocks, so that its streams, and train's, stay
    whole: whole documents where the file marks several, else DEV_BLOCKS runs of consecutive
    sentences. Blocks are drawn (seeded) until they hold `fraction` of the sentences. The
    sentences of each side are renumbered so that every run left contiguous is a document of its
    own: a stream never reads across the gap a carved block leaves."""
    n_dev = max(1, round(fraction * len(sentences)))
    found = documents(sentences)
    if len(found) > 1:
        blocks, start = [], 0
        for doc in found:
            blocks.append(range(start, start + len(doc)))
            start += len(doc)
    else:
        size = math.ceil(n_dev / DEV_BLOCKS)
        blocks = [range(a, min(a + size, len(sentences))) for a in range(0, len(sentences), size)]
    random.Random(seed).shuffle(blocks)
    dev_idx: set[int] = set()
    for block in blocks:
        if len(dev_idx) >= n_dev:
            break
        dev_idx.update(block)
    train_idx = [i for i in range(len(sentences)) if i not in dev_idx]
    return _runs(sentences, train_idx), _runs(sentences, sorted(dev_idx))


def _runs(sentences: list[Sentence], kept: list[int]) -> list[Sentence]:
    """The sentences at `kept` (ascending), each maximal run of consecutive ones from one document
    numbered as a document of its own."""
    out: list[Sentence] = []
    number = -1
    for k, i in enumerate(kept):
        if k == 0 or i != kept[k - 1] + 1 or sentences[i].document != sentences[i - 1].document:
            number += 1
        out.append(replace(sentences[i], document=number))
    return out
