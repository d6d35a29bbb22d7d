"""Word discovery from raw text, for a lexicon of a domain's own words (`nerkit lexicon build`):
every character n-gram seen often enough is scored by its internal cohesion (the pointwise mutual
information of its weakest split) and its freedom (the entropy of the characters beside it), the
unsupervised method of Matrix67's "互联网时代的社会语言学：基于SNS的文本数据挖掘" (2012).

The text is held as one int32 code per character (`TextCodes`) and its n-grams are counted by
sorting the positions once on their next `max_len` characters (a suffix array cut at `max_len`), so
counting a text of N characters takes about (4 max_len + 40) N bytes, not a dict of every n-gram.
"""

from __future__ import annotations

import math
import unicodedata
from array import array
from dataclasses import dataclass
from typing import Callable

from nerkit.data.text import SPACE, normalize_char

BOUNDARY = 0  # the code of a line's edge: a neighbour like any other, never part of a word

DEFAULT_MAX_LEN = 6
DEFAULT_MIN_COUNT = 3  # with freedom >= 1 nat, 3 occurrences at least are needed anyway (log 2 < 1)
DEFAULT_MIN_COHESION = 3.0
DEFAULT_MIN_FREEDOM = 1.0


def is_word_char(char: str) -> bool:
    """Letters and digits (Unicode categories L* and N*) make words; punctuation, symbols and
    whitespace separate them (they are still counted as neighbours)."""
    return unicodedata.category(char)[0] in "LN"


class TextCodes:
    """A text, line by line, as int32 codes (one per character, `BOUNDARY` between lines), with the
    table back to characters. Characters are normalised as the featuriser does under
    `data.normalize` (NFKC kept to one character; every whitespace is `SPACE`)."""

    def __init__(self, normalize: bool = True):
        self.normalize = normalize
        self.codes = array("i", [BOUNDARY])
        self.index: dict[str, int] = {}
        self.chars: list[str] = [""]  # code -> character; code 0 is the boundary
        self.word: list[bool] = [False]  # code -> whether the character makes words

    def add_line(self, line: str) -> None:
        for char in self.normalized(line):
            code = self.index.get(char)
            if code is None:
                code = self.index[char] = len(self.chars)
                self.chars.append(char)
                self.word.append(is_word_char(char))
            self.codes.append(code)
        self.codes.append(BOUNDARY)

    def normalized(self, line: str) -> str:
        """`line` as a lexicon is matched against it (nerkit.features.featurizer.units)."""
        return "".join(SPACE if c.isspace() else normalize_char(c) if self.normalize else c for c in line)

    def __len__(self) -> int:
        return len(self.codes)


@dataclass(frozen=True)
class Candidate:
    """A discovered word: its count in the text, cohesion (nats) and freedom (nats)."""

    word: str
    count: int
    cohesion: float
    freedom: float

    @property
    def score(self) -> float:
        """Cohesion + freedom, rounded so that the order does not hang on the last bits of a float."""
        return round(self.cohesion + self.freedom, 6)


def discover(text: TextCodes, max_len: int = DEFAULT_MAX_LEN, min_count: int = DEFAULT_MIN_COUNT,
             min_cohesion: float = DEFAULT_MIN_COHESION, min_freedom: float = DEFAULT_MIN_FREEDOM,
             step: Callable[[], None] = lambda: None) -> list[Candidate]:
    """The words of `text`: n-grams of 2..`max_len` word characters seen at least `min_count` times
    whose cohesion is at least `min_cohesion` and freedom at least `min_freedom`, less those that
    occur only inside a longer kept word (`drop_pieces`); best score first, then by string.
    `step` is called once per n-gram length (a progress display)."""
    scored = score_ngrams(text, max_len, min_count, step, min_cohesion, min_freedom)
    kept = [c for c in scored if not c.word.isdigit()]  # a number is no word: 1998, 10
    kept = drop_pieces(kept)
    return sorted(kept, key=lambda c: (-c.score, c.word))


