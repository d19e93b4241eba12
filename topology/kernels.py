"""What one GPU's kernels cost, shape by shape, on the GPU's measured rates (topology/hardware.py).

* GEMMs: roofline per GEMM. Compute runs at the GPU's maximum achievable matmul rate
  (hardware.GPU.gemm_fraction, fp8_gemm_fraction for fp8 operands, x dense peak) at the clock a busy node sustains
  (hardware.GPU.sustained_clock, as attention does), reduced by wave quantisation: the output is cut
  into 128 x 256 tiles (the large CUTLASS/cuBLAS tile on Ampere and Hopper) and a wave of tiles
  occupies every SM, so a partial last wave idles the rest; memory time is the GEMM's operands
  and result over HBM. The slower of the two decides. Backward = data-gradient GEMM plus
  weight-gradient GEMM with the transposed shapes. TP and small micro-batches shrink M, N, K.
* Attention core: FlashAttention at hardware.GPU.attention_fraction of peak, scaled by sequence length
  and head dimension (attention_shape_factor; a measured curve where the GPU has one); backward
  FLASH_BACKWARD_RATIO x the forward's FLOPs; other kernels at their measured slowdown
  (attention_kernel_slowdown).
* Memory-bound work (norms, residual adds, activation functions, the loss): bytes over
  HBM_EFFICIENCY x peak HBM bandwidth; unfused RoPE and SwiGLU op by op at their kernels' measured
  rate (unfused_time).
* Every kernel: a boundary cost, and the host's issue where the kernels are shorter than it
  (kernel_bound).
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from math import ceil, log2

from .attention_tables import ATTENTION_TABLES, FLASH_BACKWARD_RATIO, REFERENCE_SEQ, attention_curve, head64_curve
from .flops import causal_attention_flops
from .hardware import GPU, get_gpu
from .interpolation import between

# Fraction of peak HBM bandwidth that streaming (elementwise) kernels reach [S, assumed].
HBM_EFFICIENCY = 0.85
TILE = (128, 256)
# Smaller tiles cuBLAS falls back to when the large one leaves SMs idle (fewer tiles than SMs).
TILES = (TILE, (128, 128), (64, 128))
# Short-K cost (k_efficiency): OpenXLA's measured sm_90 bf16 GEMM table
# (xla/service/gpu/model/matmul_interpolator_data.h, "sm_90") runs 4096 x 4096 at K = 256, 512, 2048
# and 4096 at 392, 543, 739 and 783 TFLOP/s: K / (K + 256) to within 7%, the 4096-cubed shapes at
# MAMF (783-808 vs 792 TFLOP/s). Measured on Hopper, assumed for the other GPUs.
SHORT_K = 256
MAMF_K = 4096
# Split-K: a GEMM with fewer output tiles than SMs can cut its inner dimension into parts computed by
# separate blocks and summed afterwards (cuBLAS's and CUTLASS's split-K / stream-K kernels), each part
# at least SPLIT_K_MIN long: the short-K cost of each part and the fp32 partial sums through HBM are
# what it pays. Checked on OpenXLA's whole sm_90 bf16 grid (375 shapes, m, n, k from 256 to 4096; the
# mirror in tests/data): its 112 shapes with fewer large tiles than SMs and K >= 2048 are predicted at a
# median 1.02 of the measured rate, 95 within 15% (without split-K 0.94, and a tenth under 0.6); of
# 512, 1024 and 2048, 1024 fits that grid best [S, measured kernel table].
SPLIT_K_MIN = 1024
# The sequence shape of a GPU without a measured table (attention_tables; A100 and B200 have theirs): each query
# block's fixed cost amortised as seq / (seq + 256), checked on Hopper against a stored measurement:
# pytorch/benchmark commit ff65cb67 ("Fix dimension order for FlashAttention-3"), FlashAttention-3 on H100, head
# dimension 128, batch x sequence 16K: 430, 517, 566, 590, 614 and 621 TFLOP/s from sequence 512 to 16K, each
# within 2.5% of seq / (seq + 256) relative to 16K (tests/unit/test_planner_attention.py) [S]. FlashAttention-2 on
# A100 falls off faster at short sequences (its measured table: 0.82 of its 16K rate at 2K, 0.52 at 512). Head
# dimension 64: FlashAttention-2's causal rate on H100 80GB SXM5 is 0.87 of its rate at 128 (0.865-0.886 from
# 512 to 16K: Dao-AILab/flash-attention assets/flash2_h100_fwd_bwd_benchmark.png at 4f285b35, panels c and d)
# [S]; A100's table measures its own (about 0.9).
ATTN_SHORT_SEQ = 256
ATTN_HEAD64 = 0.87

# Other attention kernels' forward and backward time over FlashAttention-2's for the same work:
# FlashAttention-2 "is around 1.3-1.5x faster than FlashAttention in Triton in the forward pass and
# around 2x faster in the backward pass" (Dao 2023, "FlashAttention-2", §4.1, measured on A100;
# the middle of the forward's range taken, and assumed to hold on H100). That measurement's figure (the
# FlashAttention-2 release's A100 benchmark, attention_tables "a100-fa2") also times the CUDA FlashAttention 1.x,
# which MosaicML's Triton port is "slightly slower" than by its own docstring: 69 TFLOP/s at 2K and 80 at 8K (head
# dimension 128, causal), 2.25-2.28x FlashAttention-2's time. Costed at that rate instead, MosaicML's rows lean
# +5.5% rather than +9.5%, but the long-sequence layouts of the same MosaicML table (16K-64K, activation
# checkpointing, MPT-760M to 13B on 8 A100 80GB) come out 12-20% slow, where these ratios put them within -2 to +3%:
# not taken for Triton.
ATTENTION_KERNEL_SLOWDOWN = {"flash2": (1.0, 1.0), "triton": (1.4, 2.0)}
# Kernels timed beside FlashAttention-2 in one measured table: (FlashAttention-2's table, the kernel's). Their
# time over FlashAttention-2's is the ratio of the two rates at the sequence length and head dimension, forward
# and backward alike (the table times them together), assumed on GPUs the table was not measured on. "flash1":
# FlashAttention 1.x, the CUDA kernel of late 2022, measured on A100.
MEASURED_KERNELS = {"flash1": ("a100-fa2", "a100-fa1")}
ATTENTION_KERNELS = (*ATTENTION_KERNEL_SLOWDOWN, *MEASURED_KERNELS)
# Unfused RoPE and SwiGLU as megatron-core 0.16.1 runs them without fusion: elements read plus written per
# element of their input (RoPE: of Q and K; SwiGLU: of the activated width F), forward and backward, counted
# by hybridpar's TrafficCounter (hybridpar/observe/step_bytes.py; tests/unit/test_bench_layer_kernels.py). RoPE
# (rope_utils.py _apply_rotary_pos_emb_bshd): t * cos, -x2, cat(-x2, x1), * sin, the add, the final cat with
# the empty pass-through part; backward adds the two paths and joins the halves. SwiGLU (mlp.py glu): silu,
# x_linear + glu_linear_offset, the product; backward the product's two gradients, silu's, the halves
# joined into fc1's gradient. Fused, each is one read and one write forward and twice that backward.
ROPE_UNFUSED_PASSES = (12, 14)
SWIGLU_UNFUSED_PASSES = (7, 13)
# Their kernels run on strided halves and broadcast cos/sin tables, below streaming rate: measured on one
# H200 as the bytes the benchmark's own operations move over the kernels' time (`hybridpar bench
# layer_kernels`, benchmarks/results/h200/layer_kernels.json "unfused", three layer shapes each; bytes
# counted as for the passes, the reshape's _unsafe_view moving nothing): RoPE 0.34, 0.39 and 0.40 of peak
# HBM bandwidth, SwiGLU 0.55, 0.56 and 0.58 (a contiguous add: 0.92). The medians, assumed for the other
# GPUs [S, measured kernel table].
ROPE_UNFUSED_HBM = 0.39
SWIGLU_UNFUSED_HBM = 0.56
# torchtitan's eager Llama layer (pytorch/torchtitan 1ea476e9f, torchtitan/models/llama/model.py and norms.py;
# software.TORCHTITAN_2024): HBM bytes per element, forward and backward, of each chain it writes as PyTorch
# operations, counted by hybridpar's TrafficCounter over every aten operation the autograd graph runs
# (tests/unit/test_planner_torchtitan_ops.py). Per element of: the normalised activation (RMSNorm: x.float(),
# pow, mean, add, rsqrt, mul, type_as, the weight's product); Q and K (RoPE: an fp32 copy viewed as complex,
# the complex product with the frequency table, the cast back); each repeated K and V element (repeat_kv:
# expand, then reshape's copy; backward the sum over the repeats); F (SwiGLU: silu of one projection, its product
# with the other). repeat_kv's backward also writes the summed gradient of each source element
# (REPEAT_KV_SOURCE_BWD_BYTES). The counter charges a read of
# an expanded operand at its expanded size (repeat_kv's forward, RMSNorm's backward division): kept as counted.
EAGER_RMSNORM_BYTES = (36, 96)
COMPLEX_ROPE_BYTES = (20, 20)
REPEAT_KV_BYTES = (4, 2)
REPEAT_KV_SOURCE_BWD_BYTES = 2
SEPARATE_SWIGLU_BYTES = (10, 18)
# An in-place add of a 16-bit gradient into an fp32 buffer (software.GRAD_ADD_MIXED: autograd's accumulation
# into hybridpar's fp32 .grad, Megatron-LM 2021's main_grad.add_(grad)): mixed dtypes send PyTorch's
# elementwise add to its unrolled kernel that casts each load (unrolled_elementwise_kernel with
# CUDAFunctor_add<float>), not the vectorized one. Measured on one H200 in the kernel profile of `hybridpar
# bench gpu --profile 2` (benchmarks/results/h200/gpu.json, top_kernels): 984 calls a step, 8 per
# parameter tensor of the 1.075B model, 28.4 ms. The runtime adds on 7 of the 8 micro-batches (the first
# gradient is cast; counted on CPU), so the eighth is another add the same kernel runs: as 8 adds of 10
# bytes per parameter, 3.0 TB/s, 0.63 of peak HBM bandwidth; as 7 and the step's fp32 partition sum (12
# bytes), 0.65. The lower is kept. One card; assumed for the other GPUs [M].
MIXED_ADD_HBM = 0.63
# Per kernel: the boundary between two kernels on a stream (the last blocks drain, the next
# kernel's first blocks start), measured as the time of a minimal kernel inside a replayed CUDA
# graph, 1.28 us, and the host's cost of issuing one operation from Python in eager PyTorch, 4.2 us
# (a third-party measurement on a 132-SM Hopper card kept in this project's search corpus) [S].
# The host runs ahead of the GPU, so it binds only where a layer's kernels are shorter than their
# issue.
KERNEL_GAP_S = 1.28e-6
HOST_OP_S = 4.2e-6


def _tile_rate(tm: int, tn: int) -> float:
    """A tile's rate relative to the large TILE: per FLOP it loads (1/tm + 1/tn) operand elements
    into shared memory, and the large tile is the one that keeps the tensor cores fed."""
    return (1 / TILE[0] + 1 / TILE[1]) / (1 / tm + 1 / tn)


def k_efficiency(k: int) -> float:
    """Share of the maximum achievable rate a GEMM with inner dimension k reaches: each output
    tile fills its operand pipeline before the main loop and writes its accumulators after it, a
    fixed cost worth SHORT_K elements of k. MAMF is reached from MAMF_K on."""
    return min(1.0, (k / (k + SHORT_K)) / (MAMF_K / (MAMF_K + SHORT_K)))


def gemm_time(m: int, k: int, n: int, gpu: GPU, peak: float, batch: int = 1, in_bytes: int = 2) -> float:
    """Seconds for batch x (m x k) @ (k x n): roofline with wave quantisation over the SMs for the
    best of the tile shapes cuBLAS chooses among, and the short-K cost. Where a shape has fewer tiles
    than SMs, split-K is among the choices (SPLIT_K_MIN)."""
    memory = batch * (in_bytes * (m * k + k * n) + 2 * m * n) / (gpu.hbm_tbps * 1e12 * HBM_EFFICIENCY)
    rate = peak * gpu.gemm_fraction_for(in_bytes) * gpu.sustained_clock
    best = float("inf")
    for tm, tn in TILES:
        for a, b in ((tm, tn), (tn, tm)):
            tiles = batch * ceil(m / a) * ceil(n / b)
            most = max(1, min(gpu.sms // tiles, k // SPLIT_K_MIN))
            for split in {1, most} | {2 ** i for i in range(1, most.bit_length())}:
                ctas = tiles * split
                used = _tile_rate(a, b) * batch * m * n * split / (ceil(ctas / gpu.sms) * gpu.sms * a * b)
                compute = 2.0 * batch * m * k * n / (rate * used * k_efficiency(ceil(k / split)))
                # the split's fp32 partial outputs written and read back by the reduction
                reduction = hbm_time(2 * 4 * split * batch * m * n, gpu) if split > 1 else 0.0
                best = min(best, max(compute, memory) + reduction)
    return best


def gemm_fwd_bwd(m: int, k: int, n: int, gpu: GPU, peak: float, batch: int = 1, in_bytes: int = 2):
    fwd = gemm_time(m, k, n, gpu, peak, batch, in_bytes)
    bwd = gemm_time(m, n, k, gpu, peak, batch, in_bytes) + gemm_time(k, m, n, gpu, peak, batch, in_bytes)
    return fwd, bwd


def kernel_bound(gpu_s: float, kernels: int, launch_blocking: bool = False) -> float:
    """A layer's pass of ``kernels`` kernels taking ``gpu_s`` of work: each kernel boundary adds
    KERNEL_GAP_S, and the GPU cannot finish before the host has issued them all. With
    CUDA_LAUNCH_BLOCKING=1 the host waits for each kernel before issuing the next, so nothing of
    the issue is hidden."""
    if launch_blocking:
        return gpu_s + kernels * (KERNEL_GAP_S + HOST_OP_S)
    return max(gpu_s + kernels * KERNEL_GAP_S, kernels * HOST_OP_S)


def hbm_time(nbytes: float, gpu: GPU, efficiency: float = HBM_EFFICIENCY) -> float:
    return nbytes / (gpu.hbm_tbps * 1e12 * efficiency)


def unfused_time(elements: float, passes: tuple[int, int], efficiency: float, gpu: GPU) -> tuple[float, float]:
    """(forward, backward) seconds of an unfused elementwise chain over ``elements`` bf16 elements that moves
    ``passes`` elements per element each way, at ``efficiency`` of peak HBM bandwidth."""
    return tuple(hbm_time(2 * p * elements, gpu, efficiency) for p in passes)


def attention_shape_factor(seq: int, head_dim: int, curve: str | None = None) -> float:
    """FlashAttention's rate at this sequence length and head dimension relative to the GPU's
    attention_fraction (which is for head dimension 128 at 8K, causal): each query block pays a
    fixed cost (loading Q, the final rescale, writing O) amortised over its key loop, as
    seq / (seq + ATTN_SHORT_SEQ); head dimension 64 runs at ATTN_HEAD64 of 128's rate. Where the GPU has a
    measured ``curve`` (attention_tables), its rate at ``seq`` (log-linear between points, held beyond
    the ends) over its rate at 8K instead of the amortisation, and where that table measured head
    dimension 64 too, its own rate there instead of ATTN_HEAD64."""
    if curve is not None and head64_curve(curve) is not None:  # measured at both head dimensions
        return _measured_rate(curve, seq, head_dim) / _on_curve(attention_curve(curve), REFERENCE_SEQ)
    if curve is None:
        amortised = min(1.0, (seq / (seq + ATTN_SHORT_SEQ)) / (REFERENCE_SEQ / (REFERENCE_SEQ + ATTN_SHORT_SEQ)))
    else:
        amortised = _on_curve(attention_curve(curve), seq) / _on_curve(attention_curve(curve), REFERENCE_SEQ)
    return amortised * _by_head_dim(ATTN_HEAD64, 1.0, head_dim)


def attention_kernel_slowdown(kernel: str, seq: int, head_dim: int) -> tuple[float, float]:
    """(forward, backward) time of an attention kernel over FlashAttention-2's for the same work
    (ATTENTION_KERNEL_SLOWDOWN, MEASURED_KERNELS)."""
    if kernel not in MEASURED_KERNELS:
        return ATTENTION_KERNEL_SLOWDOWN[kernel]
    reference, own = MEASURED_KERNELS[kernel]
    ratio = _measured_rate(reference, seq, head_dim) / _measured_rate(own, seq, head_dim)
    return ratio, ratio


def _measured_rate(table: str, seq: int, head_dim: int) -> float:
    """A measured table's fraction of the dense peak at this sequence length and head dimension."""
    at128, head64 = _on_curve(attention_curve(table), seq), head64_curve(table)
    return _by_head_dim(_on_curve(head64, seq) if head64 else at128, at128, head_dim)


