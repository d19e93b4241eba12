"""Failure cost: the time one lost replica costs with --tolerate-replica-loss, against stop-and-restart from the last checkpoint.

    .venv/bin/hybridpar bench failure_cost [--steps 120] [--save-every 40] [--kill-step 61] [--repeats 3]

recipes/tiny.yaml on 8 CPU ranks, TP2 x DP4, ZeRO-1, checkpoints every --save-every steps (in the
background, the default). Each repeat runs, in this order:
- plain: no fault;
- tolerant: no fault, with --tolerate-replica-loss (the per-step snapshot and its DP-ring copy);
- tolerant, killed: rank 5 (replica 2) SIGKILLed in step --kill-step after its second forward;
  the survivors go on, and the replica is started again after 1 s and taken back in;
- restart: the same kill without tolerance. The job stops (every rank, fail fast); a second
  launch resumes from the last checkpoint (--resume auto) and redoes the steps since it. A
  cluster adds its requeue time on top: not counted here.

Time lost per failure = wall time of the run with the failure - wall time of the same kind of
run without one (medians over the repeats), with its parts: the pause between the last step
before the loss and the next step, the pause to take the replica back in, and for the restart
the second launch's start-up and the steps redone. On 2 CPU cores 8 ranks share two cores: a
smaller world runs its steps about as fast, which a GPU cluster would not (there the survivors
run (dp-1)/dp of the throughput until the rejoin); the pauses are what carries over. Writes
benchmarks/results/failure_cost.json.
"""
from __future__ import annotations

import re
import statistics
import sys
import tempfile
from pathlib import Path

from hybridpar.benchmarks import _runs
from hybridpar.benchmarks._cli import BenchParser, positive_int, result_name
from hybridpar.benchmarks.results_io import write_result

LAYOUT = ["--tp", "2", "--pp", "1", "--dp", "4", "--zero", "1", "--global-batch", "24", "--micro-batch", "2"]
KILLED_RANK = 5
LAUNCH_S, STEP_S = 180, 5  # wall-clock allowances before a run counts as hung


def _median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def _step_time(rows: list[dict]) -> float:
    return statistics.median(r["step_time_s"] for r in rows[1:]) if len(rows) > 1 else None


def _checked(run: _runs.Finished, what: str, code: int = 0) -> _runs.Finished:
    if run.exit_code != code:
        raise SystemExit(f"hybridpar bench failure_cost: {what} exited {run.exit_code} (expected {code}); "
                         f"see its stderr.txt")
    return run


