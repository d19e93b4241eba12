"""Initial weights that any TP shard can draw alone, on its own device.

Every element of a parameter's full (one-process) tensor gets a value that is a pure function of
(seed, canonical name, the element's flat index in the full tensor): a counter-based generator.
A rank computes the flat indices of its own shard and hashes only those, on its device, so it
pays for its shard and nothing else, and every layout (any TP split, any pipeline cut, one
process) holds exactly the same numbers. megatron-core's and torch's own generators are
sequential (Philox offsets, mt19937 state): a TP slice of their full draw costs the full draw.

The hash is murmur3's 32-bit finaliser (fmix32) of (low index word xor key), chained once more
with the high word for indices of 2**32 and above, once per uniform; two uniforms give one normal by Box-Muller. All arithmetic is
exact in int64 (32-bit products are split into 16-bit halves), so it needs no unsigned types and
no overflow, and gives the same integers on every device. The floating-point step (log, cos in
fp32) can differ in the last bit between CPU and GPU kernels; on one device it is deterministic.
"""
from __future__ import annotations

import hashlib
import math

import torch

MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for 32-bit x held in int64, without overflowing int64."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def _key(seed: int, name: str, stream: int) -> int:
    digest = hashlib.sha256(f"{seed}:{name}:{stream}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _uniform(flat: torch.Tensor, key: int) -> torch.Tensor:
    """fp32 uniforms in (0, 1) from 24 hashed bits per element. An index below 2**32 is hashed
    once; a larger one is hashed again with its high word (a pure function of each index, so
    a block of small indices skips the second round)."""
    h = _fmix32((flat & MASK32) ^ key)
    if flat.numel() and int(flat.max()) > MASK32:
        high = flat >> 32
        h = torch.where(high > 0, _fmix32(h ^ high ^ _key2(key)), h)
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def _key2(key: int) -> int:
    return (key * 0x9E3779B1 + 0x7F4A7C15) & MASK32


def normal_at(flat: torch.Tensor, seed: int, name: str) -> torch.Tensor:
    """Standard normals for the int64 flat indices ``flat`` of tensor ``name`` (same shape)."""
    u1, u2 = _uniform(flat, _key(seed, name, 0)), _uniform(flat, _key(seed, name, 1))
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * math.pi) * u2)


# Elements hashed per block: the ~50 int64 passes of a block stay in cache on the CPU (26 ns per
# element at 2**15-2**16, 140 ns at 2**22, one core); on a GPU, blocks large enough to fill it,
# whose temporaries (a few hundred MB) stay small beside its memory.
CHUNK_ELEMENTS = {"cpu": 1 << 15, "cuda": 1 << 24}


@torch.no_grad()
def fill_normal_(out: torch.Tensor, full_shape: list[int], dim_indices: dict[int, torch.Tensor], seed: int,
                 name: str, std: float) -> torch.Tensor:
    """Fill ``out`` (a shard of a full tensor, see ``shard_flat_indices``) with N(0, std) values
    of its elements, a block of leading-dim rows at a time."""
    rows = dim_indices.get(0)
    if rows is None:
        rows = torch.arange(full_shape[0], dtype=torch.int64, device=out.device)
    per_row = max(1, out[0].numel()) if out.dim() else 1
    step = max(1, CHUNK_ELEMENTS.get(out.device.type, 1 << 20) // per_row)
    for first in range(0, rows.numel(), step):
        block = {**dim_indices, 0: rows[first : first + step]}
        flat = shard_flat_indices(full_shape, block, out.device)
        out[first : first + step].copy_(normal_at(flat, seed, name).mul_(std))
    return out


def shard_flat_indices(full_shape: list[int], dim_indices: dict[int, torch.Tensor], device) -> torch.Tensor:
    """Flat indices into a full tensor of ``full_shape`` of the elements a shard holds: along each
    dim in ``dim_indices`` the shard holds those positions (in order), along the others all."""
    flat = torch.zeros((), dtype=torch.int64, device=device)
    stride = 1
    for d in reversed(range(len(full_shape))):
        idx = dim_indices.get(d)
        if idx is None:
            idx = torch.arange(full_shape[d], dtype=torch.int64, device=device)
        view = [1] * len(full_shape)
        view[d] = idx.numel()
        flat = flat + idx.to(device).view(view) * stride
        stride *= full_shape[d]
    return flat
