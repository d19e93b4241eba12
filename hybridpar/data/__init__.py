"""Token batches for training.

Contract shared by every source (synthetic, embedded corpus, megatron indexed datasets):

* ``source.global_batch(step)`` returns a LongTensor of shape ``[global_batch, seq_len + 1]``
  for optimizer step ``step`` (1-based), a pure function of (seed, step): a resumed run gets
  exactly the samples it would have had.
* ``source.rows(step, start, stop)`` is rows ``[start, stop)`` of that batch, built without
  the others: each rank reads only its replica's rows.
* Columns ``[:, :-1]`` are inputs and ``[:, 1:]`` are labels.
* ``replica_rows(batch, dp_rank, dp)`` is DP replica ``dp_rank``'s disjoint, contiguous slice;
  ``replica_batch(source, step, dp_rank, dp)`` builds the same slice alone. Every TP/CP/PP rank
  of that replica takes the same slice, then splits it into micro-batches in order
  (``prefetch.BatchPrefetcher`` builds the next step's slice while this one trains).
"""
from .batches import SyntheticTokens, TokenSource, replica_batch, replica_rows
from .prefetch import BatchPrefetcher
from .indexed import IndexedTokens
from .prepare import PreparedData, prepare
from .sources import make_token_source
from .tokenizers import ByteTokenizer, HFTokenizer, VocabMismatchError, check_vocab, load_tokenizer

__all__ = [
    "BatchPrefetcher",
    "ByteTokenizer",
    "HFTokenizer",
    "IndexedTokens",
    "PreparedData",
    "SyntheticTokens",
    "TokenSource",
    "VocabMismatchError",
    "check_vocab",
    "load_tokenizer",
    "make_token_source",
    "prepare",
    "replica_batch",
    "replica_rows",
]
