"""overhead: hybridpar's step time vs torch DDP (DP only) and a hand-written megatron+DeepSpeed loop (3D).

`hybridpar bench overhead [--worlds 2,4,8] [--rounds 9] [--steps 3] [--warmup 2] [--max-load 1.5]`.
One torchrun launch per world size; in it every variant is built once on the same process
group and they run interleaved (A/B/C, order rotated each round); a round's sample is the mean
of ``--steps`` steps, and after ``--warmup`` discarded rounds the ratio hybridpar / baseline is
taken per round (paired), then the median and spread over rounds. World 2 and 4: DP only,
hybridpar ZeRO 0 and ZeRO 1 vs DDP with the same megatron model (benchmarks/_baselines.py), and
ZeRO 1 once more with the DP reduction after the backward (``overlap_grad_reduce=False``).
World 8: TP2 x PP2 x DP2 ZeRO 1, hybridpar vs megatron's 1F1B schedule + DeepSpeed driven by
hand. Rank 0 also profiles (cProfile) a few steps of each variant and reports where hybridpar's
extra time goes. Model: tiny (4 layers, hidden 64), fp32, global batch 16 x 32 tokens,
micro-batch 2. Writes benchmarks/results/overhead.json.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

from hybridpar.benchmarks import _dist
from hybridpar.benchmarks._cli import BenchParser, check_fits_in_memory, int_list, nonnegative_int, positive_int
from hybridpar.benchmarks._jobs import Layout, make_job, make_plan
from hybridpar.benchmarks.results_io import write_result

TARGET = {"ddp": 1.10, "hand": 1.05}
WORLDS = (2, 4, 8)  # 2 and 4: DP only (vs DDP); 8: TP2 x PP2 x DP2 (vs megatron + DeepSpeed by hand)
PROFILED = ("forward_backward", "step", "_global_loss", "replica_batches", "zero_grad",
            "finalize_model_parallel_grads", "lr_at", "allreduce_gradients", "clip_grad_norm_")


def variant_layouts(world: int) -> list[Layout]:
    """World 8: TP2 x PP2 x DP2 ZeRO 1; world 2 or 4: DP only, ZeRO 0 and ZeRO 1."""
    if world == 8:
        return [Layout("tp2_pp2_dp2_z1", tp=2, pp=2, dp=2, zero=1)]
    return [Layout(f"dp{world}_z0", dp=world, zero=0), Layout(f"dp{world}_z1", dp=world, zero=1)]


def build_variants(world: int, steps: int, model: str = "tiny") -> dict:
    from hybridpar.benchmarks._baselines import DDPLoop, HandLoop

    layouts = variant_layouts(world)
    if world == 8:
        job = make_job(make_plan(layouts[0], model=model), steps=steps)
        return {"hybridpar_z1": job.train_step, "hand": HandLoop(job).step}
    z0 = make_job(make_plan(layouts[0], model=model), steps=steps)
    z1_plan = make_plan(layouts[1], model=model)
    z1 = make_job(z1_plan, steps=steps)
    # The same ZeRO-1 job with the DP reduction left to DeepSpeed after the backward (no grad_sync).
    z1_after = make_job(z1_plan, steps=steps, overlap_grad_reduce=False)
    return {"hybridpar_z0": z0.train_step, "hybridpar_z1": z1.train_step,
            "hybridpar_z1_after_backward": z1_after.train_step, "ddp": DDPLoop(z1).step}


def profile(fn, first_step: int, n: int) -> dict:
    prof = cProfile.Profile()
    prof.enable()
    for i in range(n):
        fn(first_step + i)
    prof.disable()
    stats = pstats.Stats(prof).stats
    out = {"total_s": sum(v[2] for v in stats.values()) / n}
    for (path, _, func), (_, _, tt, ct, _) in stats.items():
        if func in PROFILED and ("hybridpar" in path or "deepspeed/runtime/engine" in path or "torch/nn/utils" in path
                                 or "_baselines" in path):
            key = f"{path.split('site-packages/')[-1].split('/work/main/')[-1]}:{func}"
            out[key] = round(out.get(key, 0.0) + ct / n, 6)
    top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:12]
    out["top_tottime"] = [(f"{k[0].split('site-packages/')[-1]}:{k[2]}", round(v[2] / n, 6)) for k, v in top]
    return out


def worker(out: str, world: int, rounds: int, steps: int, warmup: int, profile_steps: int, model: str) -> None:
    import torch.distributed as dist

    from hybridpar.launch.local import init_distributed

    _dist.quiet_worker_env()
    init_distributed()
    variants = build_variants(world, steps=rounds * steps + 10, model=model)
    names = list(variants)
    times = {n: [] for n in names}
    step = {n: 1 for n in names}
    for r in range(warmup + rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                variants[name](step[name])
                step[name] += 1
            dist.barrier()
            if r >= warmup:
                times[name].append((time.perf_counter() - t0) / steps)
    profiles = {}
    if profile_steps:
        for name in names:
            dist.barrier()
            profiles[name] = profile(variants[name], step[name], profile_steps) if dist.get_rank() == 0 else None
            if dist.get_rank() != 0:
                for i in range(profile_steps):
                    variants[name](step[name] + i)
            step[name] += profile_steps
    _dist.finish_worker(out, {"times": times, "profiles": profiles})


def paired(times: dict, a: str, b: str) -> dict:
    ratios = [x / y for x, y in zip(times[a], times[b])]
    medians = _dist.spread(times[a])["median"] / _dist.spread(times[b])["median"]
    return {"numerator": a, "denominator": b, **{k: round(v, 4) for k, v in _dist.spread(ratios).items() if k != "n"},
            "ratio_of_medians": round(medians, 4), "rounds": len(ratios)}


def main(argv=None) -> int:
    p = BenchParser("overhead", description=__doc__.splitlines()[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--worlds", default="2,4,8", help="world sizes: 2 and 4 (DP only), 8 (TP2 x PP2 x DP2)")
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=positive_int, default=9, help="measured rounds, after the warm-up rounds")
    p.add_argument("--steps", type=positive_int, default=3, help="steps per round")
    p.add_argument("--warmup", type=nonnegative_int, default=2, help="discarded rounds")
    p.add_argument("--profile-steps", type=nonnegative_int, default=5)
    p.add_argument("--model", default="tiny", help="model preset (tiny, tiny-deep, ...); results other than "
                                                    "tiny's go to overhead-<model>.json")
    _dist.add_quiet_machine_options(p, timeout_s=1800)
    args = p.parse_args(argv)
    if args.worker:  # one launch of the driver's: its world size only
        worlds = int_list(p, "--world", str(args.world), allowed=WORLDS)
    else:
        worlds = int_list(p, "--worlds", args.worlds, allowed=WORLDS, hint="2 and 4: DP only; 8: TP2 x PP2 x DP2")
    for world in worlds:
        try:
            for layout in variant_layouts(world):
                make_plan(layout, model=args.model)
        except ValueError as err:
            p.error(f"--model {args.model} at world {world}: {err}")
    # Whole-model copies held at once: every DP replica of each variant (DP only: ZeRO 0, ZeRO 1
    # twice and DDP; world 8: two replicas of hybridpar's job and of the hand loop's).
    check_fits_in_memory(p, args.model, max(4 * w if w != 8 else 2 * 2 for w in worlds))
    if args.worker:
        worker(args.worker, args.world, args.rounds, args.steps, args.warmup, args.profile_steps, args.model)
        return 0
    results = {}
    for world in worlds:
        load = _dist.wait_for_quiet(args.max_load, args.max_wait)
        raw = _dist.torchrun("hybridpar.benchmarks.overhead", world,
                             ["--world", str(world), "--rounds", str(args.rounds), "--steps", str(args.steps),
                              "--warmup", str(args.warmup), "--profile-steps", str(args.profile_steps),
                              "--model", args.model], args.timeout)
        t = raw["times"]
        base = "hand" if world == 8 else "ddp"
        ratios = {n: paired(t, n, base) for n in t if n != base}
        results[str(world)] = {"load": load, "load_after": _dist.loadavg(), "baseline": base, "target": TARGET[base],
                               "step_time_s": {n: {k: round(v, 5) for k, v in _dist.spread(v).items()} for n, v in t.items()},
                               "ratios": ratios, "raw_step_times_s": t, "profiles": raw["profiles"]}
        for n, r in ratios.items():
            ok = "meets" if r["median"] <= TARGET[base] else "misses"
            print(f"world {world}: {n} / {base} = {r['median']:.3f} (paired; IQR {r['q1']:.3f}-{r['q3']:.3f}; "
                  f"ratio of medians {r['ratio_of_medians']:.3f}, "
                  f"{r['rounds']} rounds) {ok} {TARGET[base]:.2f}x; step {_dist.spread(t[n])['median'] * 1e3:.1f} ms vs "
                  f"{_dist.spread(t[base])['median'] * 1e3:.1f} ms; load {load['load_when_started'][0]:.1f}")
    name = "overhead" if args.model == "tiny" else f"overhead-{args.model}"
    write_result(name, {"model": args.model, "dtype": "fp32", "global_batch": 16, "seq_len": 32, "micro_batch": 2,
                              "rounds": args.rounds, "steps_per_round": args.steps, "warmup_rounds": args.warmup,
                              "worlds": results}, command=("hybridpar bench overhead " + " ".join(argv or [])).strip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
