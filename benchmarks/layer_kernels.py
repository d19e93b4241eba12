"""layer_kernels: this GPU's time for the planner's own per-layer kernels, next to what the planner predicts.

`hybridpar bench layer_kernels [--seconds 0.03] [--tokens 4096,8192]` on a machine with a CUDA GPU (it exits 2
without one). Where `hybridpar bench kernels` measures the two rates the planner starts from (the best
GEMM, FlashAttention at 8K), this times the kernels a training step is made of, in the layouts a
linear layer runs them, and puts each beside topology/kernels.py's prediction for this GPU at its burst
clock (sustained_clock 1: one GPU alone, timed in short bursts), so the shape model (wave quantisation,
tile choice, split-K, the short-K cost, FlashAttention's sequence and head-dimension factor, streaming
bandwidth, the kernel boundary and the host's issue) is checked kernel by kernel on real hardware:
* GEMMs: QKV, attention projection, fc1, fc2 of Llama 3 8B/70B/405B and GPT-3 175B at the tensor-parallel
  widths their recipes use, for --tokens tokens per micro-batch: forward (x @ W^T), input gradient
  (dy @ W) and weight gradient (dy^T @ x); with the 8192^3 GEMM as the run's own reference rate.
* attention: torch SDPA (FlashAttention on CUDA), causal, batch 1, forward alone and forward + backward,
  sequence 1K to 16K, head dimension 64 and 128.
* streaming: c = a + b over 1 GiB operands, the bytes over the time against the GPU's HBM bandwidth.
* kernel boundary: a minimal kernel's time issued from Python (the host's issue) and replayed inside a
  CUDA graph (the boundary alone).
* unfused RoPE and SwiGLU, forward and backward, as megatron-core 0.16.1 runs them without fusion
  (models/common/embeddings/rope_utils.py _apply_rotary_pos_emb_bshd on the Q and K views of the fused QKV
  output; transformer/mlp.py's glu on the fc1 output's two halves): the bytes topology/kernels.py counts
  for them over the measured time, against the streaming rate.
Writes benchmarks/results/layer_kernels.json."""
from __future__ import annotations

import sys
from dataclasses import replace

from hybridpar.topology.flops import causal_attention_flops
from hybridpar.topology.hardware import GPU, get_gpu
from hybridpar.topology.kernels import (FLASH_BACKWARD_RATIO, HBM_EFFICIENCY, attention_shape_factor, gemm_time)
from hybridpar.topology.models import load_model

from hybridpar.benchmarks._cli import BenchParser, int_list, positive_float
from hybridpar.benchmarks.kernels import matmul_tflops, seconds_per_call
from hybridpar.benchmarks.results_io import write_result

# The tensor-parallel widths each model's recipes and published runs use.
MODEL_TPS = {"llama3-8b": (1, 2, 4, 8), "llama3-70b": (2, 4, 8), "llama3-405b": (4, 8), "gpt3-175b": (4, 8)}
ATTENTION_SEQS = (1024, 2048, 4096, 8192, 16384)
ATTENTION_HEAD_DIMS = (64, 128)
ATTENTION_TOKENS = 32 * 8192  # heads x seq held at this, so every shape does comparable work
REFERENCE = (8192, 8192, 8192)
STREAM_BYTES = 2**30


