"""Initial weights drawn per TP shard (hybridpar/canonical_init.py, model.init_weights).

Any shard, drawn alone on its rank, equals its slice of the full tensor drawn alone, for every TP
degree and split dimension and for SwiGLU's stacked [gate; up] fc1; a shard pays only for its own
elements; the values are N(0, std); the integer hash is exact (checked against Python integers).
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from hybridpar.runtime import canonical_init
from hybridpar.runtime.canonical_init import MASK32, _fmix32, _mul32, fill_normal_, normal_at
from hybridpar.runtime.model import shard_of_full, shard_positions


def _param(dim: int, gated: bool = False):
    return SimpleNamespace(tensor_model_parallel=True, partition_dim=dim, _hybridpar_gated=gated)


def _full(shape, name="decoder.layers.0.mlp.linear_fc1.weight", seed=0, std=0.02):
    return fill_normal_(torch.empty(shape), list(shape), {}, seed, name, std)


def _shard(shape, p, tp_rank, tp, name="decoder.layers.0.mlp.linear_fc1.weight", seed=0, std=0.02):
    out_shape = list(shape)
    out_shape[p.partition_dim] //= tp
    along = {p.partition_dim: shard_positions(p, shape[p.partition_dim], tp_rank, tp)}
    return fill_normal_(torch.empty(out_shape), list(shape), along, seed, name, std)


# (split dim, gated): column-parallel rows, row-parallel columns, SwiGLU's fc1 (split by rows only)
@pytest.mark.parametrize("dim,gated", [(0, False), (1, False), (0, True)], ids=["rows", "columns", "gated_fc1"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_a_shard_drawn_alone_is_its_slice_of_the_full_tensor(dim, gated, tp):
    shape, p = (24, 16), _param(dim, gated)
    full = _full(shape)
    shards = [_shard(shape, p, r, tp) for r in range(tp)]
    for r, shard in enumerate(shards):
        assert torch.equal(shard, shard_of_full("w", p, full, r, tp)), (r, tp)
    if gated:  # each rank holds its slice of the gate half, then its slice of the up half
        gate, up = full.chunk(2)
        assert torch.equal(torch.cat([s.chunk(2)[0] for s in shards]), gate)
        assert torch.equal(torch.cat([s.chunk(2)[1] for s in shards]), up)
    else:
        assert torch.equal(torch.cat(shards, dim=dim), full)


def test_chunked_filling_gives_the_same_numbers(monkeypatch):
    whole = _full((64, 48))
    monkeypatch.setitem(canonical_init.CHUNK_ELEMENTS, "cpu", 100)  # 3 rows per block, 22 blocks
    assert torch.equal(_full((64, 48)), whole)
    assert torch.equal(_shard((64, 48), _param(1), 1, 4), whole[:, 12:24])


def test_a_shard_pays_only_for_its_own_elements(monkeypatch):
    hashed = []
    real = canonical_init.normal_at
    monkeypatch.setattr(canonical_init, "normal_at", lambda flat, *a: hashed.append(flat.numel()) or real(flat, *a))
    _shard((4096, 64), _param(1), 3, 8)
    assert sum(hashed) == 4096 * 64 // 8


def test_values_are_normal_with_the_asked_std():
    x = _full((1024, 1024), std=0.02)
    assert abs(float(x.mean())) < 0.02 * 5 / 1024  # 5 standard errors of the mean
    assert abs(float(x.std()) / 0.02 - 1) < 0.005
    within_one = float((x.abs() < 0.02).float().mean())
    assert abs(within_one - 0.6827) < 0.003  # the normal's mass within one sigma
    assert abs(float(((x / 0.02) ** 4).mean()) - 3.0) < 0.05  # kurtosis of a normal


def test_name_and_seed_select_the_stream():
    a = _full((32, 32), name="a")
    assert torch.equal(a, _full((32, 32), name="a"))
    assert not torch.equal(a, _full((32, 32), name="b"))
    assert not torch.equal(a, _full((32, 32), name="a", seed=1))
    assert abs(float(torch.corrcoef(torch.stack([a.flatten(), _full((32, 32), name="b").flatten()]))[0, 1])) < 0.1


def test_integer_hash_is_exact_32_bit_arithmetic():
    rng = random.Random(0)
    values = [0, 1, MASK32, MASK32 - 1, 1 << 31] + [rng.getrandbits(32) for _ in range(2000)]
    x = torch.tensor(values, dtype=torch.int64)
    for c in (0x85EBCA6B, 0xC2B2AE35, 0xFFFFFFFF, 1):
        assert _mul32(x, c).tolist() == [(v * c) & MASK32 for v in values]

    def fmix(h):
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & MASK32
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & MASK32
        return h ^ (h >> 16)

    assert _fmix32(x).tolist() == [fmix(v) for v in values]


def test_indices_past_two_to_the_32_are_a_pure_function_of_the_index():
    small = torch.tensor([5, 7], dtype=torch.int64)
    mixed = torch.tensor([5, 7, 5 + (1 << 32), 7 + (1 << 33)], dtype=torch.int64)
    a, b = normal_at(small, 0, "w"), normal_at(mixed, 0, "w")
    assert torch.equal(a, b[:2])  # an element's value does not depend on its neighbours
    assert len(set(b.tolist())) == 4  # the high word changes the value
