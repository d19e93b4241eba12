"""A weighted mixture of indexed datasets (recipe ``data.blend``), under the batch contract.

Pretraining data is a mixture (web, code, books, ...), each part with its share of the samples:
Megatron-LM's ``--data-path 0.7 web 0.3 code``. Global sample ``i`` is assigned to a dataset
block by block: every block of ``BLOCK`` consecutive samples holds each dataset's exact count (its
weight x BLOCK, rounded by largest remainder so the counts add up to BLOCK), in an order shuffled
by (seed, block). Sample ``i`` is then the ``j``-th sample of its dataset, where ``j`` counts that
dataset's samples in all earlier blocks and before ``i`` in its own: each dataset is read in its
own order (IndexedTokens: megatron's GPTDataset, reshuffled every epoch), never skipping or
repeating a sample until its epoch ends. Everything is a pure function of (seed, i): a batch depends
only on (seed, step), a resumed run continues at the exact next sample, and any rows are built
without the others.

The shares are exact to 1/BLOCK over every block of BLOCK samples, whatever the run's length
(megatron's BlendedDataset reaches them over the whole run's sample count, which a longer resumed
run would change, and with it every batch).
"""
from __future__ import annotations

from hybridpar.config.mixture import BLOCK, block_counts


class BlendedTokens:
    """``sources`` (IndexedTokens of one tokenizer) mixed by ``weights``."""

    def __init__(self, sources: list, weights: list[float], seed: int = 0):
        first = sources[0]
        self.sources, self.weights, self.seed = list(sources), list(weights), seed
        self.blend = {s.prefix: w for s, w in zip(self.sources, self.weights)}  # what a checkpoint records
        self.seq_len, self.global_batch_size = first.seq_len, first.global_batch_size
        self.vocab_size, self.tokenizer = first.vocab_size, first.tokenizer
        self.counts = block_counts(self.weights)
        self.held_out = first.held_out
        self._blocks: dict = {}  # the last few blocks' layouts (a batch spans one or two)

    def held_out_source(self) -> "BlendedTokens | None":
        """Each dataset's held-out part (IndexedTokens.held_out_source), mixed by the same weights."""
        held = [s.held_out_source() for s in self.sources]
        if any(h is None for h in held):
            return None
        return BlendedTokens(held, self.weights, self.seed)

    def _block(self, block: int):
        """(dataset of each position in the block, its index among that dataset's samples in the block)."""
        if block in self._blocks:
            return self._blocks[block]
        import numpy

        labels = numpy.repeat(numpy.arange(len(self.counts)), self.counts)
        labels = labels[numpy.random.RandomState([self.seed % 2**32, block, 0xB1E4D]).permutation(BLOCK)]
        within = numpy.empty(BLOCK, dtype=numpy.int64)
        for k, count in enumerate(self.counts):
            within[labels == k] = numpy.arange(count)
        if len(self._blocks) >= 4:
            self._blocks.pop(next(iter(self._blocks)))
        self._blocks[block] = labels, within
        return labels, within

    def origin(self, index: int) -> tuple[int, int]:
        """(dataset, which of its samples) global sample ``index`` is."""
        block, pos = divmod(index, BLOCK)
        labels, within = self._block(block)
        k = int(labels[pos])
        return k, block * self.counts[k] + int(within[pos])

    def sample(self, index: int):
        k, j = self.origin(index)
        return self.sources[k].sample(j)

    def rows(self, step: int, start: int, stop: int):
        import torch

        if step < 1:
            raise ValueError(f"steps are 1-based, got {step}")
        first = (step - 1) * self.global_batch_size
        return torch.stack([self.sample(i) for i in range(first + start, first + stop)])

    def global_batch(self, step: int):
        return self.rows(step, 0, self.global_batch_size)
