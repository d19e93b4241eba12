"""FP8 training as Transformer Engine runs it under megatron-core (software.Software.fp8 == TRANSFORMER_ENGINE):
the delayed-scaling recipe's casts and transposes around each GEMM of a layer, in HBM bytes per token, and the
share of the tensor-parallel all-gathers that move fp8.

Counted from Transformer Engine 1.13 (transformer_engine/pytorch/module/linear.py, layernorm_linear.py and base.py
grad_output_preprocess) [V]:
* LayerNormLinear (QKV, fc1): the norm kernel writes its output in fp8 (1 byte, not 2); with sequence parallelism
  that fp8 output is what is all-gathered, in forward and again in backward; the weight gradient needs it
  transposed: fp8_transpose, read 1 + write 1 byte per element of the gathered input.
* Linear (proj, fc2; row-parallel, its input not gathered): without sequence parallelism fp8_cast_transpose_fused
  (read 2, write the fp8 copy and its transpose); with it cast_to_fp8 (read 2 + write 1) in forward and
  fp8_transpose (1 + 1) in backward.
* Output gradients: column-parallel (QKV, fc1) fp8_cast_transpose_fused; row-parallel (proj, fc2) with sequence
  parallelism cast_to_fp8 of the rank's slice, an fp8 all-gather, and the gathered gradient transposed; without
  it fp8_cast_transpose_fused.
* Reduce-scatters and all-reduces carry the 16-bit GEMM outputs. Weights are cast once per step (fp8 parameters,
  or the first micro-batch's cast, cached): not charged per micro-batch.
Transformer Engine 2.0 (linear.py's quantizers, rowwise and columnwise data) makes the same fp8 copies, but with
sequence parallelism quantizes a row-parallel input with its transpose in forward: 1 byte per element less than
counted here [V].
Current scaling (Transformer Engine's Float8CurrentScaling recipe, fp8.CURRENT; Megatron-Bridge's "fp8_cs") scales
each tensor by its own amax, which must be known before the cast: "quantization ... requires reading the tensor
twice: first read: compute amax ... second read: apply the scaling factor and cast" (TE docs, features/
low_precision_training/fp8_current_scaling) [V]. Counted from TE 2.7 (pytorch/csrc/quantizer.cpp
Float8CurrentScalingQuantizer::quantize_impl: nvte_compute_amax, then the amax all-reduce where set, then the cast;
csrc/extensions/normalization.cpp: the norm cannot write fp8 under current scaling, "force_unfused_kernel", so it
writes its 16-bit output, computing the amax on the way, and quantize_with_amax casts it) [V]:
* the two norm outputs: 16 bits written and read back by the cast, not 1 byte written: 4 bytes per element more
  than delayed scaling, and one cast kernel each;
* the row-parallel inputs and the four output gradients: one more read of the 16-bit tensor, 2 bytes per element,
  and one amax kernel each;
* with sequence parallelism the tensors that are all-gathered in fp8 (the norm outputs in forward, the
  row-parallel output gradients in backward: module/layernorm_linear.py and linear.py
  _customize_quantizers_float8_current_scaling) agree on one scale first: a 4-byte amax all-reduce over the TP
  group before each cast, on the compute stream.
The output layer (megatron-core's own ColumnParallelLinear) and the embedding run outside fp8_autocast, in 16
bits. Not modelled: the amax reduction after each micro-batch's forward and backward (one all-reduce of a few
kilobytes over the stage's DP x TP x CP ranks, latency-bound)."""
from __future__ import annotations

from .models import ModelSpec

TRANSFORMER_ENGINE = "transformer-engine"
# Transformer Engine's per-tensor scaling recipes: DelayedScaling (the scale from an amax history) and
# Float8CurrentScaling (the scale from the tensor's own amax, read first).
DELAYED = "delayed"
CURRENT = "current"
FP8_SCALINGS = (DELAYED, CURRENT)
AMAX_READ_BYTES = 2  # current scaling's first pass: the 16-bit tensor read for its amax
# A norm's output under current scaling: 16 bits written (2), read by the cast (2) and its fp8 copy written (1),
# where delayed scaling's fused norm writes the fp8 byte alone: 4 bytes per element more.
NORM_OUTPUT_UNFUSED_BYTES = 2 + 2 + 1 - 1
CURRENT_SCALING_KERNELS = (4, 4)  # forward: 2 norm-output casts, 2 amaxes; backward: 4 gradient amaxes
AMAX_BYTES = 4  # one fp32 amax
CAST_TRANSPOSE_BYTES = 4  # read 2, write the fp8 copy and its fp8 transpose
CAST_BYTES = 3  # read 2, write 1
TRANSPOSE_BYTES = 2  # read 1, write 1
NORM_OUTPUT_SAVED_BYTES = 1  # the norm writes 1 byte per element, not 2
# An fp8 all-gather moves half the bytes of the 16-bit one it replaces.
GATHER_SHARE = 0.5


