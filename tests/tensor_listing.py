"""Tensor-by-tensor listings the fp8 tests write from Transformer Engine's code, as (elements per token, bytes per
element) pairs, and what a listing adds up to."""
from __future__ import annotations


def listed_bytes(forward: list, backward: list) -> tuple[float, float]:
    """Bytes per token of a layer's forward and backward listings."""
    return sum(n * x for n, x in forward), sum(n * x for n, x in backward)