def _by_head_dim(at64: float, at128: float, head_dim: int) -> float:
    """A quantity measured at head dimensions 64 and 128, log-linear between them and held outside."""
    return at128 if head_dim >= 128 else at64 + (at128 - at64) * max(0.0, log2(head_dim / 64))


# Unfused attention's causal mask as PyTorch's standard attention adds it (the measured tables' own
# operations): one more pass over the scores, read and written in 16 bits, that Megatron's fused softmax folds in.
UNFUSED_MASK_BYTES = 4
# Unfused attention's softmax over the 16-bit scores: read and written forward; backward reads its output and the
# incoming gradient and writes the gradient.
UNFUSED_SOFTMAX_BYTES = (4, 6)


def unfused_attention_core(seq_q: int, seq_k: int, head_dim: int, batch: int, gpu: GPU) -> tuple[float, float]:
    """(forward, backward) seconds of attention with its scores in HBM, op by op: the two batched GEMMs
    (Q K^T, then the probabilities times V) and the softmax's bytes between them, on ``batch`` heads x sequences."""
    peak = gpu.bf16_tflops * 1e12
    qk_f, qk_b = gemm_fwd_bwd(seq_q, head_dim, seq_k, gpu, peak, batch)
    av_f, av_b = gemm_fwd_bwd(seq_q, seq_k, head_dim, gpu, peak, batch)
    scores = batch * seq_q * seq_k
    return (qk_f + av_f + hbm_time(scores * UNFUSED_SOFTMAX_BYTES[0], gpu),
            qk_b + av_b + hbm_time(scores * UNFUSED_SOFTMAX_BYTES[1], gpu))


