"""Tokenize text into megatron-core's indexed dataset format (PREFIX.bin + PREFIX.idx).

Documents: a plain-text file is one document (a book, a source file); a JSON-lines file
(``.jsonl`` / ``.json``) has one document per line under a key (default ``"text"``). Every
document is followed by the tokenizer's end-of-document id, as Megatron-LM's
``tools/preprocess_data.py --append-eod`` does, and is written as one sequence of one document.

Documents are tokenized in batches (``BATCH_DOCUMENTS`` documents or ``BATCH_BYTES`` of text, whichever
comes first) with the tokenizer's ``encode_batch``, which a Hugging Face tokenizer spreads over every
core; the ids are those of one document at a time, in input order (``hybridpar bench data_prepare``
measures the gain).

Nothing half-written is left behind: the files are built under temporary names and renamed into
place at the end (.bin first, then .idx, then the PREFIX.meta.json sidecar that records the
tokenizer so a source can later check it against the model's vocab and decode samples).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Iterator, Sequence

from hybridpar.errors import UsageError
from hybridpar.files import why_not_writable
from hybridpar.data.tokenizers import Tokenizer

JSONL_SUFFIXES = (".jsonl", ".json")
BATCH_DOCUMENTS = 1024
BATCH_BYTES = 16 * 2**20


@dataclass
class PreparedData:
    prefix: str
    tokenizer: str  # what load_tokenizer takes to rebuild the tokenizer
    vocab_size: int
    eod: int
    documents: int
    tokens: int


def meta_path(prefix: str) -> str:
    return prefix + ".meta.json"


def read_meta(prefix: str) -> PreparedData | None:
    """The sidecar written by ``prepare``; None for data prepared elsewhere (e.g. Megatron-LM)."""
    try:
        with open(meta_path(prefix)) as f:
            return PreparedData(**json.load(f))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as err:  # not JSON, or not the fields written by prepare
        raise UsageError(f"{meta_path(prefix)} is unreadable ({err}); prepare the data again") from None


def iter_documents(path: str, json_key: str = "text") -> Iterator[tuple[str, int]]:
    """Yield (document text, bytes of input consumed) for one input file."""
    try:
        if path.endswith(JSONL_SUFFIXES):
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    if line.strip():
                        yield _json_text(line, json_key, path, number), len(line.encode("utf-8"))
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            yield text, len(text.encode("utf-8"))
    except UnicodeDecodeError as err:
        raise UsageError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); convert it first") from None
    except OSError as err:
        raise UsageError(f"cannot read {path}: {err.strerror}") from None


def _json_text(line: str, key: str, path: str, number: int) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise UsageError(f"{path}:{number}: not a JSON object ({err.msg}); one JSON object per line") from None
    if not isinstance(record, dict) or not isinstance(record.get(key), str):
        raise UsageError(f"{path}:{number}: no string under key '{key}'; name the text key with --json-key")
    return record[key]


def check_inputs(inputs: Sequence[str]) -> None:
    if not inputs:
        raise UsageError("no input files: give text or JSON-lines files, or --embedded")
    for path in inputs:
        if not os.path.isfile(path):
            raise UsageError(f"input {path} does not exist or is not a file")


def _make_out_dir(prefix: str) -> list[str]:
    """Create the output directory; return the directories created, deepest first, for clean-up."""
    directory = os.path.dirname(os.path.abspath(prefix))
    why = why_not_writable(directory)
    if why:
        raise UsageError(f"cannot create output directory {directory} ({why}); choose another --out")
    created = []
    missing = directory
    while not os.path.exists(missing):
        created.append(missing)
        missing = os.path.dirname(missing)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as err:  # what why_not_writable cannot see: a read-only or pseudo filesystem
        raise UsageError(f"cannot create output directory {directory}: {err.strerror}; choose another --out") from None
    return created


class _Builder:
    """megatron-core's IndexedDatasetBuilder on temporary paths, opened at the first document so that
    bad or empty input fails before megatron is even imported."""

    def __init__(self, tmp_prefix: str, vocab_size: int):
        import numpy
        import torch

        from hybridpar.data._megatron import import_megatron

        self._numpy, self._torch = numpy, torch
        indexed = import_megatron("megatron.core.datasets.indexed_dataset")
        self.bin_path, self.idx_path = indexed.get_bin_path(tmp_prefix), indexed.get_idx_path(tmp_prefix)
        self.builder = indexed.IndexedDatasetBuilder(self.bin_path, dtype=indexed.DType.optimal_dtype(vocab_size))

    def add_document(self, ids: list[int]) -> None:
        self.builder.add_item(self._torch.from_numpy(self._numpy.asarray(ids, dtype=self._numpy.int64)))
        self.builder.end_document()

    def finalize(self) -> None:
        self.builder.finalize(self.idx_path)

    def discard(self) -> None:
        self.builder.data_file.close()
        for path in (self.bin_path, self.idx_path):
            if os.path.exists(path):
                os.remove(path)


def _batches(inputs: Sequence[str], json_key: str) -> Iterator[tuple[list[str], int]]:
    """(non-blank documents, input bytes they span) in input order, BATCH_DOCUMENTS or BATCH_BYTES at a time."""
    texts, size, consumed = [], 0, 0
    for path in inputs:
        for text, used in iter_documents(path, json_key):
            consumed += used
            if not text.strip():
                continue
            texts.append(text)
            size += len(text)
            if len(texts) >= BATCH_DOCUMENTS or size >= BATCH_BYTES:
                yield texts, consumed
                texts, size, consumed = [], 0, 0
    if texts or consumed:
        yield texts, consumed


def prepare(
    inputs: Sequence[str],
    prefix: str,
    tokenizer: Tokenizer,
    json_key: str = "text",
    progress: bool = True,
) -> PreparedData:
    from tqdm import tqdm

    check_inputs(inputs)
    created_dirs = _make_out_dir(prefix)
    tmp = f"{prefix}.tmp-{os.getpid()}"
    builder = None
    documents = tokens = 0
    total_bytes = sum(os.path.getsize(p) for p in inputs)
    # disable=None: a bar on terminals only; leave=False: an error message stays the only line.
    bar = tqdm(
        total=total_bytes, unit="B", unit_scale=True, desc="tokenizing", leave=False, disable=None if progress else True
    )
    try:
        with bar:
            for texts, consumed in _batches(inputs, json_key):
                for ids in tokenizer.encode_batch(texts):
                    ids.append(tokenizer.eod)
                    builder = builder or _Builder(tmp, tokenizer.vocab_size)
                    builder.add_document(ids)
                    documents += 1
                    tokens += len(ids)
                bar.update(consumed)
        if builder is None:
            raise UsageError(f"no text in {', '.join(inputs)}: every input is empty")
        builder.finalize()
        data = PreparedData(prefix, tokenizer.name, tokenizer.vocab_size, tokenizer.eod, documents, tokens)
        with open(tmp + ".meta.json", "w") as f:
            json.dump(asdict(data), f, indent=1)
        os.replace(builder.bin_path, prefix + ".bin")
        os.replace(builder.idx_path, prefix + ".idx")
        os.replace(tmp + ".meta.json", meta_path(prefix))
        return data
    except BaseException:
        if builder is not None:
            builder.discard()
        if os.path.exists(tmp + ".meta.json"):
            os.remove(tmp + ".meta.json")
        for directory in created_dirs:
            try:
                os.rmdir(directory)
            except OSError:
                break
        raise
