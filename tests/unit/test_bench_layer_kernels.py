"""benchmarks/layer_kernels.py on CPU: the layer GEMM shapes are the planner's, and the unfused RoPE and SwiGLU
it times (as megatron-core 0.16.1 runs them) move the elements per element that topology/kernels.py charges,
counted by hybridpar's TrafficCounter over every aten operation the autograd graph runs (the GPU timings need a GPU:
benchmarks/results/h200/layer_kernels.json, docs/benchmarks.md "layer_kernels")."""
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hybridpar.benchmarks.layer_kernels import UNFUSED_SHAPES, _rope, layer_gemm_shapes, unfused_calls, unfused_rows
from hybridpar.observe.step_bytes import TrafficCounter
from hybridpar.topology.hardware import get_gpu
from hybridpar.topology.kernels import (ROPE_UNFUSED_HBM, ROPE_UNFUSED_PASSES, SWIGLU_UNFUSED_HBM, SWIGLU_UNFUSED_PASSES)

H200_TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200" / "layer_kernels.json"


def _moved(fn) -> float:
    """Elements read plus written by every operation of ``fn`` that runs a kernel (hybridpar's TrafficCounter,
    the optimizer-step count's: views and allocations move nothing), on float32 tensors."""
    with TrafficCounter() as count:
        fn()
    return count.total / 4


def test_layer_gemm_shapes_are_the_planners():
    qkv, proj, fc1, fc2 = layer_gemm_shapes("llama3-70b", 8, 8192)
    assert (qkv["k"], qkv["n"]) == (8192, (8192 + 2 * 8 * 128) // 8)
    assert (proj["k"], proj["n"]) == (1024, 8192)
    assert (fc1["k"], fc1["n"]) == (8192, 2 * 28672 // 8) and (fc2["k"], fc2["n"]) == (28672 // 8, 8192)


def test_unfused_rope_moves_the_counted_elements():
    """Forward 12 and backward 14 elements per element of Q (heads 32 of 128: the cos/sin tables add 1/32 per
    multiply)."""
    seq, heads, d = 64, 32, 128
    t = torch.randn(seq, 1, heads, d, requires_grad=True)
    freqs = torch.randn(seq, 1, 1, d)
    cos, sin = torch.cos(freqs), torch.sin(freqs)
    out = []
    forward = _moved(lambda: out.append(_rope(t, cos, sin))) / t.numel()
    grad = torch.ones_like(out[0])
    backward = _moved(lambda: out[0].backward(grad)) / t.numel()
    assert forward == pytest.approx(ROPE_UNFUSED_PASSES[0], abs=2 / heads + 1e-9)
    assert backward == pytest.approx(ROPE_UNFUSED_PASSES[1], abs=2 / heads + 1e-9)


def test_unfused_swiglu_moves_the_counted_elements():
    tokens, ffn = 32, 96
    fc1 = torch.randn(tokens, 2 * ffn, requires_grad=True)
    out = []

    def forward():
        x_glu, x_linear = torch.chunk(fc1, 2, dim=-1)
        out.append(F.silu(x_glu) * (x_linear + 0.0))

    assert _moved(forward) == SWIGLU_UNFUSED_PASSES[0] * tokens * ffn
    grad = torch.ones_like(out[0])
    assert _moved(lambda: out[0].backward(grad)) == SWIGLU_UNFUSED_PASSES[1] * tokens * ffn


def test_the_unfused_rates_are_the_h200_medians():
    """Each measured row: the elements its own operations move (counted here on CPU at the same head layout,
    scaled to its 4,096 tokens), 2 bytes each, over the kernels' time on the H200, as a share of the card's
    HBM bandwidth; the planner's rates are the medians of the three shapes, within 0.01."""
    data = json.loads(H200_TABLE.read_text())
    hbm = get_gpu(data["catalogue_gpu"]).hbm_tbps * 1e12
    rates = {"rope": [], "swiglu": []}
    for name, heads, kv, d, ffn in UNFUSED_SHAPES:
        for op in ("rope", "swiglu"):
            fn_elements = _count_benchmark_op(op, heads, kv, d, ffn)
            measured = next(r for r in data["unfused"] if r["shape"] == name and r["op"] == op)
            rates[op].append(2 * fn_elements * 4096 / 4 / measured["device_s"] / hbm)
    assert sorted(rates["rope"])[1] == pytest.approx(ROPE_UNFUSED_HBM, abs=0.01)
    assert sorted(rates["swiglu"])[1] == pytest.approx(SWIGLU_UNFUSED_HBM, abs=0.01)


def test_the_benchmark_times_both_unfused_chains_on_cpu():
    rows = unfused_rows("cpu", torch.float32, 0.001, seq=4, batch=1, shapes=(("tiny", 4, 2, 8, 24),))
    assert [r["op"] for r in rows] == ["rope", "swiglu"]
    assert all(r["measured_s"] > 0 and r["bytes_counted"] > 0 for r in rows)


def _count_benchmark_op(op: str, heads: int, kv: int, d: int, ffn: int, seq: int = 4) -> int:
    """Elements the benchmark's own RoPE or SwiGLU call moves at ``seq`` tokens (its ops as unfused_rows runs them)."""
    return _moved(unfused_calls("cpu", torch.float32, seq, 1, heads, kv, d, ffn)[op])
