"""Replica soak: a long run loses whole DP replicas at random steps and takes them back; no hang, no step lost.

    .venv/bin/hybridpar bench replica_soak [--steps 500] [--kills 8] [--seed 0] [--rejoin-after-s 1]

One run of recipes/tiny.yaml on 8 CPU ranks laid out TP2 x DP4 with ZeRO-1 and
--tolerate-replica-loss. HYBRIDPAR_FAULT (hybridpar/reliability/faults.py) holds --kills SIGKILLs
drawn from --seed: one in each of --kills equal windows of the run, of a random rank, either in the
middle of a step (after the forward of micro-batch 1-3) or right after one. The launcher starts a
lost replica again after --rejoin-after-s seconds and it is taken back in at the first step
boundary after it is ready, from its peers' memory. A kill aimed at a rank whose replica is out at
that step does not fire (reported). Then the same run without faults, and a fault-free run on 3
replicas (6 ranks).

Checks: exit 0 within the wall-clock limit; steps 1..N each logged once; one "lost" line per fired
kill, naming the killed rank's replica; every lost replica taken back in, but for one lost in the
last 40 steps. Reported, not checked: the losses against the fault-free run. A different number of
replicas sums the gradients in another order, so the two agree to rounding at first, and training
amplifies rounding differences step by step; the 3-replica fault-free run against the 4-replica one
shows how far the number of replicas alone moves the losses. Writes
benchmarks/results/replica_soak.json.
"""
from __future__ import annotations

import random
import re
import sys
import tempfile
import time
from pathlib import Path

from hybridpar.benchmarks import _runs
from hybridpar.benchmarks._cli import BenchParser, positive_int, result_name
from hybridpar.benchmarks.results_io import write_result

LAYOUT = ["--tp", "2", "--pp", "1", "--dp", "4", "--zero", "1", "--global-batch", "24", "--micro-batch", "2"]
REPLICA = 2  # ranks per replica (TP2)
NPROC = 8
LAUNCH_S, STEP_S, LOSS_S = 180, 3, 120  # wall-clock allowances on a loaded 2-core machine


def schedule(steps: int, kills: int, seed: int) -> list[tuple[str, int, int]]:
    """(fault, step, rank) for each kill: one per window of the run, away from its ends."""
    rng = random.Random(seed)
    first, last = 10, steps - 10
    width = (last - first) / kills
    out = []
    for i in range(kills):
        lo = int(first + i * width + width / 4)
        step = rng.randint(lo, max(lo, int(first + i * width + 3 * width / 4)))
        rank = rng.randrange(NPROC)
        if rng.random() < 0.5:
            out.append((f"kill-in-step:rank={rank}:step={step}:micro={rng.randint(1, 3)}", step, rank))
        else:
            out.append((f"kill-after-step:rank={rank}:step={step}", step, rank))
    return out


def fired(stderr: str) -> list[int]:
    """The ranks whose injected SIGKILL fired, in order."""
    return [int(m.group(1)) for m in re.finditer(r"hybridpar fault injection: rank (\d+): .*SIGKILL to pid", stderr)]


def max_diff(a: dict[int, float], b: dict[int, float]) -> float | None:
    return max((abs(a[s] - b[s]) for s in a if s in b), default=None)


