"""memory: parameter, gradient and optimizer-state bytes per rank for ZeRO 0/1/2 vs the planner.

`hybridpar bench memory [--dp 1,2,4,8]` starts one launch per DP size (fp32, gloo, CPU); each
rank builds a hybridpar Job per ZeRO stage of a 7.1M-parameter Llama-style model ("mem-7m":
4 layers, hidden 256, ffn 704, 4 heads / 2 KV, vocab 8192), trains 2 steps and reports, on
rank 0: weight bytes, gradient bytes held at the end of the backward (hybridpar accumulates
full gradients over the micro-batches in every stage; by then some are in their DP reduction's
buffers), DeepSpeed's partitioned gradient and
reduction-bucket buffers, optimizer-state bytes (AdamW moments plus DeepSpeed's fp32 master
partition), and peak RSS (VmHWM, reset before each variant). Beside them: topology/memory.py's
model_state_bytes for the same parameters, as the planner plans them (bf16 mixed precision:
2 + 2 + 12 bytes per parameter) and restated for this fp32 run (4-byte weights and gradients;
ZeRO-0's fp32 weights are their own master copy, so 8 bytes of moments). Writes
benchmarks/results/memory.json and memory.csv.
"""
from __future__ import annotations

import argparse
import csv
import sys

from hybridpar.topology.memory import model_state_bytes
from hybridpar.topology.models import ModelSpec
from hybridpar.topology.software import HYBRIDPAR

from hybridpar.benchmarks import _dist
from hybridpar.benchmarks._cli import BenchParser, int_list, positive_float
from hybridpar.benchmarks._jobs import Layout, make_job, make_plan
from hybridpar.benchmarks.results_io import RESULTS_DIR, replacing, write_result