def layer_gemm_shapes(model: str, tp: int, tokens: int) -> list[dict]:
    """The four GEMMs of one layer on one tensor-parallel rank, as topology/cost.py layer_time sizes them:
    (name, k, n) with the tokens as m."""
    m = load_model(model)
    kv = m.kv_heads * m.head_dim
    up = m.ffn_hidden * (2 if m.mlp == "swiglu" else 1)
    named = (("qkv", m.hidden, (m.hidden + 2 * kv) // tp), ("proj", m.hidden // tp, m.hidden),
             ("fc1", m.hidden, up // tp), ("fc2", m.ffn_hidden // tp, m.hidden))
    return [{"model": model, "tp": tp, "tokens": tokens, "gemm": name, "k": k, "n": n} for name, k, n in named]


def predicted_gemm_seconds(pass_: str, tokens: int, k: int, n: int, gpu: GPU) -> float:
    """The planner's time for one pass of a (tokens x k) @ (k x n) layer GEMM, as cost.layer_time asks."""
    peak = gpu.bf16_tflops * 1e12
    m_, k_, n_ = {"forward": (tokens, k, n), "input_grad": (tokens, n, k), "weight_grad": (k, tokens, n)}[pass_]
    return gemm_time(m_, k_, n_, gpu, peak)


def time_layer_gemm(pass_: str, tokens: int, k: int, n: int, device: str, dtype, seconds: float) -> float:
    """Seconds of one pass of a linear layer with a (tokens x k) input and an (n x k) weight, in the
    layout autograd runs it."""
    import torch
    import torch.nn.functional as F

    from hybridpar.benchmarks.kernels import _synchronizer

    x = torch.randn(tokens, k, device=device, dtype=dtype)
    w = torch.randn(n, k, device=device, dtype=dtype)
    dy = torch.randn(tokens, n, device=device, dtype=dtype)
    call = {"forward": lambda: F.linear(x, w), "input_grad": lambda: torch.mm(dy, w),
            "weight_grad": lambda: torch.mm(dy.t(), x)}[pass_]
    return seconds_per_call(call, seconds, _synchronizer(device))


def gemm_rows(tokens_list, device: str, dtype, seconds: float, gpu: GPU) -> list[dict]:
    rows, seen = [], {}
    for model, tps in MODEL_TPS.items():
        for tp in tps:
            for tokens in tokens_list:
                for shape in layer_gemm_shapes(model, tp, tokens):
                    for pass_ in ("forward", "input_grad", "weight_grad"):
                        key = (pass_, tokens, shape["k"], shape["n"])
                        if key not in seen:
                            seen[key] = time_layer_gemm(pass_, tokens, shape["k"], shape["n"], device, dtype, seconds)
                        rows.append({**shape, "pass": pass_, "measured_s": seen[key],
                                     "predicted_s": predicted_gemm_seconds(pass_, tokens, shape["k"], shape["n"], gpu)})
    return rows


def attention_rows(device: str, dtype, seconds: float, gpu: GPU, seqs=ATTENTION_SEQS,
                   head_dims=ATTENTION_HEAD_DIMS, tokens: int = ATTENTION_TOKENS) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from hybridpar.benchmarks.kernels import _synchronizer

    sync, rows = _synchronizer(device), []
    for d in head_dims:
        heads = 4096 // d  # a hidden size of 4096, Llama 3 8B's
        for seq in seqs:
            batch = max(1, tokens // (heads * seq))
            q, k, v = (torch.randn(batch, heads, seq, d, device=device, dtype=dtype, requires_grad=True)
                       for _ in range(3))
            grad = torch.randn(batch, heads, seq, d, device=device, dtype=dtype)

            def forward():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def forward_backward():
                F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)
                q.grad = k.grad = v.grad = None

            fwd_s = seconds_per_call(forward, seconds, sync)
            both_s = seconds_per_call(forward_backward, seconds, sync)
            flops = causal_attention_flops(batch, seq, seq, heads, d)
            rate = gpu.bf16_tflops * 1e12 * gpu.attention_fraction * attention_shape_factor(seq, d)
            rows.append({"seq": seq, "head_dim": d, "heads": heads, "batch": batch, "forward_s": fwd_s,
                         "forward_backward_s": both_s, "forward_flops": flops,
                         "predicted_forward_backward_s": flops * (1 + FLASH_BACKWARD_RATIO) / rate})
    return rows


def stream_row(device: str, dtype, seconds: float, gpu: GPU, nbytes: int = STREAM_BYTES) -> dict:
    import torch

    from hybridpar.benchmarks.kernels import _synchronizer

    elements = nbytes // torch.empty((), dtype=dtype).element_size()
    a, b = torch.randn(elements, device=device, dtype=dtype), torch.randn(elements, device=device, dtype=dtype)
    c = torch.empty_like(a)
    t = seconds_per_call(lambda: torch.add(a, b, out=c), seconds, _synchronizer(device))
    moved = 3 * elements * a.element_size()
    return {"bytes": moved, "measured_s": t, "tbps": moved / t / 1e12, "catalogue_tbps": gpu.hbm_tbps,
            "efficiency": moved / t / 1e12 / gpu.hbm_tbps, "planner_efficiency": HBM_EFFICIENCY}


def kernel_boundary_row(device: str, calls: int = 2000) -> dict:
    """A one-element add issued ``calls`` times from Python, and the same adds captured once in a CUDA
    graph and replayed: seconds per kernel of each."""
    import time

    import torch

    x = torch.zeros(1, device=device)
    for _ in range(50):
        x.add_(1)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        x.add_(1)
    torch.cuda.synchronize()
    eager = (time.perf_counter() - start) / calls
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                x.add_(1)
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    return {"eager_s_per_kernel": eager, "graph_s_per_kernel": (time.perf_counter() - start) / 5 / calls}


# (name, heads, kv heads, head dim, ffn) per tensor-parallel rank: the 1.07B model of `bench gpu`, Llama 3 8B
# at TP 1, Llama 3 70B at TP 8.
UNFUSED_SHAPES = (("llama-1b", 16, 8, 128, 5632), ("llama3-8b-tp1", 32, 8, 128, 14336), ("llama3-70b-tp8", 8, 1, 128, 3584))


def _rope(t, cos, sin):
    """megatron-core's unfused RoPE on t [s, b, heads, d]: t * cos + rotate_half(t) * sin, then the cat with
    the (empty) part past the rotary dimension."""
    import torch

    rot, rest = t[..., :cos.shape[-1]], t[..., cos.shape[-1]:]
    x1, x2 = torch.chunk(rot, 2, dim=-1)
    return torch.cat((rot * cos + torch.cat((-x2, x1), dim=-1) * sin, rest), dim=-1)


def unfused_calls(device: str, dtype, seq: int, batch: int, heads: int, kv: int, d: int, ffn: int) -> dict:
    """{"rope": call, "swiglu": call}: one forward and backward each of megatron-core's unfused RoPE (on the
    Q and K views of a fused QKV output) and SwiGLU (on fc1's output), on fresh random tensors."""
    import torch
    import torch.nn.functional as F

    group = heads // kv
    mixed = torch.randn(seq, batch, kv, (group + 2) * d, device=device, dtype=dtype, requires_grad=True)
    freqs = torch.randn(seq, 1, 1, d, device=device)
    grads = [torch.randn(seq, batch, heads, d, device=device, dtype=dtype),
             torch.randn(seq, batch, kv, d, device=device, dtype=dtype)]

    def rope():
        q = mixed[..., :group * d].reshape(seq, batch, heads, d)
        k = mixed[..., group * d:(group + 1) * d]
        cos, sin = torch.cos(freqs).to(dtype), torch.sin(freqs).to(dtype)
        torch.autograd.backward([_rope(q, cos, sin), _rope(k, cos, sin)], grads)
        mixed.grad = None

    fc1 = torch.randn(seq * batch, 2 * ffn, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(seq * batch, ffn, device=device, dtype=dtype)

    def swiglu():
        x_glu, x_linear = torch.chunk(fc1, 2, dim=-1)
        (F.silu(x_glu) * (x_linear + 0.0)).backward(grad)
        fc1.grad = None

    return {"rope": rope, "swiglu": swiglu}


def unfused_rows(device: str, dtype, seconds: float, seq: int = 2048, batch: int = 2, shapes=UNFUSED_SHAPES) -> list[dict]:
    import torch

    from hybridpar.benchmarks.kernels import _synchronizer
    from hybridpar.topology.kernels import ROPE_UNFUSED_PASSES, SWIGLU_UNFUSED_PASSES

    sync, rows = _synchronizer(device), []
    for name, heads, kv, d, ffn in shapes:
        calls = unfused_calls(device, dtype, seq, batch, heads, kv, d, ffn)
        for op, elements, passes in (("rope", seq * batch * (heads + kv) * d, ROPE_UNFUSED_PASSES),
                                     ("swiglu", seq * batch * ffn, SWIGLU_UNFUSED_PASSES)):
            fn = calls[op]
            t = seconds_per_call(fn, seconds, sync)
            moved = sum(passes) * elements * torch.empty((), dtype=dtype).element_size()
            row = {"shape": name, "op": op, "elements": elements, "bytes_counted": moved, "measured_s": t,
                   "tbps": moved / t / 1e12}
            if device.startswith("cuda"):  # the kernels' own time: alone, the host's issue may bound the call
                from hybridpar.benchmarks._kernel_profile import profile_steps

                busy = profile_steps(lambda i: fn(), 5)["gpu_busy_s"]
                row.update(device_s=busy, device_tbps=moved / busy / 1e12)
            rows.append(row)
    return rows


def main(argv=None) -> int:
    p = BenchParser("layer_kernels", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=positive_float, default=0.03, help="timing per kernel shape (default 0.03)")
    p.add_argument("--tokens", default="4096,8192", help="tokens per micro-batch on a rank, comma-separated "
                   "(default 4096,8192)")
    args = p.parse_args(argv)
    tokens = int_list(p, "--tokens", args.tokens)
    if min(tokens) < 1:
        p.error(f"--tokens {args.tokens}: tokens per micro-batch must be positive integers")
    from hybridpar.benchmarks.gpu import this_gpu

    found = this_gpu("layer_kernels")
    if found is None:
        return 2
    import torch

    props, base = found
    gpu = replace(get_gpu(base), sustained_clock=1.0)
    dtype = torch.bfloat16
    m, k, n = REFERENCE
    tflops = matmul_tflops(m, k, n, "cuda", dtype, 1.0)
    reference = {"m": m, "k": k, "n": n, "measured_s": 2 * m * k * n / tflops / 1e12,
                 "predicted_s": gemm_time(m, k, n, gpu, gpu.bf16_tflops * 1e12), "tflops": tflops}
    gemms = gemm_rows(tokens, "cuda", dtype, args.seconds, gpu)
    attention = attention_rows("cuda", dtype, args.seconds * 3, gpu)
    stream = stream_row("cuda", dtype, args.seconds * 10, gpu)
    boundary = kernel_boundary_row("cuda")
    unfused = unfused_rows("cuda", dtype, args.seconds * 3)
    ratios = sorted(r["predicted_s"] / r["measured_s"] for r in gemms)
    print(f"{props.name} ({base}): 8192^3 at {reference['tflops']:.0f} TFLOP/s; {len(gemms)} layer GEMMs, "
          f"predicted / measured time median {ratios[len(ratios) // 2]:.3f} "
          f"(from {ratios[0]:.3f} to {ratios[-1]:.3f}); streaming {stream['tbps']:.2f} TB/s "
          f"({stream['efficiency']:.2f} of {gpu.hbm_tbps}); kernel {boundary['eager_s_per_kernel'] * 1e6:.2f} us "
          f"eager, {boundary['graph_s_per_kernel'] * 1e6:.2f} us in a graph")
    for r in attention:
        print(f"attention seq {r['seq']:>5} d {r['head_dim']:>3}: forward+backward {r['forward_backward_s'] * 1e3:.2f} ms, "
              f"predicted {r['predicted_forward_backward_s'] * 1e3:.2f} ms, backward / forward "
              f"{(r['forward_backward_s'] - r['forward_s']) / r['forward_s']:.2f}")
    for r in unfused:
        print(f"unfused {r['op']:<6} {r['shape']:<15} {r['measured_s'] * 1e3:.3f} ms, {r['tbps']:.2f} TB/s counted "
              f"({r['tbps'] / gpu.hbm_tbps:.2f} of {gpu.hbm_tbps}); kernels alone {r['device_s'] * 1e3:.3f} ms, "
              f"{r['device_tbps'] / gpu.hbm_tbps:.2f} of it")
    write_result("layer_kernels", {"device": props.name, "catalogue_gpu": base, "torch_cuda": torch.version.cuda,
                                   "reference_gemm": reference, "gemms": gemms, "attention": attention,
                                   "stream": stream, "kernel_boundary": boundary,
                                   "unfused": unfused},
                 command=("hybridpar bench layer_kernels " + " ".join(argv or [])).strip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
