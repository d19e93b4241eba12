"""Tokenizers: a built-in byte-level one, and any HuggingFace ``tokenizer.json`` from a local path.

Both expose ``name`` (what ``load_tokenizer`` accepts to rebuild it), ``vocab_size``, ``eod``
(the end-of-document id appended after every document), ``encode(text)``, ``encode_batch(texts)``
(the same ids for many documents at once: the Hugging Face tokenizer spreads them over every core)
and ``decode(ids)``.
"""
from __future__ import annotations

import os
from typing import Iterable, Protocol

from hybridpar.errors import UsageError

BYTE = "byte"

# End-of-document tokens of common tokenizer.json files, tried in order (Llama 3 first).
EOD_CANDIDATES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "<|eot_id|>", "[SEP]")


class VocabMismatchError(UsageError):
    """The tokenizer produces ids that the model's embedding cannot hold."""


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eod: int

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def decode(self, ids: Iterable[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, and 256 as end-of-document: vocab 257, no file, no training."""

    name = BYTE
    vocab_size = 257
    eod = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        # End-of-document ends a line of output; ids past the byte range (a model with a larger
        # vocab than the tokenizer can still sample them) are dropped.
        out = bytearray()
        for i in ids:
            i = int(i)
            if i < 256:
                out.append(i)
            elif i == self.eod:
                out += b"\n"
        return out.decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizer.json`` loaded with the ``tokenizers`` library (e.g. Llama 3's)."""

    def __init__(self, path: str, eod_token: str | None = None, eod_id: int | None = None):
        try:
            from tokenizers import Tokenizer as _HF
        except ImportError as err:  # pragma: no cover - requirements.txt pins it
            raise UsageError("the 'tokenizers' package is missing: pip install -r requirements.txt") from err
        self.name = os.path.abspath(path)
        try:
            self._tok = _HF.from_file(self.name)
        except Exception as err:
            raise UsageError(f"cannot load tokenizer {path}: {err}; give a HuggingFace tokenizer.json") from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eod = eod_id if eod_id is not None else self._find_eod(eod_token)

    def _find_eod(self, eod_token: str | None) -> int:
        candidates = (eod_token,) if eod_token else EOD_CANDIDATES
        for token in candidates:
            token_id = self._tok.token_to_id(token)
            if token_id is not None:
                return token_id
        raise UsageError(
            f"tokenizer {self.name} has none of the end-of-document tokens {', '.join(candidates)}: "
            "name its token with --eod-token"
        )

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # tokenizers' Rust side encodes the batch on a thread pool of every core (RAYON_NUM_THREADS caps it)
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def load_tokenizer(spec: str, eod_token: str | None = None, eod_id: int | None = None) -> Tokenizer:
    """``"byte"``, a path to a ``tokenizer.json``, or a directory holding one.

    ``eod_id`` (as recorded in a prepared dataset's .meta.json) overrides the search by name.
    """
    if spec == BYTE:
        return ByteTokenizer()
    path = os.path.join(spec, "tokenizer.json") if os.path.isdir(spec) else spec
    if not os.path.isfile(path):
        raise UsageError(f"unknown tokenizer '{spec}': use 'byte' or the path of a tokenizer.json")
    return HFTokenizer(path, eod_token, eod_id)


def check_vocab(tokenizer_vocab: int, model_vocab: int, tokenizer_name: str = "the tokenizer") -> None:
    """Refuse a tokenizer whose ids would index past the model's embedding table."""
    if tokenizer_vocab > model_vocab:
        raise VocabMismatchError(
            f"tokenizer/vocab mismatch: {tokenizer_name} has {tokenizer_vocab} tokens but the model's "
            f"vocab is {model_vocab}; use a model with vocab >= {tokenizer_vocab} or a smaller tokenizer"
        )
