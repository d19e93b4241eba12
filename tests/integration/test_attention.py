"""hybridpar's core attention (torch SDPA, hybridpar/runtime/attention.py) computes megatron's attention.

Same canonical weights, megatron's DotProductAttention (materialised scores) vs SDPA on the tiny
GQA model: fp32 logits within 1e-5 of the largest logit and every gradient within 1e-5 of its
largest element (the two sum in different orders); in bf16 SDPA is no further from the fp32
result than megatron's own bf16 path (+5%, RMS logit error averaged over 4 draws of weights and
tokens: the ratio measured 0.92-1.01 per draw, while the max error of one draw swings 0.8-1.35x). Layout equivalence with SDPA is tests/integration/test_runtime.py's.
The worker also reports the context-parallel path's chunk attention (its kernels, on a GPU session which ones CUDA runs).
"""
from multirank import run_single_process_worker


def test_sdpa_attention_equals_megatron_attention(tmp_path):
    r = run_single_process_worker("attention_worker.py", tmp_path / "attention.json")
    for dtype in ("fp32", "bf16"):
        assert r[dtype]["cores"] == ["DotProductAttention", "SDPACoreAttention"], r[dtype]
        assert r[dtype]["grads_nonzero"], dtype
        assert r[dtype]["max_logit"] > 3.0, dtype  # sharp attention, not a near-uniform average
    assert r["fp32"]["max_logit_diff"] <= 1e-5 * r["fp32"]["max_logit"], r["fp32"]
    assert r["fp32"]["max_grad_rel_diff"] <= 1e-5, r["fp32"]
    rms = r["bf16"]["rms_err_vs_fp32"]
    assert 0 < rms["sdpa"] <= 1.05 * rms["megatron"], rms
    assert r["bf16"]["max_logit_diff"] > 0  # bf16 really ran (rounding differs between the kernels)


def test_cp_chunk_attention_is_the_masked_attention_and_reports_its_kernels(tmp_path):
    """What the GPU session reads from the worker for the CP path (on a GPU: which kernels, at what rate): here
    on CPU, the lower-right CausalBias equals the explicit boolean mask and its attention ops are named."""
    cp = run_single_process_worker("attention_worker.py", tmp_path / "attention.json")["cp_chunk"]
    assert cp["device"] == "cpu" and cp["max_diff_vs_mask"] <= 1e-6, cp
    assert cp["kernels"] and all("attention" in k for k in cp["kernels"]) and cp["tflops"] > 0, cp
