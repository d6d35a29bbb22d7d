"""Viterbi decoding of a sequence that arrives a piece at a time, in memory that does not grow with
its length: what reading a text of any length segment by segment (Transformer-XL's memory) needs
from the CRF.

The best path to each tag at the newest position is known after every step, but which of them the
final path will follow is not, until the sequence ends. What is known earlier: once the best paths to
every live tag at the newest position pass through the same tag at some position p, every tag up to p
is settled, whatever comes later (any final path ends in one of those tags and so goes through that
one at p). In NER the paths meet within a few characters of every `O`, so positions settle almost as
fast as they arrive and only the unsettled tail keeps back-pointers. The tags that come out equal
`CRF.decode` over the whole sequence (the same float32 sums in the same order, the first of equal
maxima as torch takes it); a test holds them to it.

If the paths did not meet within `limit` positions (a pathological model), the oldest half of the
tail is settled by the currently best path, and only the paths that continue it stay live, so memory
stays bounded and the tags valid; the only case that can differ from decoding the whole, counted in
`forced`.
"""

from __future__ import annotations

import numpy as np


class StreamingViterbi:
    """Decode one sequence after another, each pushed in pieces of emissions (n, K).

    `push(emissions)` returns the tag ids that it settled (in order, continuing those returned
    before); `finish()` ends the current sequence and returns the rest of its tags; the next `push`
    starts a new sequence. start, transitions and end are the CRF's scores with forbidden moves at
    -inf (`CRF.decoding_scores`)."""

    def __init__(self, start: np.ndarray, transitions: np.ndarray, end: np.ndarray, limit: int = 4096):
        self.start, self.transitions, self.end = start, transitions, end  # (K,), (K, K), (K,) float32
        self.limit = limit
        self.forced = 0  # how many times the tail was settled before its paths met
        self._reset()

    def _reset(self) -> None:
        self.score: np.ndarray | None = None  # (K,) best path score ending in each tag, at the newest position
        self.pointers: list[np.ndarray] = []  # one (K,) per unsettled position after the first: best previous tag
        self.first = 0  # the position of the sequence that pointers[0] leads back to

    def push(self, emissions: np.ndarray) -> list[int]:
        """Add the emissions (n, K) of the next n positions; the tags now settled."""
        emissions = np.asarray(emissions, dtype=self.transitions.dtype)
        rows = iter(emissions)
        if self.score is None:
            first = next(rows, None)
            if first is None:
                return []
            self.score = self.start + first
        for row in rows:
            candidates = self.score[:, None] + self.transitions  # (K, K): previous tag x next tag
            best = candidates.argmax(axis=0)  # (K,)
            self.score = candidates[best, np.arange(len(best))] + row
            self.pointers.append(best)
        return self._settle()

    def finish(self) -> list[int]:
        """End the sequence: the tags not yet returned (none for an empty one)."""
        if self.score is None:
            return []
        tags = self._trace(int(np.argmax(self.score + self.end)), len(self.pointers))  # first .. newest
        self._reset()
        return tags

    def _settle(self) -> list[int]:
        """Return the tags of the positions where the best paths to all live tags have met."""
        met, tag = self._meeting()
        if len(self.pointers) - met >= self.limit:  # a tail that would grow without bound
            self.forced += 1  # settle by the best path now, keeping half the limit unsettled
            met = len(self.pointers) - self.limit // 2
            tag = self._path_from_end()[met]
            self._keep_paths_through(met, tag)
        if met == 0:
            return []
        settled = self._trace(tag, met)[:-1]  # first .. first + met - 1; the met one stays the first
        self.pointers = self.pointers[met:]
        self.first += met
        return settled

    def _meeting(self) -> tuple[int, int]:
        """The latest k at which the best paths to every live tag of the newest position have one tag
        at position first + k, and that tag; (0, -1) when they have not met since the first."""
        tags = np.flatnonzero(np.isfinite(self.score))  # tags some valid path reaches
        for k in range(len(self.pointers) - 1, -1, -1):
            tags = np.unique(self.pointers[k][tags])
            if len(tags) == 1:
                return k, int(tags[0])
        return 0, -1

    def _trace(self, tag: int, k: int) -> list[int]:
        """The tags of positions first .. first + k, following pointers back from `tag` at first + k."""
        path = [tag]
        for pointers in reversed(self.pointers[:k]):
            tag = int(pointers[tag])
            path.append(tag)
        path.reverse()
        return path

    def _keep_paths_through(self, k: int, tag: int) -> None:
        """Drop the newest position's tags whose best path does not have `tag` at position first + k,
        so that what follows a forced settling continues it validly."""
        for end in np.flatnonzero(np.isfinite(self.score)):
            if self._trace(int(end), len(self.pointers))[k] != tag:
                self.score[end] = -np.inf

    def _path_from_end(self) -> list[int]:
        """The unsettled positions' tags on the best path to the best tag now (no end score yet)."""
        return self._trace(int(np.argmax(self.score)), len(self.pointers))
