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
import importlib

# prepare and tokenizers import no torch; the rest are loaded on first use, so that `hybridpar
# data` and train's pre-flight checks answer before torch and megatron are imported. (`prepare` is
# bound here, not lazily: the submodule of the same name would shadow the function.)
from hybridpar.data.prepare import PreparedData, prepare
from hybridpar.data.tokenizers import ByteTokenizer, HFTokenizer, VocabMismatchError, check_vocab, load_tokenizer

_HOME = {
    "BatchPrefetcher": "prefetch", "IndexedTokens": "indexed", "SyntheticTokens": "batches",
    "TokenSource": "batches", "make_token_source": "sources", "replica_batch": "batches", "replica_rows": "batches",
}
__all__ = sorted([*_HOME, "ByteTokenizer", "HFTokenizer", "PreparedData", "VocabMismatchError", "check_vocab",
                  "load_tokenizer", "prepare"])


def __getattr__(name):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
