"""Long texts: a text longer than the prediction window is read in overlapping windows, and the
windows' tag sequences are stitched into one valid sequence where no entity crosses."""

from __future__ import annotations

from nerkit.data.tags import continues, invalid_transition, split_tag
from nerkit.errors import UserError

# ------------------------------------------------------------------------------ long texts
# A text longer than the prediction window (Pipeline.window: the longest training sentence, at most
# data.max_len) is read in windows of that many characters that overlap by half a window, so every
# character but those near the text's own ends has at least a quarter window of context on each
# side. Each pair of neighbouring windows hands over at a stitch point inside their overlap: the
# point nearest the overlap's middle (where a character is as central in one window as in the
# other) that is an entity boundary in both windows' tag sequences. Every entity then comes whole
# from one window, and the stitched sequence is valid because each window's is. Only when no point
# of the overlap is a boundary in both (an entity at least as long as the overlap) does the
# hand-over happen at the middle, where `_join` makes the two sequences meet validly.


def check_window(window) -> None:
    """A prediction window someone chose (`--window`, `window=`): a whole number of characters, 0
    for none (each text read whole)."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise UserError(f"the prediction window must be a whole number of characters, at least 0, not {window!r}",
                        fix="use N >= 1, or 0 to read each text whole")


def text_windows(length: int, max_len: int) -> list[tuple[int, int]]:
    """(start, end) of the windows over a text of `length` characters: one when it fits in
    `max_len` (or `max_len` is 0), else windows of exactly `max_len` characters, evenly spaced
    from the start to the end, each starting at most half a window after the previous one."""
    if length == 0:
        return []
    if max_len <= 0 or length <= max_len:
        return [(0, length)]
    stride = max_len - max_len // 2  # ceil(max_len / 2): overlaps of at least max_len // 2
    count = -(-(length - max_len) // stride) + 1
    starts = [k * (length - max_len) // (count - 1) for k in range(count)]
    return [(a, a + max_len) for a in starts]


def _is_boundary(tags: list[str], q: int) -> bool:
    """Whether no entity of the valid sequence `tags` crosses position `q` (between tags q-1 and q)."""
    return q <= 0 or q >= len(tags) or not continues(tags[q])


def stitch(found: list[tuple[int, list[str]]], scheme: str) -> list[str]:
    """One valid tag sequence from the tag sequences of overlapping windows, `(start, tags)` in
    order of their start as `windows` placed them: each window decides the characters between its
    stitch points with its neighbours (see the comment above)."""
    tags: list[str] = []
    joins = []  # stitch points where the two windows do not share a boundary
    taken = 0  # characters of the text decided so far
    for (a0, left), (a1, right) in zip(found, found[1:]):
        b0 = a0 + len(left)
        middle = a1 + b0  # twice the overlap's middle, in integers
        points = range(max(a1, taken), b0 + 1)
        shared = [p for p in points if _is_boundary(left, p - a0) and _is_boundary(right, p - a1)]
        if shared:
            point = min(shared, key=lambda p: (abs(2 * p - middle), p))
        else:
            point = min(max(middle // 2, points.start), points.stop - 1)
            joins.append(point)
        tags += left[taken - a0:point - a0]
        taken = point
    last_start, last = found[-1]
    tags += last[taken - last_start:]
    for point in joins:
        _join(tags, point, scheme)
    return tags


def _join(tags: list[str], point: int, scheme: str) -> None:
    """Make `tags[point - 1] -> tags[point]`, two windows' decisions, a valid transition, changing
    only those two tags and keeping each valid with its other neighbour. An entity that one window
    ends at the stitch point and the other continues across it becomes one entity; otherwise a
    continuation without its start starts there, and an entity left open is closed."""
    if point <= 0 or point >= len(tags) or not invalid_transition(tags[point - 1], tags[point], scheme):
        return
    (lp, lt), (rp, rt) = split_tag(tags[point - 1]), split_tag(tags[point])
    inside = "M" if scheme == "bmes" else "I"
    if rp in ("I", "M", "E") and lp in ("E", "S") and lt == rt:  # ended on the left, continued on the right
        tags[point - 1] = f"{inside}-{lt}" if lp == "E" else f"B-{lt}"
        return
    if rp in ("I", "M", "E"):  # a continuation that nothing on the left opens: it starts here
        tags[point] = f"B-{rt}" if rp != "E" else f"S-{rt}"
    if scheme != "bio" and lp in ("B", "I", "M"):  # an entity the left window leaves open: it ends here
        tags[point - 1] = f"S-{lt}" if lp == "B" else f"E-{lt}"
