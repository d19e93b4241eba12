"""Model FLOPs: what one sequence costs, forward and backward, in the convention MFU is reported in
(Megatron-Core's num_floating_point_operations, ../shared/docs/formulas.md §2), the extra FLOPs of
recomputation, and the attention core's. Arithmetic on the model's shape only: the runtime's metrics
use it too."""
from __future__ import annotations

from .models import ModelSpec


def model_flops_per_seq(m: ModelSpec, seq_len: int) -> float:
    """Megatron-Core's num_floating_point_operations per sequence (formulas.md §2): forward and
    backward, GQA, SwiGLU (3 matrices) or 2-matrix MLP, logits; no recomputation."""
    h, s = m.hidden, seq_len
    attn = 12 * m.layers * h * h * (1 + m.kv_heads / m.heads + s / h)
    mlp = (18 if m.mlp == "swiglu" else 12) * m.layers * m.ffn_hidden * h
    return s * (attn + mlp + 6 * m.vocab * h)


def recompute_flops_per_seq(m: ModelSpec, seq_len: int, recompute: str, flash: bool = True) -> float:
    """Extra FLOPs of recomputation: full repeats each layer's forward; selective repeats the
    attention core (free with FlashAttention, whose backward always recomputes it)."""
    h, s = m.hidden, seq_len
    layer_fwd = s * (4 * m.layers * h * h * (1 + m.kv_heads / m.heads + s / h)
                     + (6 if m.mlp == "swiglu" else 4) * m.layers * m.ffn_hidden * h)
    if recompute == "full":
        return layer_fwd
    if recompute == "every-other-block":
        return layer_fwd / 2
    if recompute == "op-selective":  # the K, output and up projections again
        return s * 2 * m.layers * h * (m.kv_heads * m.head_dim + h + m.ffn_hidden)
    if recompute == "selective" and not flash:
        return s * 4 * m.layers * h * s
    return 0.0


def causal_attention_flops(batch: int, q_tokens: int, k_tokens: int, heads: int, head_dim: int) -> float:
    """Forward FLOPs of the causal attention core (QK^T and PV) that a FlashAttention-class kernel
    computes: half the square, the masked blocks skipped."""
    return 4.0 * batch * q_tokens * k_tokens * heads * head_dim * 0.5
