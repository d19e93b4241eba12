"""One-process worker for tests/integration/test_generate.py: hybridpar's SDPA core attention vs megatron's own.

Usage: python tests/workers/attention_worker.py OUT.json
Builds the tiny GQA model (4 heads, 2 KV groups) twice from the same canonical weights, once with
torch SDPA as core attention (hybridpar's default) and once with megatron's DotProductAttention
(materialised scores), scales the matrices up (sharp attention), and compares logits and every
parameter gradient of a mean cross-entropy loss, in fp32 and in bf16 (each bf16 run also against
megatron's fp32 logits). Writes {dtype: {...}}, and under "cp_chunk" what the context-parallel path's chunk
attention (hybridpar/runtime/attention.py causal_chunk_attention) runs: its kernels, forward and backward,
its time and rate in the planner's count, and how far it is from the same attention with an explicit mask.
On a GPU (scripts/gpu_session.sh) at Llama 3 70B's TP4 CP2 shape in bf16; here at a small one in fp32.
"""
from __future__ import annotations

import os
import sys
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402

sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # an installed hybridpar first

from hybridpar.topology.models import PRESETS  # noqa: E402
from hybridpar.topology.plan import Plan  # noqa: E402

from hybridpar.runtime.mesh import Mesh  # noqa: E402
from hybridpar.runtime.model import ModelOptions, build_model  # noqa: E402
from results_io import run_alone  # noqa: E402


BF16_SEEDS = (3, 4, 5, 6)  # bf16 rounding error is compared as an RMS over these weight/token draws
# Llama 3 70B at TP4 CP2, 8,192 tokens: 16 query and 2 KV heads of 128 per GPU; the last chunk's 2,048 queries
# against all 8,192 keys (the recipe's layout, recipes/llama3-70b.yaml).
CP_CHUNK_GPU = {"heads": 16, "kv_heads": 2, "head_dim": 128, "chunk": 2048, "keys": 8192}
CP_CHUNK_CPU = {"heads": 4, "kv_heads": 2, "head_dim": 16, "chunk": 32, "keys": 128}


def run(mesh, attention: str, dtype, tokens, seq: int, seed: int = 3):
    chunk = build_model(PRESETS["tiny"], mesh, ModelOptions(seq_len=seq, dtype=dtype, attention=attention), seed=seed)[0]
    with torch.no_grad():
        for p in chunk.parameters():
            if p.dim() == 2:
                p.mul_(8)
    positions = torch.arange(seq, device=mesh.device).unsqueeze(0).expand(tokens.shape[0], seq)
    loss = chunk(tokens[:, :-1], positions, None, labels=tokens[:, 1:]).float().mean()
    loss.backward()
    with torch.no_grad():
        logits = chunk(tokens[:, :-1], positions, None).float()
    core = type(chunk.decoder.layers[0].self_attention.core_attention).__name__
    grads = {n: p.grad.float().clone() for n, p in chunk.named_parameters()}
    return logits, grads, core


def compare_attention() -> dict:
    results = {}
    plan = Plan(model=PRESETS["tiny"], seq_len=33, global_batch=2, precision="fp32")
    mesh = Mesh.build(plan.layout)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, PRESETS["tiny"].vocab, (2, 33), generator=gen, device="cpu").to(mesh.device)
    out = {(a, d): run(mesh, a, dtype, tokens, 32) for a in ("megatron", "sdpa")
           for d, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    truth_logits, truth_grads, _ = out[("megatron", "fp32")]

    def logit_err(key):
        return float((out[key][0] - truth_logits).abs().max())

    for d in ("fp32", "bf16"):
        (ref_logits, ref_grads, ref_core), (logits, grads, core) = out[("megatron", d)], out[("sdpa", d)]
        grad_rel = max(float((grads[n] - ref_grads[n]).abs().max() / ref_grads[n].abs().max().clamp_min(1e-30))
                       for n in ref_grads)
        results[d] = {"cores": [ref_core, core], "max_logit": float(ref_logits.abs().max()),
                      "max_logit_diff": float((logits - ref_logits).abs().max()), "max_grad_rel_diff": grad_rel,
                      "grads_nonzero": all(float(g.abs().max()) > 0 for g in grads.values()),
                      "megatron_err_vs_fp32": logit_err(("megatron", d)), "sdpa_err_vs_fp32": logit_err(("sdpa", d))}
    results["bf16"]["rms_err_vs_fp32"] = bf16_rms_errors(mesh)
    cuda = mesh.device.type == "cuda"
    results["cp_chunk"] = cp_chunk_kernels(mesh.device, torch.bfloat16 if cuda else torch.float32,
                                           CP_CHUNK_GPU if cuda else CP_CHUNK_CPU)
    return results


def cp_chunk_kernels(device, dtype, shape: dict) -> dict:
    """The CP path's chunk attention, forward and backward: the kernels it runs (CUDA kernel names, or the
    CPU's attention ops), seconds per call (median of 5 after a warm-up), TFLOP/s in the planner's count (the
    causal work the chunk sees, backward 2.5x forward) and its largest difference from an explicit boolean mask."""
    import statistics
    import time

    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    from hybridpar.runtime.attention import causal_chunk_attention
    from hybridpar.topology.kernels import FLASH_BACKWARD_RATIO

    h, kvh, d, chunk, keys = (shape[k] for k in ("heads", "kv_heads", "head_dim", "chunk", "keys"))
    gen = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(1, h, chunk, d, generator=gen, device="cpu").to(device, dtype).requires_grad_()
    k, v = (torch.randn(1, kvh, keys, d, generator=gen, device="cpu").to(device, dtype).requires_grad_() for _ in range(2))
    grad = torch.randn(1, h, chunk, d, generator=gen, device="cpu").to(device, dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def call():
        causal_chunk_attention(q, k, v, None, True).backward(grad)

    allowed = torch.arange(keys, device=device)[None, :] <= (keys - chunk + torch.arange(chunk, device=device))[:, None]
    with torch.no_grad():
        diff = float((causal_chunk_attention(q, k, v, None, True)
                      - F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)).abs().max())
    call()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        call()
        sync()
    on_device = [e for e in prof.key_averages() if device.type != "cuda" or e.device_type.name == "CUDA"]
    kernels = sorted({e.key for e in on_device if device.type == "cuda" or "attention" in e.key})
    times = []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    seen = chunk * (keys - chunk) + chunk * (chunk + 1) / 2  # keys each query sees, summed
    flops = 4 * h * d * seen * (1 + FLASH_BACKWARD_RATIO)
    return {"device": device.type, "dtype": str(dtype), "shape": shape, "kernels": kernels, "seconds": seconds,
            "tflops": flops / seconds / 1e12, "max_diff_vs_mask": diff}


def bf16_rms_errors(mesh) -> dict:
    """Per core attention: the RMS of its bf16 logits' error against megatron's fp32 logits,
    averaged over ``BF16_SEEDS`` (the max error of one draw swings 0.8-1.35x between kernels)."""
    errors = {"megatron": [], "sdpa": []}
    for seed in BF16_SEEDS:
        gen = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, PRESETS["tiny"].vocab, (2, 33), generator=gen, device="cpu").to(mesh.device)
        truth = run(mesh, "megatron", torch.float32, tokens, 32, seed)[0]
        for core in errors:
            logits = run(mesh, core, torch.bfloat16, tokens, 32, seed)[0]
            errors[core].append(float((logits - truth).pow(2).mean().sqrt()))
    return {core: sum(e) / len(e) for core, e in errors.items()}


if __name__ == "__main__":
    run_alone(compare_attention)