MODEL = ModelSpec(layers=4, hidden=256, ffn_hidden=704, heads=4, kv_heads=2, vocab=8192, name="mem-7m")
MB = 1024 * 1024
SEQ, GLOBAL_BATCH, MICRO = 64, 8, 1
DP_SIZES = (1, 2, 4, 8)  # the global batch of 8 sequences, micro-batch 1, splits evenly over these
ZEROS = (0, 1, 2)  # ZeRO-3 is not part of hybridpar's runtime


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def measure(job) -> dict:
    """Per-rank state bytes of a Job; gradients are captured at the end of the backward."""
    import torch

    params = [p for c in job.chunks for p in c.parameters()]
    seen = {}
    original_finish = job.engine.finish_grad_reduction

    def finish_grad_reduction():
        # At the end of the backward a gradient is either still in p.grad or in the buffer of its
        # DP reduction (grad_sync.py), in flight: count both.
        sync = job.engine.grad_sync
        in_flight = [buffer for works in (sync._work if sync else []) for _, buffer in works]
        seen["grads"] = _tensor_bytes(p.grad for p in params) + _tensor_bytes(in_flight)
        return original_finish()

    job.engine.finish_grad_reduction = finish_grad_reduction
    job.train_step(1)
    job.train_step(2)
    ds_opt = job.engine.engine.optimizer
    inner = getattr(ds_opt, "optimizer", ds_opt)
    moments = _tensor_bytes(v for s in inner.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    master = _tensor_bytes(getattr(ds_opt, "single_partition_of_fp32_groups", []) or [])
    partitions = _tensor_bytes(t for g in (getattr(ds_opt, "averaged_gradients", None) or {}).values() for t in (g or []))
    buckets = 0
    for bucket in getattr(ds_opt, "ipg_buckets", {}).values():
        buckets += _tensor_bytes(getattr(bucket, "buffer", []) or [])
    return {"n_params": sum(p.numel() for p in params), "weights": _tensor_bytes(params), "grads": seen.get("grads", 0),
            "optimizer": moments + master, "optimizer_moments": moments, "optimizer_master": master,
            "reduction_buffers": buckets + partitions, "peak_rss_mb": _status_kb("VmHWM") / 1024,
            "rss_mb": _status_kb("VmRSS") / 1024}


def worker(out: str, dp: int, zeros: list[int]) -> None:
    import gc

    import torch.distributed as dist

    from hybridpar.launch.local import init_distributed

    _dist.quiet_worker_env()
    init_distributed()
    results = {}
    for z in zeros:
        gc.collect()
        _reset_peak_rss()
        base = _status_kb("VmRSS") / 1024
        plan = make_plan(Layout(f"dp{dp}_z{z}", dp=dp, zero=z), model=MODEL, seq_len=SEQ,
                         global_batch=GLOBAL_BATCH, micro_batch=MICRO)
        job = make_job(plan)
        row = measure(job)
        row["rss_before_mb"] = base
        job.close()
        del job
        rows = [None] * dist.get_world_size()
        dist.all_gather_object(rows, row)
        results[z] = rows
    _dist.finish_worker(out, results)


def planner_rows(n: float, dp: int, z: int) -> dict:
    # bf16 mixed precision, as planned for hybridpar (fp32 gradients; its ZeRO-2 keeps them whole)
    w, g, o = model_state_bytes(n, dp, z, fp32_grads=HYBRIDPAR.fp32_grads, zero2_reduce_once=HYBRIDPAR.zero2_reduce_once)
    grads_fp32 = g if HYBRIDPAR.fp32_grads else 2 * g
    fp32 = {"weights": 2 * w, "grads": grads_fp32, "optimizer": (8 * n if z == 0 else o)}
    return {"planner_bf16": {"weights": w, "grads": g, "optimizer": o}, "planner_fp32": fp32}


def main(argv=None) -> int:
    p = BenchParser("memory", description=__doc__.splitlines()[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--dp", default="1,2,4,8", help="DP sizes, one launch each: 1, 2, 4 and/or 8")
    p.add_argument("--zero", default="0,1,2", help="ZeRO stages: 0, 1 and/or 2")
    p.add_argument("--timeout", type=positive_float, default=900, help="seconds allowed per launch")
    args = p.parse_args(argv)
    dps = int_list(p, "--dp", args.dp, allowed=DP_SIZES,
                   hint=f"the global batch of {GLOBAL_BATCH} sequences, micro-batch {MICRO}, must split evenly over DP")
    zeros = int_list(p, "--zero", args.zero, allowed=ZEROS, hint="ZeRO-3 is not part of hybridpar's runtime")
    if args.worker:
        worker(args.worker, dps[0], zeros)
        return 0
    load, rows = _dist.loadavg(), []
    for dp in dps:
        raw = _dist.torchrun("hybridpar.benchmarks.memory", dp, ["--dp", str(dp), "--zero", args.zero], args.timeout)
        for z in zeros:
            r0 = raw[str(z)][0]
            model = planner_rows(r0["n_params"], dp, z)
            rows.append({"dp": dp, "zero": z, **{k: r0[k] for k in ("n_params", "weights", "grads", "optimizer",
                                                                  "optimizer_moments", "optimizer_master",
                                                                  "reduction_buffers", "peak_rss_mb", "rss_before_mb")},
                         "optimizer_per_rank_all": [r["optimizer"] for r in raw[str(z)]],
                         "peak_rss_mb_all": [round(r["peak_rss_mb"], 1) for r in raw[str(z)]], **model})
    print(f"{'dp':>2} {'zero':>4} {'weights MB':>10} {'grads MB':>9} {'optim MB':>9} {'model fp32 optim':>16} "
          f"{'model bf16 optim':>16} {'optim x dp / n':>14} {'peak RSS MB':>11}")
    for r in rows:
        print(f"{r['dp']:>2} {r['zero']:>4} {r['weights'] / MB:>10.2f} {r['grads'] / MB:>9.2f} {r['optimizer'] / MB:>9.2f} "
              f"{r['planner_fp32']['optimizer'] / MB:>16.2f} {r['planner_bf16']['optimizer'] / MB:>16.2f} "
              f"{r['optimizer'] * r['dp'] / r['n_params']:>14.2f} {r['peak_rss_mb']:>11.0f}")
    write_result("memory", {"model": MODEL.to_dict(), "dtype": "fp32", "load_average": load, "rows": rows},
                 command=("hybridpar bench memory " + " ".join(argv or [])).strip())
    with replacing(RESULTS_DIR / "memory.csv", newline="") as f:
        w = csv.writer(f)
        w.writerow(["dp", "zero", "n_params", "weights", "grads", "optimizer", "planner_fp32_optimizer",
                    "planner_bf16_optimizer", "peak_rss_mb"])
        for r in rows:
            w.writerow([r["dp"], r["zero"], r["n_params"], r["weights"], r["grads"], r["optimizer"],
                        r["planner_fp32"]["optimizer"], r["planner_bf16"]["optimizer"], round(r["peak_rss_mb"], 1)])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