def verdict(run: _runs.Finished, rows: list[dict], steps: int, reference: dict[int, float]) -> dict:
    lost = [l for l in run.stdout.splitlines() if l.startswith("hybridpar train: replica") and " lost " in l]
    rejoined = [l for l in run.stdout.splitlines() if l.startswith("hybridpar train: replica rejoined")]
    killed = fired(run.stderr)
    problems = []
    if run.hung:
        problems.append("the run hung (killed at its wall-clock limit)")
    elif run.exit_code != 0:
        problems.append(f"the run exited {run.exit_code}")
    logged = [r["step"] for r in rows]
    if logged != list(range(1, steps + 1)):
        twice = sorted({s for s in logged if logged.count(s) > 1})
        missing = sorted(set(range(1, steps + 1)) - set(logged))
        problems.append(f"steps not logged exactly once in order: missing {missing[:10]}, twice {twice[:10]}")
    lost_replicas = [int(re.search(r"replica (\d+) ", l).group(1)) for l in lost]
    if lost_replicas != [r // REPLICA for r in killed]:
        problems.append(f"lost replicas {lost_replicas} are not those of the killed ranks {killed}")
    late = sum(1 for l in lost if int(re.search(r" (?:in|after) step (\d+)", l).group(1)) > steps - 40)
    if len(rejoined) < len(lost) - late:
        problems.append(f"{len(lost)} replicas lost, {len(rejoined)} taken back in")
    final = {r["step"]: r["loss"] for r in rows}
    gaps = [float(m.group(1)) for l in lost for m in [re.search(r"begins ([0-9.]+) s after", l)] if m]
    joins = [float(m.group(1)) for l in rejoined for m in [re.search(r"\(([0-9.]+) s\)$", l)] if m]
    return {"ok": not problems, "problems": problems, "kills_fired": len(killed), "replicas_lost": len(lost),
            "replicas_rejoined": len(rejoined), "pause_after_loss_s": gaps, "rejoin_pause_s": joins,
            "max_abs_loss_diff_vs_fault_free": max_diff(final, reference),
            "final_loss": final.get(steps), "final_loss_fault_free": reference.get(steps),
            "lines": lost + rejoined}


def main(argv=None) -> int:
    parser = BenchParser("replica_soak", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=500)
    parser.add_argument("--kills", type=positive_int, default=8, help="SIGKILLs, one in each window of steps/kills")
    parser.add_argument("--seed", type=int, default=0, help="draws the kills' steps, ranks and kinds")
    parser.add_argument("--rejoin-after-s", type=float, default=1.0, help="a lost replica is started again this much later")
    parser.add_argument("--work", help="working directory (default: a temporary one)")
    parser.add_argument("--name", type=result_name, default="replica_soak", help="result file name in benchmarks/results/")
    args = parser.parse_args(argv)
    if args.steps < 20 * args.kills:
        parser.error(f"--steps {args.steps} leaves fewer than 20 steps a kill; give --steps {20 * args.kills} or fewer --kills")
    if not args.rejoin_after_s > 0:
        parser.error(f"--rejoin-after-s {args.rejoin_after_s}: give a positive number of seconds")
    work = Path(args.work or tempfile.mkdtemp(prefix="hybridpar-replica-soak-"))
    if any((work / name).exists() for name in ("soak", "fault-free", "fault-free-dp3")):
        parser.error(f"--work {work}: holds an earlier soak; give a new directory")
    kills = schedule(args.steps, args.kills, args.seed)
    common = [*LAYOUT, "--steps", str(args.steps), "--no-save", "--no-progress", "--timeout-s", "60"]
    limit = LAUNCH_S + STEP_S * args.steps + LOSS_S * args.kills
    started = time.time()
    soak = _runs.run(_runs.train_command(work / "soak", *common, "--tolerate-replica-loss",
                                         "--rejoin-after-s", str(args.rejoin_after_s)),
                     ";".join(f for f, _, _ in kills), limit, work / "soak")
    print(f"replica_soak: soak run exited {soak.exit_code} after {soak.wall_s:.0f} s", flush=True)
    free = _runs.run(_runs.train_command(work / "fault-free", *common), None, LAUNCH_S + STEP_S * args.steps,
                     work / "fault-free")
    dp3 = _runs.run(_runs.train_command(work / "fault-free-dp3", *common, "--dp", "3", nproc=6), None,
                    LAUNCH_S + STEP_S * args.steps, work / "fault-free-dp3")
    result = verdict(soak, _runs.metrics(work / "soak"), args.steps, _runs.losses(work / "fault-free"))
    result["max_abs_loss_diff_dp3_vs_dp4_fault_free"] = max_diff(_runs.losses(work / "fault-free-dp3"),
                                                                 _runs.losses(work / "fault-free"))
    payload = {"config": {"recipe": "recipes/tiny.yaml", "layout": "TP2 x DP4, ZeRO-1, global batch 24",
                          "steps": args.steps, "kills": args.kills, "seed": args.seed,
                          "rejoin_after_s": args.rejoin_after_s, "schedule": [f for f, _, _ in kills]},
               **result, "soak_wall_s": round(soak.wall_s, 1), "fault_free_wall_s": round(free.wall_s, 1),
               "fault_free_exit_code": free.exit_code, "fault_free_dp3_exit_code": dp3.exit_code, "work": str(work), "total_s": round(time.time() - started, 1)}
    path = write_result(args.name, payload)
    shown = {k: v for k, v in result.items() if k != "lines"}
    print(f"replica_soak: {'OK' if result['ok'] else 'FAILED'}: {shown}; wrote {path}")
    return 0 if result["ok"] and free.exit_code == dp3.exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
