"""The attention core in the time model: FlashAttention's rate by sequence length and head dimension, the
Triton kernel's slowdown, and context parallelism (each ring step's keys; the K/V exchange a ring hides and an
all-gather exposes)."""
from dataclasses import replace

import pytest

from hybridpar.topology.attention_tables import ATTENTION_TABLES
from hybridpar.topology.cases import _profile
from hybridpar.topology.cost import layer_time
from hybridpar.topology.flops import causal_attention_flops
from hybridpar.topology.hardware import get_gpu, load_gpu
from hybridpar.topology.kernels import (ATTENTION_KERNEL_SLOWDOWN, ATTN_SHORT_SEQ, FLASH_BACKWARD_RATIO, UNFUSED_MASK_BYTES,
                                        attention_kernel_slowdown, attention_shape_factor, hbm_time, unfused_attention_core,
                                        unfused_attention_slowdown)
from hybridpar.topology.links import collective_time, nccl_sm_share
from hybridpar.topology.models import PRESETS
from hybridpar.topology.software import HYBRIDPAR, MEGATRON_CORE

# FlashAttention-3 on H100, head dimension 128, batch x sequence = 16K, TFLOP/s by sequence length:
# pytorch/benchmark commit ff65cb67, "Fix dimension order for FlashAttention-3" (its test plan's table).
FA3_H100 = {512: 430.32, 1024: 517.099, 2048: 565.544, 4096: 590.233, 8192: 614.234, 16384: 620.73}


def test_flash_attention_rate_follows_sequence_length_and_head_dimension():

    assert attention_shape_factor(8192, 128) == 1.0 == attention_shape_factor(131072, 128)
    assert attention_shape_factor(512, 128) == pytest.approx((512 / 768) / (8192 / 8448))
    assert attention_shape_factor(8192, 64) == pytest.approx(0.87)
    assert attention_shape_factor(2048, 64) < attention_shape_factor(2048, 128) < 1


