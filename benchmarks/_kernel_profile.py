"""Where a training step's GPU time goes: its kernels from torch.profiler, summed by kind, so a measured
step can be set beside the planner's terms (GEMMs, attention, memory-bound work, the optimizer, collectives)
and the time the GPU sat idle waiting for the host. Not a benchmark itself (bench --list skips '_' names)."""
from __future__ import annotations

import re

# Kernel names by kind, first match wins: FlashAttention and cuDNN's fused attention (whose names also hold
# "wgmma"), cuBLAS/CUTLASS GEMMs (Hopper's nvjet and sm90 xmma kernels, the older ampere/sm80 ones), NCCL, the optimizer's multi-tensor
# (foreach) kernels, copies and fills; the rest is elementwise, normalisation and reduction work.
KINDS = (
    ("attention", re.compile(r"flash|fmha|sdpa|attention|attn", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|xmma|cutlass|cublas|sm\d\d_.*(mma|gmma)|matmul", re.I)),
    ("collective", re.compile(r"nccl", re.I)),
    ("optimizer", re.compile(r"multi_tensor|foreach|adam", re.I)),
    ("copy", re.compile(r"^memcpy|^memset|copy_kernel|cat_|catarray", re.I)),
)


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "elementwise"


def busy_seconds(intervals) -> float:
    """Seconds covered by the union of (start, end) intervals in seconds: the GPU's busy time, however
    its kernels overlap."""
    busy, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        busy += e - max(s, end)
        end = e
    return busy


def summarise(kernels, wall_s: float, steps: int, top: int = 25) -> dict:
    """kernels: (name, start_s, end_s) of every GPU kernel over ``steps`` steps of ``wall_s`` seconds in all.
    Per step: seconds by kind, the GPU's busy and idle time, and the ``top`` kernels by time."""
    by_kind, by_name = {}, {}
    for name, start, end in kernels:
        kind = kind_of(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + (end - start) / steps
        total, count = by_name.get(name, (0.0, 0))
        by_name[name] = (total + (end - start) / steps, count + 1)
    busy = busy_seconds([(s, e) for _, s, e in kernels]) / steps
    ranked = sorted(by_name.items(), key=lambda item: -item[1][0])[:top]
    return {"step_s": wall_s / steps, "gpu_busy_s": busy, "gpu_idle_s": max(0.0, wall_s / steps - busy),
            "by_kind_s": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
            "top_kernels": [{"name": name[:160], "kind": kind_of(name), "s_per_step": t, "calls_per_step": c / steps}
                            for name, (t, c) in ranked]}


def profile_steps(run_step, steps: int) -> dict:
    """Run ``run_step(i)`` for i in range(steps) under torch.profiler on CUDA and summarise its kernels."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for i in range(steps):
            run_step(i)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels = [(e.name, e.time_range.start / 1e6, e.time_range.end / 1e6) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA]
    return summarise(kernels, wall, steps)
