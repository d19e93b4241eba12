"""Checks of a recipe's data section that need no process group: run before any rank starts.

They catch, in the launching process, what building the source would otherwise report only
after every rank has started: an unknown source, a missing .bin/.idx, a .bin that does not match
its .idx (index_check.py), a tokenizer whose ids do not fit the model's vocab, a held-out share
that leaves either part without a sample (held_out.py).
"""
from __future__ import annotations

import os

from hybridpar.errors import UsageError
from hybridpar.data.embedded import corpus_files
from hybridpar.data.held_out import check_parts, check_split
from hybridpar.data.index_check import check_index
from hybridpar.data.prepare import read_meta
from hybridpar.data.sources import KINDS
from hybridpar.data.tokenizers import BYTE, check_vocab, load_tokenizer


def check_data_source(kind: str, *, model_vocab: int, path: str | None = None, tokenizer: str | None = None,
                      held_out: float = 0.0, seq_len: int = 1, blend: dict | None = None) -> None:
    if kind not in KINDS:
        raise UsageError(f"unknown data source '{kind}': use one of {', '.join(KINDS)}")
    if kind == "synthetic":
        return
    if kind == "embedded":
        tok = load_tokenizer(tokenizer or BYTE)
        check_vocab(tok.vocab_size, model_vocab, tok.name)
        if held_out:  # one sequence per play; a play's bytes bound its tokens from above
            files = corpus_files()
            check_parts("the embedded corpus", [os.path.getsize(f) for f in files], held_out, seq_len)
        return
    if blend:
        for prefix in blend:
            _check_indexed(prefix, model_vocab, tokenizer, held_out, seq_len)
        return
    if not path:
        raise UsageError("the indexed data source needs data.path, the prefix of a .bin/.idx pair")
    _check_indexed(path, model_vocab, tokenizer, held_out, seq_len)


def _check_indexed(path: str, model_vocab: int, tokenizer: str | None, held_out: float, seq_len: int) -> None:
    for ext in (".bin", ".idx"):
        if not os.path.isfile(path + ext):
            raise UsageError(f"no indexed dataset at {path}: {path}{ext} is missing; run `hybridpar data prepare`")
    check_index(path)
    meta = read_meta(path)
    if tokenizer:
        tok = load_tokenizer(tokenizer)
        check_vocab(tok.vocab_size, model_vocab, tok.name)
    elif meta is not None:
        check_vocab(meta.vocab_size, model_vocab, meta.tokenizer)
    if held_out:
        check_split(path, held_out, seq_len)
