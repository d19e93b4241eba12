"""A prepared PREFIX.bin checked against its PREFIX.idx before any rank reads them.

megatron-core's index (indexed_dataset.py, ``IndexedDatasetBuilder.finalize``/``_IndexReader``):
the header ``MMIDIDX\\0\\0``, version 1 (uint64), the token dtype's code (uint8), the sequence
count S and document count D (uint64 each), then S int32 lengths, S int64 byte pointers into the
.bin, D int64 document boundaries (sequence indices, 0 first, S last) and, in multimodal indices
only, S int8 modes. megatron trusts these numbers: a .bin shorter than they say fails on every
rank with "offset must be non-negative" or "buffer is smaller than requested size", naming no file.
Read here with the standard library and numpy only (no torch, no megatron).
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from hybridpar.errors import UsageError
from hybridpar.data.prepare import read_meta

HEADER = b"MMIDIDX\x00\x00"
FIXED = len(HEADER) + 8 + 1 + 8 + 8  # header, version, dtype code, S, D
# megatron's DType codes (indexed_dataset.DType)
DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}


@dataclass(frozen=True)
class IndexSummary:
    tokens: int
    documents: int
    dtype: str
    sequences: int = 0  # what megatron's GPTDataset splits into train and held-out parts (held_out.py)


def check_index(prefix: str) -> IndexSummary:
    """Raise a one-line UsageError naming the file when PREFIX.bin/.idx do not agree."""
    import numpy

    idx, bin_ = prefix + ".idx", prefix + ".bin"
    again = "prepare it again with `hybridpar data prepare`"
    with open(idx, "rb") as f:
        head = f.read(FIXED)
    if len(head) < FIXED or head[: len(HEADER)] != HEADER:
        raise UsageError(f"{idx} is not a megatron index file (no MMIDIDX header); {again}")
    version, code, seqs, docs = struct.unpack("<QBQQ", head[len(HEADER):])
    if version != 1 or code not in DTYPES:
        raise UsageError(f"{idx}: unsupported index (version {version}, dtype code {code}); {again}")
    dtype = numpy.dtype(DTYPES[code])
    size, expected = os.path.getsize(idx), FIXED + 12 * seqs + 8 * docs
    if size not in (expected, expected + seqs):  # + S: the multimodal modes
        raise UsageError(f"{idx} is {size} bytes, but its header describes {seqs} sequences and {docs} document "
                         f"boundaries ({expected} bytes): truncated or corrupt; {again}")
    index = numpy.memmap(idx, mode="r")
    lengths = numpy.frombuffer(index, numpy.int32, seqs, FIXED).astype(numpy.int64)
    pointers = numpy.frombuffer(index, numpy.int64, seqs, FIXED + 4 * seqs)
    bounds = numpy.frombuffer(index, numpy.int64, docs, FIXED + 12 * seqs)
    offsets = numpy.concatenate(([0], numpy.cumsum(lengths)[:-1])) * dtype.itemsize if seqs else pointers
    if (lengths < 0).any() or (pointers != offsets).any() or not (
            docs and bounds[0] == 0 and bounds[-1] == seqs and (numpy.diff(bounds) >= 0).all()):
        raise UsageError(f"{idx} is corrupt: its sequence lengths, pointers or document boundaries disagree; {again}")
    tokens = int(lengths.sum())
    have, want = os.path.getsize(bin_), tokens * dtype.itemsize
    if have != want:
        raise UsageError(f"{bin_} is {have} bytes, but {idx} describes {tokens} {dtype.name} tokens ({want} bytes): "
                         f"the .bin is {'truncated' if have < want else 'longer'} or from another preparation; {again}")
    summary = IndexSummary(tokens, docs - 1, dtype.name, seqs)
    meta = read_meta(prefix)
    if meta is not None:
        if (meta.tokens, meta.documents) != (summary.tokens, summary.documents):
            raise UsageError(f"{prefix}.meta.json says {meta.tokens} tokens in {meta.documents} documents, {idx} "
                             f"{summary.tokens} in {summary.documents}: the files come from different preparations; {again}")
        if dtype.kind in "iu" and meta.vocab_size - 1 > numpy.iinfo(dtype).max:
            raise UsageError(f"{bin_} stores {dtype.name} tokens, too narrow for the vocab of {meta.vocab_size} that "
                             f"{prefix}.meta.json records; {again}")
    return summary


def sequence_lengths(prefix: str):
    """The token count of every sequence of a checked PREFIX.idx, in file order (a numpy array)."""
    import numpy

    with open(prefix + ".idx", "rb") as f:
        head = f.read(FIXED)
    seqs = struct.unpack("<QBQQ", head[len(HEADER):])[2]
    return numpy.frombuffer(numpy.memmap(prefix + ".idx", mode="r"), numpy.int32, seqs, FIXED).astype(numpy.int64)
