"""Measured attention kernels: forward and backward times of a causal attention kernel by sequence length, and the
rate they give as a fraction of the GPU's dense 16-bit peak in the planner's count (flops.causal_attention_flops
forward, FLASH_BACKWARD_RATIO x that backward, over the summed time). hardware.GPU.attention_curve names
one; kernels.attention_shape_factor follows it where a GPU has one.

"b200-cudnn-9.10": cuDNN 9.10.2's fused attention on one B200 (free clock), PyTorch 2.8's SDPA cuDNN backend,
Llama 3.1 405B's attention (128 query heads, 8 key/value heads, head dimension 128, causal, batch 1), bf16:
NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200.csv,
rows pyt_cudnn, forward_time and backward_time in ms [S, measured kernel table]. Its backward takes 3.1-3.2x its
forward from 2K on, not 2.5x: the summed time is what the rate keeps. FlashAttention-3 does not run on Blackwell
and FlashAttention-2 reaches a third of this rate there (the same file's flash_attention rows); Transformer
Engine's FusedAttention calls cuDNN.

"h200-cudnn-9.19": cuDNN 9.19's fused attention on one H200 (GH100, H100's compute; free clock), cudnn-frontend 1.19,
Llama 3.1 70B's attention (64 query heads, 8 key/value heads, head dimension 128, causal "top_left", batch 1), bf16:
NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn/llama3.1_20260227_034703.csv,
fwd_time_ms and bwd_time_ms [S, measured kernel table]: 0.57 of the dense peak at 8K, 0.51 at 4K, 0.61 from 16K.
It postdates every validated Hopper run (2021-2025 kernels), which keep the catalogue's assumed rate; a GPU file
names it to plan for that release of cuDNN.

"a100-fa2" and "a100-fa1": FlashAttention-2 (its 2.0 release) and FlashAttention 1.x (CUDA) on one A100 80GB SXM4,
fp16, causal, hidden 2,048 (16 heads of 128, or 32 of 64), batch x sequence 16K, forward and backward together in
the planner's count (4 b s^2 h d / 2 forward, 2.5x that backward: the benchmark's own `flops`):
Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png at 4f285b35 ("FlashAttention-2 release"),
panels (c) and (d), the setup in that commit's README ("Performance", A100) and the script that measures these
methods, benchmarks/benchmark_flash_attention.py at 60499abc [S, measured kernel table]: TFLOP/s at head dimension
128 and 64.

"a100-pytorch" and "h100-pytorch": the same figure's "Pytorch" bars and those of its H100 80GB SXM5 twin
(assets/flash2_h100_fwd_bwd_benchmark.png, same commit, same panels): PyTorch's standard attention, the scores
written to HBM (`attention_pytorch` in that script: baddbmm, the causal mask added in its own pass, softmax, bmm;
dropout 0), fp16, to 8K (16K ran out of memory). They time unfused attention (`unfused`), not a FlashAttention
kernel: kernels.unfused_attention_slowdown compares them with the planner's model of the same operations on the
catalogue GPU they were measured on (`gpu`).
"""
from __future__ import annotations

from functools import lru_cache

from .flops import causal_attention_flops

# FlashAttention's backward FLOPs over its forward's: it recomputes the scores (Dao 2022, §3.1).
FLASH_BACKWARD_RATIO = 2.5
# The length a GPU's attention_fraction is the rate at (head dimension 128, causal).
REFERENCE_SEQ = 8192


ATTENTION_TABLES: dict[str, dict] = {
    "b200-cudnn-9.10": dict(peak_tflops=2250.0, heads=128, head_dim=128, points=(
        (512, 0.102, 0.160), (1024, 0.135, 0.278), (2048, 0.287, 0.925), (4096, 0.642, 1.960),
        (8192, 1.877, 5.833), (16384, 6.602, 20.460), (32768, 24.795, 79.338), (65536, 101.812, 327.889),
        (131072, 415.333, 1343.117))),
    "h200-cudnn-9.19": dict(peak_tflops=989.0, heads=64, head_dim=128, points=(
        (2048, 0.142, 0.464), (4096, 0.465, 1.450), (8192, 1.708, 5.083), (16384, 6.531, 19.002),
        (32768, 25.566, 75.688))),
    "a100-fa2": dict(peak_tflops=312.0, head_dim=128, tflops=(
        (512, 99.0), (1024, 133.0), (2048, 155.0), (4096, 173.0), (8192, 182.0), (16384, 189.0)), head64_tflops=(
        (512, 88.0), (1024, 119.0), (2048, 140.0), (4096, 156.0), (8192, 165.0), (16384, 171.0))),
    "a100-fa1": dict(peak_tflops=312.0, head_dim=128, tflops=(
        (512, 55.0), (1024, 62.0), (2048, 69.0), (4096, 76.0), (8192, 80.0), (16384, 83.0)), head64_tflops=(
        (512, 58.0), (1024, 70.0), (2048, 77.0), (4096, 87.0), (8192, 92.0), (16384, 97.0))),
    "a100-pytorch": dict(peak_tflops=312.0, head_dim=128, unfused=True, gpu="a100-80gb", tflops=(
        (512, 23.0), (1024, 28.0), (2048, 32.0), (4096, 32.0), (8192, 34.0)), head64_tflops=(
        (512, 15.0), (1024, 16.0), (2048, 17.0), (4096, 18.0), (8192, 18.0))),
    "h100-pytorch": dict(peak_tflops=989.0, head_dim=128, unfused=True, gpu="h100-80gb", tflops=(
        (512, 40.0), (1024, 50.0), (2048, 57.0), (4096, 61.0), (8192, 63.0)), head64_tflops=(
        (512, 26.0), (1024, 29.0), (2048, 31.0), (4096, 32.0), (8192, 32.0))),
}


@lru_cache(maxsize=None)
def attention_curve(name: str) -> tuple[tuple[int, float], ...]:
    """(sequence, fraction of the dense peak) of a measured table, forward and backward together."""
    table = ATTENTION_TABLES[name]
    if "tflops" in table:  # forward and backward together, TFLOP/s in the planner's count
        return tuple((seq, tflops / table["peak_tflops"]) for seq, tflops in table["tflops"])
    curve = []
    for seq, fwd_ms, bwd_ms in table["points"]:
        flops = (1 + FLASH_BACKWARD_RATIO) * causal_attention_flops(1, seq, seq, table["heads"], table["head_dim"])
        curve.append((seq, flops / ((fwd_ms + bwd_ms) * 1e-3) / (table["peak_tflops"] * 1e12)))
    return tuple(curve)


def reference_rate(name: str) -> float:
    """A measured table's rate at REFERENCE_SEQ: the attention_fraction of a GPU that follows it."""
    return dict(attention_curve(name))[REFERENCE_SEQ]


@lru_cache(maxsize=None)
def head64_curve(name: str) -> tuple[tuple[int, float], ...] | None:
    """(sequence, fraction of the dense peak) at head dimension 64, where the table measured it."""
    table = ATTENTION_TABLES[name]
    if "head64_tflops" not in table:
        return None
    return tuple((seq, tflops / table["peak_tflops"]) for seq, tflops in table["head64_tflops"])


UNFUSED_TABLES = tuple(name for name, table in ATTENTION_TABLES.items() if table.get("unfused"))
FLASH_TABLES = tuple(name for name in ATTENTION_TABLES if name not in UNFUSED_TABLES)