def score_ngrams(text: TextCodes, max_len: int, min_count: int, step: Callable[[], None] = lambda: None,
                 min_cohesion: float = -math.inf, min_freedom: float = -math.inf) -> list[Candidate]:
    """Every n-gram of 2..`max_len` word characters seen at least `min_count` times, scored (those
    below `min_cohesion` or `min_freedom` are left out before they become objects: most are).

    count(x) counts every position x starts at (overlaps too); p(x) = count(x) / N with N the number
    of word characters. cohesion(w) = min over splits w = a + b of log p(w) / (p(a) p(b)).
    freedom(w) = min(H_left, H_right), each the entropy (nats) of the characters just before
    (after) w's occurrences, a line's edge counting as one more character."""
    import numpy as np  # here, so that the command line reads the defaults above without numpy

    codes = np.frombuffer(text.codes, dtype=np.int32)
    n_pos = len(codes)
    padded = np.concatenate([codes, np.full(max_len, BOUNDARY, dtype=np.int32)])  # n-grams near the end
    is_word = np.array(text.word, dtype=bool)[padded]
    latin_codes = np.array([c.isascii() and c.isalnum() for c in text.chars], dtype=bool)
    n_words = int(is_word.sum())
    # Positions sorted on their next max_len characters: the occurrences of one n-gram are a run.
    order = np.lexsort([padded[k:k + n_pos] for k in reversed(range(max_len))])
    new_group = np.zeros(n_pos, dtype=bool)
    new_group[0] = True
    valid = np.ones(n_pos, dtype=bool)  # valid[p]: the n characters from p are all word characters
    counts_at = [np.empty(0, dtype=np.int32)]  # counts_at[n][p]: count of the n-gram at p
    found: list[Candidate] = []
    for n in range(1, max_len + 1):
        column = padded[order + n - 1]
        new_group[1:] |= column[1:] != column[:-1]
        valid &= is_word[n - 1:n - 1 + n_pos]
        starts = np.flatnonzero(new_group)
        group_counts = np.diff(np.append(starts, n_pos))
        group_of = np.cumsum(new_group) - 1  # sorted index -> group
        at = np.empty(n_pos + max_len, dtype=np.int32)
        at[order] = group_counts[group_of]
        at[n_pos:] = 0
        counts_at.append(at)
        if n >= 2:
            found += _score_length(padded, order, n, starts, group_counts, group_of, valid, min_count,
                                   counts_at, n_words, text.chars, latin_codes, min_cohesion, min_freedom)
        step()
    return found


def _score_length(padded, order, n, starts, group_counts, group_of, valid, min_count, counts_at, n_words,
                  chars, latin_codes, min_cohesion, min_freedom) -> list[Candidate]:
    """The scored candidates of length `n` (one per sorted run of n-grams)."""
    import numpy as np

    first = order[starts]  # one position of each group
    candidate = valid[first] & (group_counts >= min_count)
    if not candidate.any():
        return []
    members = np.flatnonzero(candidate[group_of])  # sorted indices of the candidates' occurrences
    positions, groups = order[members], group_of[members]
    # A piece of a Latin word (in, er of protein, tachycardia) is no word: a candidate that cuts a run
    # of ASCII letters and digits in most of its occurrences is left out.
    latin = latin_codes[padded]
    cuts = (latin[positions - 1] & latin[positions]) | (latin[positions + n - 1] & latin[positions + n])
    cut_counts = np.bincount(groups, weights=cuts, minlength=len(group_counts))
    candidate &= 2 * cut_counts <= group_counts
    left = _entropy(groups, padded[positions - 1], group_counts)
    right = _entropy(groups, padded[positions + n], group_counts)
    ids = np.flatnonzero(candidate)
    where, count = first[ids], group_counts[ids].astype(np.float64)
    cohesion = np.full(len(ids), np.inf)
    for k in range(1, n):
        pieces = counts_at[k][where].astype(np.float64) * counts_at[n - k][where + k]
        cohesion = np.minimum(cohesion, np.log(count * n_words / pieces))
    freedom = np.minimum(left[ids], right[ids])
    passed = (cohesion >= min_cohesion) & (freedom >= min_freedom)
    where, count, cohesion, freedom = where[passed], count[passed], cohesion[passed], freedom[passed]
    return [Candidate("".join(chars[c] for c in padded[p:p + n]), int(c), float(h), float(f))
            for p, c, h, f in zip(where.tolist(), count.tolist(), cohesion.tolist(), freedom.tolist())]


def _entropy(groups, neighbours, group_counts):
    """Per group, the entropy (nats) of its occurrences' neighbours: H = log c - sum(m log m) / c,
    m running over the counts of each distinct neighbour and c = sum(m). Arrays of numpy."""
    import numpy as np

    width = np.int64(int(neighbours.max()) + 1)
    pairs, m = np.unique(groups.astype(np.int64) * width + neighbours, return_counts=True)
    m = m.astype(np.float64)
    m_log_m = np.bincount(pairs // width, weights=m * np.log(m), minlength=len(group_counts))
    c = group_counts.astype(np.float64)
    return np.log(c) - m_log_m / c


def drop_pieces(candidates: list[Candidate]) -> list[Candidate]:
    """Without the candidates that are part of a longer candidate with the same count: such a piece
    never occurs outside that word (糖尿 inside 糖尿病), so it adds a lattice node that is always
    wrong. A piece that also occurs on its own (its count is higher) is kept."""
    count = {c.word: c.count for c in candidates}
    pieces = set()
    for c in candidates:
        for i in range(len(c.word)):
            for j in range(i + 2, len(c.word) + 1):
                piece = c.word[i:j]
                if piece != c.word and count.get(piece) == c.count:
                    pieces.add(piece)
    return [c for c in candidates if c.word not in pieces]
