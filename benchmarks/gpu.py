"""gpu: one-GPU absolute number: a 1.07B Llama-style model, TP=1 PP=1 bf16, tokens/s, TFLOP/s, MFU vs planner.

`hybridpar bench gpu [--steps 30] [--warmup 5] [--seq-len 2048] [--micro-batch 2] [--global-batch 16] [--profile N]`
on a machine with one CUDA GPU (it refuses to run without one). Model "llama-1b" (chosen here):
20 layers, hidden 2048, ffn 5632 (SwiGLU), 16 heads / 8 KV heads (head dim 128), vocab 32,000,
untied: 1.075B parameters. It trains through hybridpar's own runtime (``hybridpar.train.Job``:
megatron-core GPTModel from the local layer spec, DeepSpeed ZeRO-1 over DP=1, AdamW, clipping) on
synthetic tokens, and reports the median step time after warm-up, tokens/s, model TFLOP/s
(Megatron's FLOP formula, topology.flops.model_flops_per_seq) and MFU against the GPU's dense bf16
peak from topology/hardware.py, beside the planner's prediction for the same Plan twice: with its
default software profile (FlashAttention, fused gradient accumulation) and with the profile of
what this runtime actually runs (torch SDPA attention, ``gradient_accumulation_fusion=False``). Expected wall time: model init ~20-60 s, 35 steps of
~1 s: well under 5 minutes. Writes benchmarks/results/gpu.json.
"""
from __future__ import annotations

import statistics
import sys
import time

from hybridpar.topology.cost import step_cost
from hybridpar.topology.flops import model_flops_per_seq
from hybridpar.topology.hardware import catalogue_for_device, get_gpu
from hybridpar.topology.models import ModelSpec
from hybridpar.topology.plan import Plan
from hybridpar.topology.software import HYBRIDPAR, MEGATRON_CORE

from hybridpar.benchmarks._cli import BenchParser, nonnegative_int, positive_int
from hybridpar.benchmarks._kernel_profile import profile_steps
from hybridpar.benchmarks.results_io import write_result

MODEL = ModelSpec(layers=20, hidden=2048, ffn_hidden=5632, heads=16, kv_heads=8, vocab=32000, name="llama-1b")
# The planner's profile of hybridpar's runtime (topology/software/profile.py HYBRIDPAR: torch SDPA
# attention, FlashAttention on CUDA; no gradient-accumulation fusion: each micro-batch's bf16
# weight gradients are added into fp32 ones in place), and megatron-core's, whose GEMMs accumulate
# into fp32.
PREDICTIONS = (("planner_hybridpar", HYBRIDPAR), ("planner_megatron_core_fused", MEGATRON_CORE))


def catalogue_name(device_name: str, memory_gib: float) -> str:
    """The catalogue entry of this CUDA device (topology.hardware.catalogue_for_device), or exit."""
    name = catalogue_for_device(device_name, memory_gib)
    if name is None:
        raise SystemExit(f"GPU {device_name!r} is not in topology/hardware.py's catalogue")
    return name


def this_gpu(bench: str):
    """(properties, catalogue name) of CUDA device 0, or None once stderr says `hybridpar bench BENCH` needs one."""
    import torch

    if not torch.cuda.is_available():
        print(f"hybridpar bench {bench}: no CUDA GPU here; run it on the GPU to measure", file=sys.stderr)
        return None
    props = torch.cuda.get_device_properties(0)
    return props, catalogue_name(props.name, props.total_memory / 2**30)


def make_plan(gpu: str, seq_len: int, micro_batch: int, global_batch: int) -> Plan:
    return Plan(model=MODEL, seq_len=seq_len, global_batch=global_batch, tp=1, pp=1, dp=1, micro_batch=micro_batch,
                zero_stage=1, precision="bf16", gpu=gpu, gpus_per_node=1)


