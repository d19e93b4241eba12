"""Statistics of a prepared dataset; the unigram entropy is the loss a model must beat to show it
learned more than token frequencies."""
from __future__ import annotations

import math

import numpy

from hybridpar.data.index_check import check_index


def token_counts(prefix: str) -> numpy.ndarray:
    """How often each token id occurs in PREFIX.bin (end-of-document tokens included); the pair
    is checked first (index_check.py), then the .bin is read as one flat array of its dtype."""
    summary = check_index(prefix)
    if summary.tokens == 0:
        return numpy.zeros(0, dtype=numpy.int64)
    return numpy.bincount(numpy.memmap(prefix + ".bin", dtype=summary.dtype, mode="r"))


def unigram_entropy_bits(prefix: str) -> float:
    """Entropy of the token frequencies, in bits per token (multiply by ln 2 for nats, the loss unit)."""
    return entropy_bits(token_counts(prefix))


def entropy_bits(counts: numpy.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * numpy.log2(p)).sum())


def bits_to_nats(bits: float) -> float:
    return bits * math.log(2)