@lru_cache(maxsize=None)
def _unfused_ratios(table_name: str, head_dim: int) -> tuple[tuple[int, float], ...]:
    """Measured over modelled time of a table's unfused attention at each of its sequence lengths, on the GPU it
    was measured on (the benchmark's setup: hidden 2,048, batch x sequence 16K, the mask in its own pass; burst
    clocks both)."""
    table = ATTENTION_TABLES[table_name]
    burst = replace(get_gpu(table["gpu"]), sustained_clock=1.0)
    points = table["tflops"] if head_dim == 128 else table["head64_tflops"]
    ratios = []
    for seq, tflops in points:
        batch = (16384 // seq) * (2048 // head_dim)
        fwd, bwd = unfused_attention_core(seq, seq, head_dim, batch, burst)
        modelled = fwd + bwd + hbm_time(batch * seq * seq * UNFUSED_MASK_BYTES, burst)
        flops = (1 + FLASH_BACKWARD_RATIO) * causal_attention_flops(1, seq, seq, batch, head_dim)
        measured = flops / (tflops * 1e12)
        ratios.append((seq, measured / modelled))
    return tuple(ratios)


def unfused_attention_slowdown(gpu: GPU, seq: int, head_dim: int) -> float:
    """How much longer unfused attention takes than unfused_attention_core's roofline, on a GPU that names a
    measured table (hardware.GPU.unfused_attention): the ratio measured on the table's GPU, at this sequence length
    (log-linear between its lengths, held beyond) and head dimension (log-linear between 64 and 128, held
    outside), carried over to this one. 1 without a table."""
    if gpu.unfused_attention is None:
        return 1.0
    return _by_head_dim(_on_curve(_unfused_ratios(gpu.unfused_attention, 64), seq),
                        _on_curve(_unfused_ratios(gpu.unfused_attention, 128), seq), head_dim)


def _on_curve(points: tuple[tuple[int, float], ...], seq: int) -> float:
    xs, ys = [log2(s) for s, _ in points], [r for _, r in points]
    return between(xs, ys, min(max(log2(seq), xs[0]), xs[-1]))