def main(argv=None) -> int:
    p = BenchParser("gpu", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=30)
    p.add_argument("--warmup", type=nonnegative_int, default=5)
    p.add_argument("--seq-len", type=positive_int, default=2048)
    p.add_argument("--micro-batch", type=positive_int, default=2)
    p.add_argument("--global-batch", type=positive_int, default=16, help="a multiple of --micro-batch")
    p.add_argument("--profile", type=nonnegative_int, default=0, metavar="N",
                   help="then N more steps under torch.profiler: the step's GPU time by kernel kind (GEMM, "
                   "attention, elementwise, optimizer, copies), the GPU's idle time and the top kernels")
    args = p.parse_args(argv)
    if args.global_batch % args.micro_batch:
        p.error(f"--global-batch {args.global_batch} is not a multiple of --micro-batch {args.micro_batch} "
                f"(one GPU: DP = 1); e.g. --global-batch {args.micro_batch * max(args.global_batch // args.micro_batch, 1)}")
    bad = make_plan("h100-80gb", args.seq_len, args.micro_batch, args.global_batch).violations()
    if bad:  # the same divisibility rules on any GPU of the catalogue
        p.error("; ".join(bad))
    t_start = time.perf_counter()
    import torch

    if not torch.cuda.is_available():
        print("hybridpar bench gpu: no CUDA GPU here; run it on a machine with one GPU", file=sys.stderr)
        return 2
    from hybridpar.data import SyntheticTokens
    from hybridpar.config.optim import OptimConfig
    from hybridpar.launch.local import init_distributed, shutdown
    from hybridpar.runtime.job import Job

    init_distributed()
    try:
        props = torch.cuda.get_device_properties(0)
        gpu_key = catalogue_name(props.name, props.total_memory / 2**30)
        gpu = get_gpu(gpu_key)
        plan = make_plan(gpu_key, args.seq_len, args.micro_batch, args.global_batch)
        source = SyntheticTokens(plan.seq_len, plan.global_batch, MODEL.vocab, seed=0)
        optim = OptimConfig(lr=3e-4, min_lr=3e-5, warmup_steps=2, total_steps=args.warmup + args.steps + args.profile)
        job = Job(plan, optim, source, seed=0)
        setup_s = time.perf_counter() - t_start
        times, losses = [], []
        for step in range(1, args.warmup + args.steps + 1):
            torch.cuda.synchronize()
            m = job.train_step(step)  # returns after the loss all-reduce; synchronise for the clock anyway
            torch.cuda.synchronize()
            losses.append(m.loss)
            if step > args.warmup:
                times.append(m.step_time_s)
            print(f"step {step}: loss {m.loss:.4f} {m.step_time_s * 1e3:.0f} ms", flush=True)
        step_s = statistics.median(times)
        first = args.warmup + args.steps + 1
        profiled = profile_steps(lambda i: job.train_step(first + i), args.profile) if args.profile else None
        tokens = plan.global_batch * plan.seq_len
        flops = plan.global_batch * model_flops_per_seq(MODEL, plan.seq_len)
        tflops = flops / step_s / 1e12
        peak = gpu.peak_tflops("bf16")
        predicted = {name: step_cost(plan, sw=sw) for name, sw in PREDICTIONS}
        result = {
            "device": props.name, "catalogue_gpu": gpu_key, "peak_bf16_tflops": peak,
            "model": MODEL.to_dict(), "params": sum(p.numel() for c in job.chunks for p in c.parameters()),
            "plan": plan.to_dict(), "steps": args.steps, "warmup": args.warmup,
            "step_time_s": {"median": step_s, "min": min(times), "max": max(times)},
            "tokens_per_s": tokens / step_s, "model_tflops": tflops, "mfu": tflops / peak,
            "losses": losses, "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
            "setup_s": setup_s, "wall_s": time.perf_counter() - t_start,
            "predicted": {k: {"step_time_s": c.step_time_s, "tokens_per_s": c.tokens_per_s, "mfu": c.mfu}
                          for k, c in predicted.items()},
        }
        if profiled:
            result["profile"] = profiled
            print("profile, per step: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in profiled["by_kind_s"].items())
                  + f"; GPU busy {profiled['gpu_busy_s'] * 1e3:.0f} ms, idle {profiled['gpu_idle_s'] * 1e3:.0f} ms")
        print(f"{props.name}: {result['params'] / 1e9:.3f}B params, step {step_s * 1e3:.0f} ms, {tokens / step_s:,.0f} tokens/s, "
              f"{tflops:.0f} TFLOP/s, MFU {tflops / peak:.1%} of {peak:.0f}")
        for k, c in predicted.items():
            print(f"  {k}: step {c.step_time_s * 1e3:.0f} ms, {c.tokens_per_s:,.0f} tokens/s, MFU {c.mfu:.1%}")
        write_result("gpu", result, command=("hybridpar bench gpu " + " ".join(argv or [])).strip())
        job.close()
        return 0
    finally:
        shutdown()  # NCCL's communicators are torn down, not left to the interpreter's exit


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
