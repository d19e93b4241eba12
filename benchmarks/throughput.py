"""throughput: tiny recipe tokens/s for DP = 1, 2, 4, 8 ranks on this machine (CPU, gloo, fp32).

`hybridpar bench throughput [--dp 1,2,4,8] [--steps 12] [--warmup 3]`: one launch per DP size,
the tiny recipe's model and batch (recipes/tiny.yaml: 4 layers, hidden 64, global batch 16 x 32
tokens, micro-batch 2) laid out as pure DP with ZeRO-1, so the global batch is the same at every
size (strong scaling). Reports the median step time and tokens/s, speed-up and efficiency vs
DP = 1, and each rank's CPU seconds per step (process time) against the wall time: with more
ranks than cores, ranks wait for a core, and the sum of CPU time over ranks shows how much work
there was to do. Writes benchmarks/results/throughput.json.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from hybridpar.benchmarks import _dist
from hybridpar.benchmarks._cli import BenchParser, int_list, nonnegative_int, positive_int
from hybridpar.benchmarks._jobs import Layout, make_job, make_plan
from hybridpar.benchmarks.results_io import write_result

GLOBAL_BATCH, SEQ, MICRO = 16, 32, 2
DP_SIZES = (1, 2, 4, 8)  # the 8 micro-batches of 2 sequences split evenly over these


def worker(out: str, dp: int, steps: int, warmup: int) -> None:
    import torch.distributed as dist

    from hybridpar.launch.local import init_distributed

    _dist.quiet_worker_env()
    init_distributed()
    job = make_job(make_plan(Layout(f"dp{dp}_z1", dp=dp, zero=1), seq_len=SEQ, global_batch=GLOBAL_BATCH,
                             micro_batch=MICRO), steps=warmup + steps)
    walls, cpus = [], []
    for step in range(1, warmup + steps + 1):
        dist.barrier()
        w0, c0 = time.perf_counter(), time.process_time()
        job.train_step(step)
        dist.barrier()
        if step > warmup:
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"wall": walls, "cpu": cpus})
    job.close()
    _dist.finish_worker(out, gathered)


def main(argv=None) -> int:
    p = BenchParser("throughput", description=__doc__.splitlines()[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--dp", default="1,2,4,8", help="DP sizes, one launch each: 1, 2, 4 and/or 8")
    p.add_argument("--steps", type=positive_int, default=12, help="timed steps per launch")
    p.add_argument("--warmup", type=nonnegative_int, default=3, help="untimed steps before them")
    _dist.add_quiet_machine_options(p, timeout_s=900)
    args = p.parse_args(argv)
    dps = int_list(p, "--dp", args.dp, allowed=DP_SIZES,
                   hint=f"the global batch of {GLOBAL_BATCH} sequences, micro-batch {MICRO}, must split evenly over DP")
    if args.worker:
        worker(args.worker, dps[0], args.steps, args.warmup)
        return 0
    rows = []
    for dp in dps:
        load = _dist.wait_for_quiet(args.max_load, args.max_wait)
        raw = _dist.torchrun("hybridpar.benchmarks.throughput", dp, ["--dp", str(dp), "--steps", str(args.steps),
                                                          "--warmup", str(args.warmup)], args.timeout)
        wall = _dist.spread(raw[0]["wall"])
        cpu_per_rank = [_dist.spread(r["cpu"])["median"] for r in raw]
        rows.append({"dp": dp, "step_time_s": {k: round(v, 5) for k, v in wall.items()},
                     "tokens_per_s": GLOBAL_BATCH * SEQ / wall["median"],
                     "cpu_s_per_step_per_rank": [round(c, 5) for c in cpu_per_rank],
                     "cpu_s_per_step_all_ranks": round(sum(cpu_per_rank), 5),
                     "cpu_busy_fraction": round(sum(cpu_per_rank) / (wall["median"] * min(dp, os.cpu_count() or 1)), 3),
                     "load": load, "load_after": _dist.loadavg()})
    base = rows[0]["tokens_per_s"] if rows and rows[0]["dp"] == 1 else None
    print(f"{'dp':>2} {'step ms':>8} {'IQR ms':>15} {'tokens/s':>9} {'speed-up':>8} {'eff.':>5} {'CPU s/step (all ranks)':>22} {'load':>5}")
    for r in rows:
        r["speedup"] = round(r["tokens_per_s"] / base, 3) if base else None
        r["efficiency"] = round(r["speedup"] / r["dp"], 3) if base else None
        st = r["step_time_s"]
        print(f"{r['dp']:>2} {st['median'] * 1e3:>8.1f} {st['q1'] * 1e3:>7.1f}-{st['q3'] * 1e3:<7.1f} {r['tokens_per_s']:>9,.0f} "
              f"{r['speedup'] or 0:>8.2f} {r['efficiency'] or 0:>5.2f} {r['cpu_s_per_step_all_ranks']:>22.3f} "
              f"{r['load']['load_when_started'][0]:>5.1f}")
    write_result("throughput", {"recipe": "tiny (pure DP, ZeRO-1)", "global_batch": GLOBAL_BATCH, "seq_len": SEQ,
                                "micro_batch": MICRO, "cores": os.cpu_count(), "rows": rows},
                 command=("hybridpar bench throughput " + " ".join(argv or [])).strip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
