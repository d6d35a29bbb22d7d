"""Text rules shared by every layer: what whitespace is to the model (`SPACE`), character
normalisation that keeps offsets, character bigrams, and where a long sentence may be cut."""

from __future__ import annotations

import unicodedata

from nerkit.data.records import Sentence
from nerkit.data.tags import Span

SPACE = " "  # what every whitespace character (tab, U+3000, a line break, ...) is to the model


# Where a long sentence may be cut, best first: after a sentence end, then after a clause break.
_STRONG_BREAKS = set("。！？!?；;…")


_WEAK_BREAKS = set("，,、：:）)」』”\"")


# ---------------------------------------------------------------------------------------------
# Normalisation and splitting


def normalize_char(ch: str) -> str:
    """NFKC for one character (full-width -> half-width and the like), kept only when it stays
    one character, so every offset into the normalised text is an offset into the original."""
    folded = unicodedata.normalize("NFKC", ch)
    return folded if len(folded) == 1 else ch


def cut_points(tokens: list[str], max_len: int, spans: list[Span] = ()) -> list[int]:
    """Where to cut `tokens` into pieces of at most `max_len`: never inside an entity, preferably
    after sentence punctuation, then after a clause break, else at the furthest allowed point.
    Returns the start offsets of the pieces (the first is 0). An entity longer than `max_len`
    stays whole, so its piece is longer."""
    n = len(tokens)
    if max_len <= 0 or n <= max_len:
        return [0]
    blocked = [False] * (n + 1)  # blocked[p]: cutting before token p would split an entity
    for s in spans:
        for p in range(s.start + 1, s.end):
            blocked[p] = True
    starts = [0]
    start = 0
    while n - start > max_len:
        best = {0: None, 1: None, 2: None}
        for p in range(start + max_len, start, -1):
            if blocked[p]:
                continue
            prev = tokens[p - 1]
            rank = 0 if prev in _STRONG_BREAKS else 1 if prev in _WEAK_BREAKS else 2
            if best[rank] is None:
                best[rank] = p
            if rank == 0:
                break
        cut = best[0] or best[1] or best[2]
        if cut is None:  # an entity longer than max_len: cut right after it
            cut = next(p for p in range(start + max_len + 1, n + 1) if not blocked[p] or p == n)
            if cut == n:
                break
        starts.append(cut)
        start = cut
    return starts


def split_sentence(sent: Sentence, max_len: int) -> list[Sentence]:
    """Pieces of at most `max_len` tokens, never cutting an entity; each piece knows its offset."""
    starts = cut_points(sent.tokens, max_len, sent.spans() if sent.tags else ())
    if len(starts) == 1:
        return [sent]
    ends = starts[1:] + [len(sent.tokens)]
    pieces = []
    for a, b in zip(starts, ends):
        tags = sent.tags[a:b] if sent.tags is not None else None
        entities = None if sent.entities is None else \
            [Span(e.start - a, e.end - a, e.type) for e in sent.entities if a <= e.start and e.end <= b]
        unknown = [(max(s, a) - a, min(e, b) - a) for s, e in sent.unknown or () if s < b and a < e] or None
        pieces.append(Sentence(sent.tokens[a:b], tags, sent.line + a if sent.line else 0, sent.document, entities,
                               unknown=unknown))
    return pieces





END = "</s>"  # bigram end marker: the last character's bigram is c[n-1] + END


def bigrams(chars: list[str]) -> list[str]:
    return [a + b for a, b in zip(chars, chars[1:] + [END])]
