"""A token source over megatron-core indexed datasets (.bin/.idx), through its GPTDataset.

Global sample ``i`` (step ``s`` takes ``[(s-1)*B, s*B)``) is sample ``i mod N`` of epoch
``i // N``, where N is the number of seq_len+1 token samples in one epoch of megatron-core's
GPTDataset (documents shuffled, concatenated, cut into samples, samples shuffled, all seeded by
``seed``). Epoch 0 is megatron's order; epoch e > 0 permutes it again with a generator seeded by
(seed, e). So a batch depends only on (seed, step): a resumed run continues at the next sample,
however many steps the run asks for.

With ``held_out`` > 0 the last share of the dataset's sequences is megatron's validation split
(held_out.py): training samples come from the rest, and ``held_out_source()`` gives the same
contract over the held-out part (its own shuffle, the same seed) for evaluation.

megatron-core's builder is collective when torch.distributed is initialized: rank 0 builds the
index files into the cache directory, the other ranks wait at a barrier and then load them, so
every rank must construct the source, and the cache directory must be shared (megatron's default,
PREFIX/cache/GPTDataset_indices, when ``cache_dir`` is None). Without torch.distributed each
process builds the indices in memory through a private temporary directory.
"""
from __future__ import annotations

import copy
import json
import os
import tempfile
from collections import OrderedDict
from functools import lru_cache

import numpy
import torch

from hybridpar.errors import UsageError
from hybridpar.data.held_out import split_weights
from hybridpar.data.index_check import check_index
from hybridpar.data.prepare import read_meta
from hybridpar.data.tokenizers import check_vocab, load_tokenizer


class MegatronTokenizerAdapter:
    """What GPTDataset reads from a tokenizer: ``eod``, ``vocab_size`` and an identity for its cache key."""

    def __init__(self, name: str, vocab_size: int, eod: int):
        self.vocab_size = vocab_size
        self.eod = eod
        self.unique_identifiers = OrderedDict(class_="hybridpar", name=name, vocab_size=vocab_size, eod=eod)
        self.unique_description = json.dumps(self.unique_identifiers)


class IndexedTokens:
    """The batch contract (hybridpar/data/__init__.py) over a prepared PREFIX.bin/.idx."""

    def __init__(
        self,
        prefix: str,
        seq_len: int,
        global_batch_size: int,
        seed: int = 0,
        tokenizer=None,
        cache_dir: str | None = None,
        model_vocab: int | None = None,
        held_out: float = 0.0,
    ):
        for ext in (".bin", ".idx"):
            if not os.path.isfile(prefix + ext):
                raise UsageError(
                    f"no indexed dataset at {prefix}: {prefix}{ext} is missing; run `hybridpar data prepare`"
                )
        check_index(prefix)
        meta = read_meta(prefix)
        if tokenizer is None and meta is None:
            raise UsageError(
                f"{prefix} has no .meta.json (prepared elsewhere): name the tokenizer it was prepared with"
            )
        if tokenizer is None:
            tokenizer = load_tokenizer(meta.tokenizer, eod_id=meta.eod)
        if model_vocab is not None:
            check_vocab(tokenizer.vocab_size, model_vocab, tokenizer.name)
        self.tokenizer = tokenizer
        self.prefix = prefix
        self.seq_len = seq_len
        self.global_batch_size = global_batch_size
        self.vocab_size = tokenizer.vocab_size
        self.seed = seed
        self.held_out = held_out
        self.dataset, self._held_dataset = _build_gpt_dataset(prefix, seq_len, seed, tokenizer, cache_dir, held_out)
        self.samples_per_epoch = len(self.dataset)
        if self.samples_per_epoch == 0:
            raise UsageError(
                f"{prefix} holds fewer than seq_len+1 = {seq_len + 1} tokens: use more text or a shorter sequence"
            )
        if self._held_dataset is not None and len(self._held_dataset) == 0:
            raise UsageError(f"the held-out part of {prefix} (data.held_out {held_out:g}) holds fewer than seq_len+1 = "
                             f"{seq_len + 1} tokens: raise data.held_out or use a shorter sequence")

    def held_out_source(self) -> "IndexedTokens | None":
        """The held-out sequences under the same batch contract (None without ``held_out``)."""
        if self._held_dataset is None:
            return None
        view = copy.copy(self)
        view.dataset, view._held_dataset = self._held_dataset, None
        view.samples_per_epoch = len(self._held_dataset)
        return view

    def global_batch(self, step: int) -> torch.Tensor:
        if step < 1:
            raise ValueError(f"steps are 1-based, got {step}")
        return self.rows(step, 0, self.global_batch_size)

    def rows(self, step: int, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` of step ``step``'s global batch; reads only those samples."""
        if step < 1:
            raise ValueError(f"steps are 1-based, got {step}")
        first = (step - 1) * self.global_batch_size
        return torch.stack([self.sample(i) for i in range(first + start, first + stop)])

    def sample(self, index: int) -> torch.Tensor:
        """Global sample ``index`` (0-based, over all epochs): seq_len+1 token ids."""
        epoch, within = divmod(index, self.samples_per_epoch)
        if epoch:
            within = int(self._epoch_order(epoch)[within])
        item = self.dataset[within]
        return torch.cat([item["tokens"], item["labels"][-1:]])

    @lru_cache(maxsize=2)  # a batch spans at most two epochs unless it is larger than an epoch
    def _epoch_order(self, epoch: int) -> numpy.ndarray:
        return numpy.random.RandomState([self.seed % 2**32, epoch]).permutation(self.samples_per_epoch)


def _build_gpt_dataset(prefix: str, seq_len: int, seed: int, tokenizer, cache_dir: str | None, held_out: float = 0.0):
    """(training dataset, held-out dataset or None): megatron's train and validation splits."""
    from hybridpar.data._megatron import import_megatron

    BlendedMegatronDatasetBuilder = import_megatron(
        "megatron.core.datasets.blended_megatron_dataset_builder"
    ).BlendedMegatronDatasetBuilder
    gpt = import_megatron("megatron.core.datasets.gpt_dataset")
    GPTDataset, GPTDatasetConfig = gpt.GPTDataset, gpt.GPTDatasetConfig

    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    private_cache = None if (distributed or cache_dir) else tempfile.TemporaryDirectory(prefix="hybridpar-gpt-")
    try:
        config = GPTDatasetConfig(
            random_seed=seed,
            sequence_length=seq_len,
            blend=([prefix], None),
            split=split_weights(held_out),
            path_to_cache=cache_dir or (private_cache.name if private_cache else None),
            tokenizer=MegatronTokenizerAdapter(tokenizer.name, tokenizer.vocab_size, tokenizer.eod),
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=False,
            create_attention_mask=False,
        )
        train, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], lambda: True, config).build()
        return train, (valid if held_out else None)
    finally:
        if private_cache is not None:
            private_cache.cleanup()  # freshly built indices live in memory, not in these files
