"""Tensor shapes from a bounded set. What a native library keeps per input shape (oneDNN's primitive
cache, the allocator's blocks) grows with every new shape it meets, so prediction pads its batches,
and a language model its own, to the few sizes `padded_size` gives."""

from __future__ import annotations


def padded_size(n: int) -> int:
    """`n` rounded up to the next size of the form 2^k or 3 * 2^k (1, 2, 3, 4, 6, 8, 12, 16, 24, 32,
    48, 64, 96, 128, 192, 256, ...): less than half again as large, and two sizes per doubling."""
    if n <= 2:
        return max(n, 1)
    power = 1 << (n - 1).bit_length()  # the least power of two >= n
    return power * 3 // 4 if power * 3 // 4 >= n else power
