"""Reading measured tables between their points."""
from __future__ import annotations

import bisect


def between(xs: list[float], ys: list[float], x: float) -> float:
    """y at ``x``, on the straight line between the two measured points around it (``xs`` ascending,
    ``xs[0] <= x <= xs[-1]``; the caller decides what holds beyond the ends)."""
    i = min(max(bisect.bisect_right(xs, x), 1), len(xs) - 1)
    w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return ys[i - 1] + w * (ys[i] - ys[i - 1])
