"""async_save: step time with a checkpoint every few steps, saved in the background against saved in place.

`hybridpar bench async_save [--nproc 2] [--rounds 3] [--steps 8] [--save-every 2]`: one launch of
``--nproc`` CPU ranks (DP, ZeRO-1) training a ~50M-parameter Llama-style model (8 layers, hidden
768, each rank's checkpoint file ~300 MB: fp32 weights and both AdamW moments of its half) through
hybridpar's own Job and Checkpointer. Each round trains ``--steps`` steps three ways, in turn:
no saves, a save every ``--save-every`` steps written in place (the step waits for the file), and
the same saves written on a thread while the next steps train (checkpoint/hook.py). The wall time of
every step, hooks included, is recorded; the result is the median per mode over all rounds, and
the ratio to the no-save steps. Writes benchmarks/results/async_save.json.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time

from hybridpar.benchmarks._cli import BenchParser, positive_int
from hybridpar.benchmarks._dist import finish_worker, torchrun
from hybridpar.benchmarks.results_io import write_result

MODES = ("none", "sync", "async")


def _model():
    from hybridpar.topology.models import ModelSpec

    return ModelSpec(layers=8, hidden=768, ffn_hidden=2048, heads=12, kv_heads=4, vocab=320, name="bench-50m")


def worker(out: str, rounds: int, steps: int, save_every: int) -> None:
    import torch.distributed as dist

    from hybridpar.checkpoint.hook import CheckpointConfig, Checkpointer
    from hybridpar.data import SyntheticTokens
    from hybridpar.config.optim import OptimConfig
    from hybridpar.launch.local import init_distributed
    from hybridpar.runtime.job import Job
    from hybridpar.topology.plan import Plan

    init_distributed()
    world = dist.get_world_size()
    plan = Plan(model=_model(), seq_len=128, global_batch=4 * world, dp=world, micro_batch=2, zero_stage=1,
                precision="fp32")
    total = 2 + rounds * len(MODES) * steps
    job = Job(plan, OptimConfig(lr=1e-4, total_steps=total), SyntheticTokens(128, 4 * world, 320, seed=0))
    times = {m: [] for m in MODES}
    step = 0
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(2):  # warm-up
            step += 1
            job.train_step(step)
        for r in range(rounds):
            for mode in MODES:
                hook = None
                if mode != "none":
                    box = [tempfile.mkdtemp(dir=tmp) if dist.get_rank() == 0 else None]
                    dist.broadcast_object_list(box)
                    hook = Checkpointer(CheckpointConfig(save_dir=box[0], save_every=save_every,
                                                         background=mode == "async"), last_step=total, print_fn=None)
                for _ in range(steps):
                    step += 1
                    start = time.perf_counter()
                    m = job.train_step(step, save_written=hook.save_written if hook else None)
                    if hook:
                        hook.on_step(job, m)
                    times[mode].append(time.perf_counter() - start)
                if hook:
                    hook.flush(job)  # not timed: the round's last save, so the next round starts clean
        params = sum(p.numel() for c in job.chunks for p in c.parameters())
    job.close()
    finish_worker(out, {"times": times, "params": params})


def main(argv=None) -> int:
    p = BenchParser("async_save", description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=positive_int, default=2)
    p.add_argument("--rounds", type=positive_int, default=3)
    p.add_argument("--steps", type=positive_int, default=8, help="steps per mode per round")
    p.add_argument("--save-every", type=positive_int, default=2)
    p.add_argument("--worker", help=argparse_suppress())
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.rounds, args.steps, args.save_every)
        return 0
    result = torchrun("hybridpar.benchmarks.async_save", args.nproc,
                      ["--rounds", str(args.rounds), "--steps", str(args.steps), "--save-every", str(args.save_every)],
                      timeout_s=3600)
    medians = {m: statistics.median(t) for m, t in result["times"].items()}
    summary = {"median_step_s": medians, "params": result["params"], "vs_no_save": {m: medians[m] / medians["none"] for m in MODES},
               "save_every": args.save_every, "steps_per_mode_per_round": args.steps, "rounds": args.rounds,
               "nproc": args.nproc, "model": _model().to_dict(), "times": result["times"]}
    for m in MODES:
        print(f"{m:>6}: median step {medians[m]:.3f} s ({medians[m] / medians['none']:.2f}x no saves)")
    write_result("async_save", summary, command=("hybridpar bench async_save " + " ".join(argv or [])).strip())
    return 0


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
