"""``make_token_source``: the one call a recipe or the trainer makes to get its batches."""
from __future__ import annotations

from typing import TYPE_CHECKING

from hybridpar.errors import UsageError
from hybridpar.data.tokenizers import check_vocab, load_tokenizer

if TYPE_CHECKING:
    from hybridpar.data.batches import TokenSource

KINDS = ("synthetic", "embedded", "indexed")


def make_token_source(
    kind: str,
    *,
    seq_len: int,
    global_batch_size: int,
    model_vocab: int,
    seed: int = 0,
    path: str | None = None,
    tokenizer: str | None = None,
    data_dir: str | None = None,
    cache_dir: str | None = None,
    held_out: float = 0.0,
    blend: dict | None = None,
) -> TokenSource:
    """Build a source that honours the batch contract.

    kind: "synthetic" (SyntheticTokens over the model's vocab), "embedded" (the shipped corpus,
    prepared on first use under ``data_dir``, default $HYBRIDPAR_DATA_DIR or ~/.cache/hybridpar,
    with ``tokenizer``, default "byte"), or "indexed" (a megatron .bin/.idx at prefix ``path``;
    ``tokenizer`` only needed when the data has no .meta.json). ``cache_dir``: megatron's index
    cache, see hybridpar/data/indexed.py. ``held_out``: the share of an indexed or embedded
    dataset's sequences kept out of training for evaluation (held_out.py); every source's
    ``held_out_source()`` gives its held-out rows. ``blend`` ({prefix: weight}, kind "indexed"
    without ``path``): a weighted mixture of indexed datasets (blend.py). Raises VocabMismatchError (a UsageError) when the
    tokenizer's vocab exceeds ``model_vocab``. Collective when torch.distributed is initialized
    (kinds "embedded" and "indexed"): call it on every rank.
    """
    if kind == "synthetic":
        from hybridpar.data.batches import SyntheticTokens

        return SyntheticTokens(seq_len=seq_len, global_batch_size=global_batch_size, vocab_size=model_vocab, seed=seed)
    from hybridpar.data.indexed import IndexedTokens

    if kind == "embedded":
        from hybridpar.data.embedded import ensure_embedded

        tok = load_tokenizer(tokenizer or "byte")
        check_vocab(tok.vocab_size, model_vocab, tok.name)
        prefix = ensure_embedded(tok, data_dir).prefix
        return IndexedTokens(prefix, seq_len, global_batch_size, seed, tok, cache_dir, model_vocab, held_out)
    if kind == "indexed" and blend:
        from hybridpar.data.blend import BlendedTokens

        tok = load_tokenizer(tokenizer) if tokenizer else None
        parts = [IndexedTokens(p, seq_len, global_batch_size, seed, tok, cache_dir, model_vocab, held_out) for p in blend]
        # token ids must mean the same in every part; a tokenizer.json copied elsewhere differs only by name
        if len({(s.tokenizer.vocab_size, s.tokenizer.eod) for s in parts}) > 1:
            found = ", ".join(f"{p} ({s.tokenizer.name}, vocab {s.tokenizer.vocab_size})" for p, s in zip(blend, parts))
            raise UsageError(f"data.blend mixes datasets of different tokenizers: {found}; prepare them with one tokenizer")
        return BlendedTokens(parts, [float(w) for w in blend.values()], seed)
    if kind == "indexed":
        if not path:
            raise UsageError("the indexed data source needs the path prefix of a .bin/.idx pair")
        tok = load_tokenizer(tokenizer) if tokenizer else None
        return IndexedTokens(path, seq_len, global_batch_size, seed, tok, cache_dir, model_vocab, held_out)
    raise UsageError(f"unknown data source '{kind}': use one of {', '.join(KINDS)}")