def test_context_parallel_attention_amortises_over_one_ring_steps_keys():
    """With CP each FlashAttention call sees seq / cp keys: the attention core of a layer costs its causal
    FLOPs at the attention fraction times attention_shape_factor(seq / cp). Isolated by halving the
    fraction, which doubles the attention core and nothing else."""
    m, gpu, seq, cp = PRESETS["llama3-8b"], get_gpu("h100-80gb"), 8192, 4
    fast, slow = (replace(MEGATRON_CORE, attention_fraction=a) for a in (0.5, 0.25))
    core = (layer_time(m, gpu, "bf16", seq, 1, 1, cp, True, "none", slow, 8).fwd
            - layer_time(m, gpu, "bf16", seq, 1, 1, cp, True, "none", fast, 8).fwd)
    expected = causal_attention_flops(1, seq // cp, seq, m.heads, m.head_dim) / (
        gpu.bf16_tflops * 1e12 * 0.5 * gpu.sustained_clock * attention_shape_factor(seq // cp, m.head_dim))
    assert core == pytest.approx(expected, rel=1e-9)
    assert attention_shape_factor(seq // cp, m.head_dim) < attention_shape_factor(seq, m.head_dim)


def test_a_cp_ring_hides_its_exchange_behind_the_attention():
    """Transformer Engine's ring (megatron-core's profile) sends the next K/V chunk while the current one's
    attention runs: at 128K the exchange hides but for the SMs NCCL holds; at 2K across nodes it outlasts the
    attention. The all-gather of Llama 3 and hybridpar's runtime exposes it all: K/V gathered in forward and
    kept, dK/dV reduce-scattered in backward."""
    m, gpu = PRESETS["llama3-8b"], get_gpu("h100-80gb")
    gathered = replace(MEGATRON_CORE, cp_ring_overlap=False)
    assert MEGATRON_CORE.cp_ring_overlap and not HYBRIDPAR.cp_ring_overlap
    for seq, tp, cp in ((131072, 1, 8), (2048, 8, 8)):
        kv_bytes = seq * 2 * m.kv_heads * m.head_dim / tp * 2
        nodes = tp * cp // 8
        bw = gpu.nvlink_gbps if nodes == 1 else gpu.network_gbps
        gather = collective_time("all-gather", kv_bytes, cp, nodes, bw, gpu)
        scatter = collective_time("reduce-scatter", kv_bytes, cp, nodes, bw, gpu)
        exposed = layer_time(m, gpu, "bf16", seq, 1, tp, cp, True, "none", gathered, 8).cp
        ring = layer_time(m, gpu, "bf16", seq, 1, tp, cp, True, "none", MEGATRON_CORE, 8).cp
        assert exposed == pytest.approx(gather + scatter, rel=1e-9)
        comm = 2 * gather + scatter  # the ring passes K/V round again in backward, beside dK/dV
        share = nccl_sm_share(gpu, nodes)
        if seq == 131072:
            assert ring == pytest.approx(share * comm, rel=1e-9)
        else:
            assert share * comm < ring < comm
    llama3 = {"id": "llama3-405b-t4-3"}
    nemo = {"id": "nemo-long", "software": "megatron-core-bf16-grads"}
    assert not _profile(llama3).cp_ring_overlap and _profile(nemo).cp_ring_overlap


def test_attention_sequence_curve_matches_a_measured_hopper_kernel():
    """kernels.attention_shape_factor's seq / (seq + 256) follows FlashAttention-3's measured rate on H100
    within 2.5% at every sequence length, relative to the longest."""
    curve = lambda s: s / (s + ATTN_SHORT_SEQ)
    for seq, rate in FA3_H100.items():
        assert curve(seq) / curve(16384) == pytest.approx(rate / FA3_H100[16384], rel=0.025), seq


# Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png and flash2_h100_fwd_bwd_benchmark.png at
# 4f285b35: forward+backward TFLOP/s, causal, fp16, hidden 2,048, batch x sequence 16K, by sequence length;
# panel (d) head dimension 128, (c) 64: FlashAttention-2, and PyTorch's standard attention.
FA2_A100 = {128: {512: 99, 1024: 133, 2048: 155, 4096: 173, 8192: 182, 16384: 189},
            64: {512: 88, 1024: 119, 2048: 140, 4096: 156, 8192: 165, 16384: 171}}
PYTORCH = {"a100-80gb": {128: {512: 23, 1024: 28, 2048: 32, 4096: 32, 8192: 34},
                         64: {512: 15, 1024: 16, 2048: 17, 4096: 18, 8192: 18}},
           "h100-80gb": {128: {512: 40, 1024: 50, 2048: 57, 4096: 61, 8192: 63},
                         64: {512: 26, 1024: 29, 2048: 31, 4096: 32, 8192: 32}}}


def test_a100_attention_is_flashattention2s_measured_rate():
    """A100's attention_fraction is FlashAttention-2's measured rate at 8K (182 of 312 TFLOP/s), its sequence
    curve the measured one, and head dimension 64 its own measured rate, not the generic 0.85."""
    a100 = get_gpu("a100-80gb")
    assert a100.attention_curve == "a100-fa2" and a100.attention_fraction == pytest.approx(182 / 312, abs=1e-3)
    for seq in (512, 2048, 16384):
        assert attention_shape_factor(seq, 128, a100.attention_curve) == pytest.approx(FA2_A100[128][seq] / 182)
        assert attention_shape_factor(seq, 64, a100.attention_curve) == pytest.approx(FA2_A100[64][seq] / 182)
    at96 = attention_shape_factor(2048, 96, a100.attention_curve)
    assert FA2_A100[64][2048] / 182 < at96 < FA2_A100[128][2048] / 182


def test_triton_attention_costs_flashattention2s_work_at_its_measured_slowdown():
    """FlashAttention in Triton (MosaicML's attn_impl: triton) does FlashAttention-2's work 1.4x slower
    forward and 2x slower backward (Dao 2023, §4.1): a layer's forward grows by 0.4 of the attention
    core and its backward by 1.0 of the core's backward, and nothing else moves."""
    assert ATTENTION_KERNEL_SLOWDOWN == {"flash2": (1.0, 1.0), "triton": (1.4, 2.0)}
    m, gpu, seq = PRESETS["llama3-8b"], get_gpu("a100-80gb"), 4096
    flash2, triton = (replace(MEGATRON_CORE, attention_kernel=k) for k in ("flash2", "triton"))
    a, b = (layer_time(m, gpu, "bf16", seq, 2, 1, 1, True, "none", sw, 8) for sw in (flash2, triton))
    core = causal_attention_flops(2, seq, seq, m.heads, m.head_dim) / (
        gpu.bf16_tflops * 1e12 * gpu.attention_fraction * gpu.sustained_clock
        * attention_shape_factor(seq, m.head_dim, gpu.attention_curve))
    assert b.fwd - a.fwd == pytest.approx(0.4 * core, rel=1e-9)
    assert b.bwd - a.bwd == pytest.approx(1.0 * FLASH_BACKWARD_RATIO * core, rel=1e-9)
    assert (b.tp, b.cp) == (a.tp, a.cp)


FA1_A100 = {128: {512: 55, 1024: 62, 2048: 69, 4096: 76, 8192: 80, 16384: 83},
            64: {512: 58, 1024: 70, 2048: 77, 4096: 87, 8192: 92, 16384: 97}}


def test_flashattention_1_costs_flashattention2s_work_at_the_measured_ratio():
    """--attention-kernel flash1: FlashAttention 1.x's time over FlashAttention-2's is the ratio of their measured
    A100 rates at the sequence and head dimension (the same benchmark), forward and backward alike, log-linear
    between head dimensions 64 and 128."""
    for seq in (512, 2048, 16384):
        for head_dim in (64, 128):
            ratio = FA2_A100[head_dim][seq] / FA1_A100[head_dim][seq]
            assert attention_kernel_slowdown("flash1", seq, head_dim) == pytest.approx((ratio, ratio))
    at96 = attention_kernel_slowdown("flash1", 2048, 96)[0]
    assert 140 / 77 < at96 < 155 / 69
    assert attention_kernel_slowdown("triton", 2048, 128) == (1.4, 2.0)
    m, gpu = PRESETS["llama3-8b"], get_gpu("a100-80gb")
    flash2, flash1 = (replace(MEGATRON_CORE, attention_kernel=k) for k in ("flash2", "flash1"))
    a, b = (layer_time(m, gpu, "bf16", 2048, 1, 1, 1, True, "none", sw, 8) for sw in (flash2, flash1))
    core = causal_attention_flops(1, 2048, 2048, m.heads, m.head_dim) / (
        gpu.bf16_tflops * 1e12 * gpu.attention_fraction * gpu.sustained_clock
        * attention_shape_factor(2048, m.head_dim, gpu.attention_curve))
    extra = FA2_A100[128][2048] / FA1_A100[128][2048] - 1
    assert b.fwd - a.fwd == pytest.approx(extra * core, rel=1e-6)
    assert b.bwd - a.bwd == pytest.approx(extra * FLASH_BACKWARD_RATIO * core, rel=1e-6)


@pytest.mark.parametrize("gpu_name", sorted(PYTORCH))
def test_unfused_attention_takes_the_measured_time_of_pytorchs_standard_attention(gpu_name):
    """The op-by-op roofline of unfused attention (two batched GEMMs, the softmax's passes, and the benchmark's
    separate mask pass) times the GPU's measured shortfall reproduces each measured bar of PyTorch's standard
    attention; the shortfall is large (1.4-2x) on both GPUs, and B200, with no table, keeps the roofline."""
    gpu = get_gpu(gpu_name)
    burst = replace(gpu, sustained_clock=1.0)
    assert ATTENTION_TABLES[gpu.unfused_attention]["gpu"] == gpu_name
    for head_dim, bars in PYTORCH[gpu_name].items():
        for seq, tflops in bars.items():
            batch = (16384 // seq) * (2048 // head_dim)
            fwd, bwd = unfused_attention_core(seq, seq, head_dim, batch, burst)
            mask = hbm_time(batch * seq * seq * UNFUSED_MASK_BYTES, burst)
            slowdown = unfused_attention_slowdown(gpu, seq, head_dim)
            measured = 3.5 * 4 * batch * seq * seq * head_dim / 2 / (tflops * 1e12)
            assert (fwd + bwd + mask) * slowdown == pytest.approx(measured, rel=1e-9)
            assert 1.4 < slowdown < 2.0
    assert unfused_attention_slowdown(get_gpu("b200-180gb"), 2048, 128) == 1.0
    # measured on H100, carried over to H200 as a ratio, not re-derived against H200's faster HBM
    h200 = get_gpu("h200-141gb")
    assert unfused_attention_slowdown(h200, 2048, 128) == unfused_attention_slowdown(get_gpu("h100-80gb"), 2048, 128)


def test_a_stack_without_flashattention_pays_the_measured_unfused_attention():
    """Megatron's layers before FlashAttention (megatron-lm-2022: scores in HBM, fused softmax, dropout on the
    probabilities) on A100: the attention core is the roofline times the measured shortfall, dropout's bytes on top."""
    m, gpu, seq = PRESETS["llama3-8b"], get_gpu("a100-80gb"), 2048
    sw = _profile({"id": "x", "software": "megatron-lm-2022"})
    assert not sw.flash_attention and sw.dropout
    bare = replace(gpu, unfused_attention=None)
    slow, fast = (layer_time(m, g, "bf16", seq, 1, 8, 1, True, "none", sw, 8) for g in (gpu, bare))
    fwd, bwd = unfused_attention_core(seq, seq, m.head_dim, m.heads // 8, gpu)
    extra = unfused_attention_slowdown(gpu, seq, m.head_dim) - 1
    assert slow.fwd - fast.fwd == pytest.approx(extra * fwd, rel=1e-6)
    assert slow.bwd - fast.bwd == pytest.approx(extra * bwd, rel=1e-6)


# cuDNN 9.10.2 on one B200, Llama 3.1 405B's attention (128 query heads, 8 KV heads, head dimension 128, causal,
# batch 1): forward and backward ms by sequence length, NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/
# artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200.csv, rows pyt_cudnn.
CUDNN_B200_MS = {2048: (0.287, 0.925), 4096: (0.642, 1.960), 8192: (1.877, 5.833), 32768: (24.795, 79.338)}


def test_b200_attention_is_the_measured_cudnn_rate():
    """B200's attention_fraction is cuDNN's measured rate at 8K in the planner's count (forward FLOPs of the
    causal half, backward 2.5x, over the two times), and its rate at other lengths follows the measurement."""
    b200 = get_gpu("b200-180gb")

    def rate(seq):
        fwd, bwd = CUDNN_B200_MS[seq]
        return (1 + FLASH_BACKWARD_RATIO) * 4 * seq * seq * 128 * 128 / 2 / ((fwd + bwd) * 1e-3) / 2250e12

    assert b200.attention_curve and b200.attention_fraction == pytest.approx(rate(8192), abs=1e-3)
    for seq in (2048, 4096, 32768):
        assert attention_shape_factor(seq, 128, b200.attention_curve) == pytest.approx(rate(seq) / rate(8192), rel=2e-3)
    between = attention_shape_factor(6000, 128, b200.attention_curve)
    assert rate(4096) / rate(8192) < between < 1  # log-linear between measured lengths
    held = attention_shape_factor(131072, 128, b200.attention_curve)
    assert attention_shape_factor(1 << 20, 128, b200.attention_curve) == held  # held beyond the last length
    assert attention_shape_factor(8192, 64, b200.attention_curve) == pytest.approx(0.87)  # head dimension as before


# cuDNN 9.19 on one H200, Llama 3.1 70B's attention (64 query heads, 8 KV heads, head dimension 128, causal
# top_left, batch 1, bf16): fwd_time_ms and bwd_time_ms, NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/
# results/h200_919_only_cudnn/llama3.1_20260227_034703.csv.
CUDNN_H200_MS = {2048: (0.142, 0.464), 4096: (0.465, 1.450), 8192: (1.708, 5.083), 32768: (25.566, 75.688)}


def test_a_gpu_file_plans_hopper_attention_at_cudnn_919s_measured_rate(tmp_path):
    """Naming the H200 cuDNN 9.19 table in a GPU file gives its rate at 8K as the level (a file that gives
    no attention_fraction of its own) and its measured shape; the catalogue's Hopper keeps the assumed 0.5,
    which the validated runs' older kernels are costed with."""
    def rate(seq):
        fwd, bwd = CUDNN_H200_MS[seq]
        return (1 + FLASH_BACKWARD_RATIO) * 4 * seq * seq * 128 * 64 / 2 / ((fwd + bwd) * 1e-3) / 989e12

    path = tmp_path / "h100-cudnn.yaml"
    path.write_text("base: h100-80gb\nattention_curve: h200-cudnn-9.19\n")
    gpu = load_gpu(str(path))
    assert gpu.attention_fraction == pytest.approx(rate(8192), abs=1e-3) and 0.56 < gpu.attention_fraction < 0.58
    for seq in (2048, 4096, 32768):
        assert attention_shape_factor(seq, 128, gpu.attention_curve) == pytest.approx(rate(seq) / rate(8192), rel=2e-3)
    assert attention_shape_factor(32768, 128, gpu.attention_curve) > 1  # cuDNN keeps gaining past 8K
    h100 = get_gpu("h100-80gb")
    assert h100.attention_curve is None and h100.attention_fraction == 0.5
    m = PRESETS["llama3-70b"]
    faster = layer_time(m, gpu, "bf16", 8192, 1, 8, 1, True, "none", MEGATRON_CORE, 8)
    assumed = layer_time(m, h100, "bf16", 8192, 1, 8, 1, True, "none", MEGATRON_CORE, 8)
    assert faster.fwd < assumed.fwd and faster.bwd < assumed.bwd


def test_a_gpu_file_with_its_own_attention_fraction_drops_the_base_curve(tmp_path):
    own = tmp_path / "b200.yaml"
    own.write_text("base: b200-180gb\nattention_fraction: 0.4\n")
    kept = tmp_path / "b200-gemm.yaml"
    kept.write_text("base: b200-180gb\ngemm_fraction: 0.7\n")
    assert load_gpu(str(own)).attention_curve is None and load_gpu(str(kept)).attention_curve == "b200-cudnn-9.10"
