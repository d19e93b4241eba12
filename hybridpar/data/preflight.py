"""Checks of a recipe's data section that need no process group: run before any rank starts.

They catch, in the launching process, what building the source would otherwise report only
after every rank has started: an unknown source, a missing .bin/.idx, a .bin that does not match
its .idx (index_check.py), a tokenizer whose ids do not fit the model's vocab.
"""
from __future__ import annotations

import os

from hybridpar.errors import UsageError
from hybridpar.data.index_check import check_index
from hybridpar.data.prepare import read_meta
from hybridpar.data.sources import KINDS
from hybridpar.data.tokenizers import BYTE, check_vocab, load_tokenizer


def check_data_source(kind: str, *, model_vocab: int, path: str | None = None, tokenizer: str | None = None) -> None:
    if kind not in KINDS:
        raise UsageError(f"unknown data source '{kind}': use one of {', '.join(KINDS)}")
    if kind == "synthetic":
        return
    if kind == "embedded":
        tok = load_tokenizer(tokenizer or BYTE)
        check_vocab(tok.vocab_size, model_vocab, tok.name)
        return
    if not path:
        raise UsageError("the indexed data source needs data.path, the prefix of a .bin/.idx pair")
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
