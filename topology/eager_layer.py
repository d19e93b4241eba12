"""Elementwise chains of a layer written as eager PyTorch operations, where the stack's layer is not megatron-core's
fused kernels (torchtitan's Llama, software.TORCHTITAN_2024): HBM bytes per token, from kernels.py's per-element
counts."""
from __future__ import annotations

from .kernels import (COMPLEX_ROPE_BYTES, EAGER_RMSNORM_BYTES, REPEAT_KV_BYTES, REPEAT_KV_SOURCE_BWD_BYTES,
                      SEPARATE_SWIGLU_BYTES)
from .models import ModelSpec
from .software import Software


def eager_layer_bytes(m: ModelSpec, sw: Software, tp: int, sp: bool) -> tuple[float, float]:
    """HBM bytes per token of one layer's elementwise chains written as eager PyTorch operations
    (software.Software.norm_fusion and the fields after it), forward and backward, at streaming rate: their
    operands are contiguous, unlike megatron's strided halves [assumed, not timed]."""
    h, kv, f = m.hidden, m.kv_heads * m.head_dim, m.ffn_hidden
    chains = []  # (elements per token, (forward, backward) bytes per element)
    if not sw.norm_fusion:
        chains.append((2 * h / (tp if sp else 1), EAGER_RMSNORM_BYTES))
    if sw.rotary and not sw.rope_fusion and sw.rope_style == "complex":
        chains.append(((h + kv) / tp, COMPLEX_ROPE_BYTES))
    if sw.kv_heads_repeated and m.kv_heads < m.heads:
        chains += [(2 * h / tp, REPEAT_KV_BYTES), (2 * kv / tp, (0, REPEAT_KV_SOURCE_BWD_BYTES))]
    if m.mlp == "swiglu" and not sw.swiglu_fusion and sw.swiglu_separate_projections:
        chains.append((f / tp, SEPARATE_SWIGLU_BYTES))
    return (sum(n * fb[0] for n, fb in chains), sum(n * fb[1] for n, fb in chains))