# Without fp8 parameters Transformer Engine keeps, beside each 16-bit weight of the layers, its fp8 copy and that
# copy's transpose, cast on a step's first micro-batch and cached for the others (TE 1.13 module/base.py
# get_fp8_workspace; megatron-core's TE wrappers pass is_first_microbatch) [V]: 2 bytes per parameter. With fp8
# parameters (Software.fp8_params) the weight is that fp8 copy and its cached transpose: 2 bytes, as in 16 bits.
# Without transposes (Blackwell) the copy alone: 1 byte either way.
def fp8_weight_bytes(transposes: bool) -> int:
    """Bytes per layer parameter of a weight's fp8 form: the copy and, where GEMMs need it, its transpose."""
    return 2 if transposes else 1


def layer_cast_bytes(m: ModelSpec, tp: int, sp: bool, transposes: bool = True) -> tuple[float, float]:
    """HBM bytes per token of one layer's fp8 casts and transposes (forward, backward), beyond what the same
    layer moves in 16 bits. Without ``transposes`` (hardware.GPU.fp8_transposes, Blackwell) each cast-transpose
    is a cast and no transpose is made."""
    h, kv, f = m.hidden, m.kv_heads * m.head_dim, m.ffn_hidden
    up = f * (2 if m.mlp == "swiglu" else 1)
    row_inputs = (h + f) / tp  # proj's and fc2's inputs
    norm_share = 1 / tp if sp else 1.0  # the part of the sequence each rank's norms see
    transpose = TRANSPOSE_BYTES if transposes else 0
    cast_transpose = CAST_TRANSPOSE_BYTES if transposes else CAST_BYTES
    forward = -NORM_OUTPUT_SAVED_BYTES * 2 * h * norm_share + (CAST_BYTES if sp else cast_transpose) * row_inputs
    backward = transpose * 2 * h + cast_transpose * (h + 2 * kv + up) / tp
    if sp:
        backward += transpose * row_inputs + 2 * (CAST_BYTES * h / tp + transpose * h)
    else:
        backward += 2 * cast_transpose * h
    return forward, backward


def layer_cast_kernels(sp: bool, transposes: bool = True) -> tuple[int, int]:
    """Kernels the casts add to a layer (forward, backward): the two row-parallel input casts; in backward the
    two norm-output transposes, the two column-parallel gradient cast-transposes and, with sequence parallelism,
    a cast and two transposes per row-parallel linear (else one cast-transpose each). Without transposes: the
    casts alone, two forward and four backward."""
    if not transposes:
        return 2, 4
    return 2, 4 + (6 if sp else 2)


def current_scaling_bytes(m: ModelSpec, tp: int, sp: bool) -> tuple[float, float]:
    """HBM bytes per token current scaling adds to one layer's casts beyond delayed scaling's (forward,
    backward): the norm outputs written in 16 bits and cast apart, and an amax read of every other tensor cast
    (the row-parallel inputs; the output gradients, each rank's slice of the row-parallel ones with sequence
    parallelism). The fp8 copies saved for backward are the same."""
    h, kv, f = m.hidden, m.kv_heads * m.head_dim, m.ffn_hidden
    up = f * (2 if m.mlp == "swiglu" else 1)
    norm_share = 1 / tp if sp else 1.0
    forward = NORM_OUTPUT_UNFUSED_BYTES * 2 * h * norm_share + AMAX_READ_BYTES * (h + f) / tp
    backward = AMAX_READ_BYTES * ((h + 2 * kv + up) / tp + 2 * h * (1 / tp if sp else 1.0))
    return forward, backward


def amax_reductions(sp: bool, tp: int) -> tuple[int, int]:
    """The amax all-reduces over the TP group current scaling adds to a layer (forward, backward): one before each
    cast of a tensor that is all-gathered in fp8 (sequence parallelism)."""
    return (2, 2) if sp and tp > 1 else (0, 0)


def saved_bytes_change(m: ModelSpec, tp: int, sp: bool, transposes: bool = True) -> float:
    """Bytes per token one layer keeps for its backward under fp8 beyond its 16-bit count (memory.layer_activation_
    bytes): the QKV and fc1 inputs, the norms' outputs, kept at 1 byte; proj's input cast to fp8 beside the 16-bit
    attention output FlashAttention keeps for itself (with sequence parallelism the fp8 copy alone, without it
    the copy and its transpose); fc2's input, the SwiGLU or GeLU output, kept as its fp8 copy (1 byte with sequence
    parallelism; without it the copy and its transpose, 2 bytes as before). Without ``transposes`` (Blackwell)
    each is the copy alone."""
    h, f = m.hidden, m.ffn_hidden
    norm_share = 1 / tp if sp else 1.0
    with_transpose = not sp and transposes
    return -2 * h * norm_share + (2 if with_transpose else 1) * h / tp - (0.0 if with_transpose else f / tp)
