"""Statistics of a prepared dataset; the unigram entropy is the loss a model must beat to show it
learned more than token frequencies."""
from __future__ import annotations

import math

import numpy

from ._megatron import import_megatron


def token_counts(prefix: str) -> numpy.ndarray:
    """How often each token id occurs in PREFIX.bin (end-of-document tokens included)."""
    dataset = import_megatron("megatron.core.datasets.indexed_dataset").IndexedDataset(prefix)
    counts = numpy.zeros(0, dtype=numpy.int64)
    for i in range(len(dataset)):
        doc = numpy.bincount(numpy.asarray(dataset[i], dtype=numpy.int64))
        if doc.size > counts.size:
            doc[: counts.size] += counts
            counts = doc
        else:
            counts[: doc.size] += doc
    return counts


def unigram_entropy_bits(prefix: str) -> float:
    """Entropy of the token frequencies, in bits per token (multiply by ln 2 for nats, the loss unit)."""
    return entropy_bits(token_counts(prefix))


def entropy_bits(counts: numpy.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * numpy.log2(p)).sum())


def bits_to_nats(bits: float) -> float:
    return bits * math.log(2)