def one_repeat(args, work: Path) -> dict:
    common = [*LAYOUT, "--steps", str(args.steps), "--save-every", str(args.save_every), "--no-progress",
              "--timeout-s", "60"]
    kill = f"kill-in-step:rank={KILLED_RANK}:step={args.kill_step}:micro=2"
    limit = LAUNCH_S + STEP_S * args.steps

    def train(name, *flags, fault=None, code=0):
        return _checked(_runs.run(_runs.train_command(work / name, *common, *flags), fault, limit, work / name), name, code)

    plain = train("plain")
    tolerant = train("tolerant", "--tolerate-replica-loss")
    killed = train("tolerant-killed", "--tolerate-replica-loss", "--rejoin-after-s", "1", fault=kill)
    first = _runs.run(_runs.train_command(work / "restart", *common), kill, limit, work / "restart")
    if first.exit_code in (0, None):
        raise SystemExit(f"hybridpar bench failure_cost: the killed run without tolerance exited {first.exit_code}")
    second = train("restart", "--resume", "auto")
    resumed = re.search(r"resuming from \S+ \(step (\d+)", second.stdout)
    lost_line = next(l for l in killed.stdout.splitlines() if " lost " in l)
    join_line = next((l for l in killed.stdout.splitlines() if "replica rejoined" in l), "")
    since = int(resumed.group(1)) if resumed else 0
    second_steps = [r for r in _runs.metrics(work / "restart") if r["step"] > since]  # the second launch's
    killed_at = float(re.search(r"at unix time ([0-9.]+)", first.stderr).group(1))
    rejoined = int(m.group(1)) if (m := re.search(r"after step (\d+)", join_line)) else None
    killed_rows = _runs.metrics(work / "tolerant-killed")
    return {
        "plain_s": plain.wall_s, "tolerant_s": tolerant.wall_s, "tolerant_killed_s": killed.wall_s,
        "restart_s": first.wall_s + second.wall_s,
        "step_s_plain": _step_time(_runs.metrics(work / "plain")),
        "step_s_tolerant": _step_time(_runs.metrics(work / "tolerant")),
        "lost_tolerant_s": killed.wall_s - tolerant.wall_s,
        "lost_restart_s": first.wall_s + second.wall_s - plain.wall_s,
        "pause_after_loss_s": float(re.search(r"begins ([0-9.]+) s after", lost_line).group(1)),
        "rejoin_pause_s": float(m.group(1)) if (m := re.search(r"\(([0-9.]+) s\)$", join_line)) else None,
        "rejoined_after_step": rejoined,
        # the killed run's steps before the loss and after the rejoin: the same world, before and after
        "step_s_before_loss": _step_time([r for r in killed_rows if r["step"] < args.kill_step]),
        "step_s_after_rejoin": _step_time([r for r in killed_rows if rejoined and r["step"] > rejoined]),
        "restart_resumed_from": since,
        "restart_steps_redone": args.kill_step - 1 - since,
        "restart_stop_s": first.ended - killed_at,  # from the SIGKILL to the job's end
        "restart_startup_s": second.wall_s - sum(r["step_time_s"] for r in second_steps),
        "restart_redo_s": sum(r["step_time_s"] for r in second_steps if r["step"] < args.kill_step),
    }


def main(argv=None) -> int:
    parser = BenchParser("failure_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=120)
    parser.add_argument("--save-every", type=positive_int, default=40)
    parser.add_argument("--kill-step", type=positive_int, default=61,
                        help="the step rank 5 dies in (default: half a save interval after a save)")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--work", help="working directory (default: a temporary one)")
    parser.add_argument("--name", type=result_name, default="failure_cost", help="result file name in benchmarks/results/")
    args = parser.parse_args(argv)
    if not args.save_every < args.kill_step < args.steps:
        parser.error(f"--kill-step {args.kill_step} must lie after the first save (--save-every {args.save_every}) "
                     f"and before --steps {args.steps}")
    work = Path(args.work or tempfile.mkdtemp(prefix="hybridpar-failure-cost-"))
    if work.exists() and any(work.iterdir()):
        parser.error(f"--work {work}: not empty; give a new directory")
    repeats = []
    for i in range(args.repeats):
        repeats.append(one_repeat(args, work / f"repeat-{i + 1}"))
        print(f"failure_cost: repeat {i + 1}: {repeats[-1]}", flush=True)
    keys = repeats[0].keys()
    medians = {k: _median([r[k] for r in repeats]) for k in keys}
    lost_t, lost_r = medians["lost_tolerant_s"], medians["lost_restart_s"]
    payload = {"config": {"recipe": "recipes/tiny.yaml", "layout": "TP2 x DP4, ZeRO-1, global batch 24",
                          "steps": args.steps, "save_every": args.save_every, "kill_step": args.kill_step,
                          "killed_rank": KILLED_RANK, "repeats": args.repeats},
               "median": medians, "restart_over_tolerant": round(lost_r / lost_t, 1) if lost_t and lost_t > 0 else None,
               "repeats": repeats, "work": str(work)}
    path = write_result(args.name, payload)
    print(f"failure_cost: time lost per failure, median of {args.repeats}: tolerant {lost_t:.1f} s "
          f"(pause {medians['pause_after_loss_s']} s + rejoin {medians['rejoin_pause_s']} s; steps "
          f"{medians['step_s_before_loss']} s before the loss, {medians['step_s_after_rejoin']} s after the rejoin), "
          f"stop-and-restart {lost_r:.1f} s ({medians['restart_steps_redone']} steps redone); wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
