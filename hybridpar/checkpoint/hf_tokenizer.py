"""The tokenizer an export carries, loadable with ``AutoTokenizer.from_pretrained(OUT_DIR)``.

- a run's ``tokenizer.json`` is copied as it is, with the ``tokenizer_config.json`` and
  ``special_tokens_map.json`` beside it when there are, else a minimal config naming its
  end-of-document token;
- hybridpar's byte tokenizer (hybridpar/data/tokenizers.py: UTF-8 bytes as ids 0..255, 256 as
  end of document) is rebuilt with the ``tokenizers`` library: byte-level pre-tokenization (the
  GPT-2 byte alphabet) into a BPE without merges whose token for byte b has id b, and
  ``<|endoftext|>`` as id 256. ``split_special_tokens`` makes the literal text "<|endoftext|>"
  encode as its bytes, as hybridpar's does; decoding id 256 gives "<|endoftext|>" where
  hybridpar's own decode prints a newline.
"""
from __future__ import annotations

import json
import os
import shutil

from hybridpar.errors import UsageError

BYTE = "byte"
BYTE_EOD_TOKEN = "<|endoftext|>"
COPIED = ("tokenizer_config.json", "special_tokens_map.json")


def choose_tokenizer(override: str | None, run: dict | None, vocab: int) -> tuple[str, str]:
    """(tokenizer spec for ``load_tokenizer``, a note saying where it came from)."""
    from hybridpar.data.tokenizers import check_vocab, load_tokenizer

    if override:
        spec, note = override, f"{override} (--tokenizer)"
    elif run is None:
        spec, note = BYTE, "byte (the checkpoint has no run.json; --tokenizer to choose)"
    else:
        spec, note = _recorded(run.get("data") or {})
    tok = load_tokenizer(spec)
    check_vocab(tok.vocab_size, vocab, tok.name)
    return spec, note


def _recorded(data: dict) -> tuple[str, str]:
    source, tokenizer = data.get("source"), data.get("tokenizer")
    if tokenizer:
        return tokenizer, f"{tokenizer} (the run's data.tokenizer)"
    if source == "embedded":
        return BYTE, "byte (the run's embedded corpus)"
    if source == "indexed":
        meta = f"{data.get('path')}.meta.json"
        try:
            with open(meta) as f:
                name = json.load(f)["tokenizer"]
        except (OSError, ValueError, KeyError, TypeError):
            raise UsageError(f"the run's data ({data.get('path')}) names no tokenizer and {meta} is unreadable: "
                             "name one with --tokenizer byte|PATH") from None
        return name, f"{name} (recorded in {meta})"
    return BYTE, "byte (the run trained on synthetic tokens; --tokenizer to choose another)"


def byte_tokenizer():
    """hybridpar's ByteTokenizer as a ``tokenizers.Tokenizer``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = _bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={alphabet[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(BYTE_EOD_TOKEN, special=True, normalized=False)])
    return tok


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, the alphabet of ByteLevel pre-tokenization."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def write_tokenizer(spec: str, out: str) -> int:
    """Write the tokenizer files into ``out``; returns the end-of-document id (config's eos)."""
    from tokenizers import Tokenizer

    from hybridpar.data.tokenizers import ByteTokenizer, load_tokenizer

    if spec == BYTE:
        byte_tokenizer().save(os.path.join(out, "tokenizer.json"))
        _write_json(os.path.join(out, "tokenizer_config.json"), {
            "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": BYTE_EOD_TOKEN,
            "split_special_tokens": True, "clean_up_tokenization_spaces": False})
        return ByteTokenizer.eod
    tok = load_tokenizer(spec)
    shutil.copyfile(tok.name, os.path.join(out, "tokenizer.json"))
    copied = False
    for name in COPIED:
        path = os.path.join(os.path.dirname(tok.name), name)
        if os.path.isfile(path):
            shutil.copyfile(path, os.path.join(out, name))
            copied = True
    if not copied:
        eos = Tokenizer.from_file(tok.name).id_to_token(tok.eod)
        _write_json(os.path.join(out, "tokenizer_config.json"), {
            "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "clean_up_tokenization_spaces": False})
    return tok.eod


def _write_json(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
