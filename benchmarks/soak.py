"""Soak: tiny recipe on 8 CPU ranks, checkpoints every 50 steps, a rank SIGKILLed or the job SIGTERMed, and resumed, every 200.

    .venv/bin/python -m hybridpar.benchmarks.soak [--steps 1000] [--save-every 50] [--kill-every 200] [--nproc 8]
    .venv/bin/hybridpar bench soak --steps 400 --kill-every 100      # a shorter configuration

Two runs of the same recipe and --steps: an uninterrupted reference, and the soak run, which is
launched in segments. Each segment but the last ends with one fault, in turn: a rank SIGKILLed
in the middle of a step (after the forward of a micro-batch, through HYBRIDPAR_FAULT,
hybridpar/reliability/faults.py), a rank SIGKILLed while the checkpoint is being written (in the background),
and SIGTERM to the launcher as a cluster's preemption sends it (the ranks save that step and stop,
exit 143); the next segment resumes with --resume auto (the latest complete checkpoint). Checks:
no segment hangs (each has a wall-clock limit), every killed segment names the killed rank, every
SIGTERMed one stops cleanly with exit 143, no step is lost
(steps 1..N all trained), a step trained twice gives the same loss both times, and every loss,
the final one included, equals the uninterrupted run's. Writes benchmarks/results/soak.json.
"""
from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hybridpar.benchmarks import _runs
from hybridpar.benchmarks._cli import BenchParser, positive_int, result_name
from hybridpar.benchmarks.results_io import write_result

LAUNCH_S = 120  # allowance per launch (imports, engine start) before "no progress" counts as a hang
STEP_S = 10  # allowance per step on a loaded 2-core machine
NPROC = 8  # recipes/tiny.yaml is laid out as TP2 x PP2 x DP2


SIGTERM_AT = "sigterm-at-step"  # not an injected fault: the soak sends SIGTERM to the launcher itself


def _sigterm_when(proc: subprocess.Popen, run_dir: Path, step: int, limit_s: float) -> None:
    """SIGTERM to the launcher once ``step`` is in the run's metrics (a cluster's preemption)."""
    deadline = time.time() + limit_s
    while time.time() < deadline and proc.poll() is None:
        if max(_runs.losses(run_dir), default=0) >= step:
            proc.send_signal(signal.SIGTERM)
            return
        time.sleep(0.05)


def launch(args, run_dir: Path, fault: str | None, resume: bool, steps_left: int) -> dict:
    flags = ["--steps", str(args.steps), "--timeout-s", str(args.timeout_s)]
    if args.save_dir:
        flags += ["--save-dir", args.save_dir, "--save-every", str(args.save_every)]
        if resume:
            flags += ["--resume", "auto"]
    limit = LAUNCH_S + STEP_S * steps_left
    start = time.time()
    injected = fault if fault and not fault.startswith(SIGTERM_AT) else None
    proc = subprocess.Popen(_runs.train_command(run_dir, *flags, nproc=args.nproc), cwd=_runs.ROOT,
                            env=_runs.run_env(injected), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if fault and fault.startswith(SIGTERM_AT):
        _sigterm_when(proc, run_dir, int(fault.split("=")[1]), limit)
    done = _runs.finish(proc, start, limit, run_dir)
    out, err = done.stdout, done.stderr
    record = {"fault": fault, "exit_code": done.exit_code, "hung": done.hung, "wall_s": round(done.wall_s, 1),
              "steps": sorted(_runs.losses(run_dir))}
    resumed = re.search(r"resuming from \S+ \(step (\d+)", out)
    record["resumed_from"] = int(resumed.group(1)) if resumed else None
    stopped = [l for l in err.splitlines() if l.startswith("hybridpar train: stopped at step")]
    record["stopped"] = stopped[0] if stopped else None
    kill = re.search(r"SIGKILL to pid (\d+) \(at unix time ([0-9.]+)\)", err)
    if kill:
        record["fail_fast_s"] = round(done.ended - float(kill.group(2)), 2)
        summary = [l for l in err.splitlines() if l.startswith("hybridpar: rank ")]
        record["summary"] = summary[0] if summary else None
    return record


def fault_for(i: int, args) -> tuple[str, int, int | None]:
    """The i-th fault (i = 1, 2, ...): (HYBRIDPAR_FAULT value or the SIGTERM marker, step, rank)."""
    rank = (3 * i + 2) % args.nproc
    off_checkpoint = i * args.kill_every + 1 + (17 * i) % max(args.save_every - 1, 1)
    if i % 3 == 1:  # mid-step, somewhere between two checkpoints
        return f"kill-in-step:rank={rank}:step={off_checkpoint}:micro={1 + i % 2}", off_checkpoint, rank
    if i % 3 == 2:  # a multiple of save_every: killed while writing that checkpoint
        step = i * args.kill_every
        return f"kill-in-save:rank={rank}:step={step}", step, rank
    return f"{SIGTERM_AT}={off_checkpoint}", off_checkpoint, None  # preempted between two checkpoints


def soak(args, work: Path) -> dict:
    args.save_dir = str(work / "ckpt")
    segments, i = [], 1
    while True:
        fault, step, rank = fault_for(i, args) if i * args.kill_every < args.steps else (None, None, None)
        # From the checkpoint before the previous kill to the next kill (or the end).
        span = (step or args.steps) - max((i - 1) * args.kill_every - args.save_every, 0)
        seg = launch(args, work / f"segment-{i}", fault, resume=i > 1, steps_left=span)
        seg.update(kill_step=step, kill_rank=rank)
        segments.append(seg)
        print(f"soak: segment {i}: {json.dumps(seg)}", flush=True)
        if fault is None or seg["hung"] or seg["exit_code"] == 0:
            break
        i += 1
    return {"segments": segments}


def check(args, segments: list[dict], work: Path, reference: dict[int, float]) -> dict:
    attempts: dict[int, list[float]] = {}
    for k in range(1, len(segments) + 1):
        for step, loss in _runs.losses(work / f"segment-{k}").items():
            attempts.setdefault(step, []).append(loss)
    expected = list(range(1, args.steps + 1))
    problems = []
    if any(s["hung"] for s in segments):
        problems.append("a segment hung")
    for s in segments[:-1]:
        if s["kill_rank"] is None:  # SIGTERMed: a clean stop that saved its step
            if s["exit_code"] != 143 or not s.get("stopped") or "by SIGTERM; saved" not in s["stopped"]:
                problems.append(f"segment with {s['fault']} did not stop cleanly (exit {s['exit_code']}): {s.get('stopped')}")
        elif not s.get("summary") or f"rank {s['kill_rank']} " not in s["summary"] or s["exit_code"] in (0, None):
            problems.append(f"segment with {s['fault']} did not fail naming rank {s['kill_rank']}: {s.get('summary')}")
    if segments[-1]["exit_code"] != 0:
        problems.append(f"the last segment exited {segments[-1]['exit_code']}")
    lost = sorted(set(expected) - set(attempts))
    if lost:
        problems.append(f"steps never trained: {lost[:10]}")
    unequal_replays = sorted(s for s, v in attempts.items() if len(set(v)) > 1)
    if unequal_replays:
        problems.append(f"steps whose re-run gave another loss: {unequal_replays[:10]}")
    final = {s: v[-1] for s, v in attempts.items()}
    diffs = {s: abs(final[s] - reference[s]) for s in expected if s in final and s in reference}
    if any(diffs.values()) or len(diffs) != len(expected):
        problems.append(f"losses differ from the uninterrupted run (max {max(diffs.values(), default=None)})")
    return {
        "ok": not problems, "problems": problems,
        "steps_trained_twice": sum(len(v) - 1 for v in attempts.values()),
        "max_abs_loss_diff_vs_uninterrupted": max(diffs.values(), default=None),
        "final_loss": final.get(args.steps), "final_loss_uninterrupted": reference.get(args.steps),
        "fail_fast_s": [s.get("fail_fast_s") for s in segments[:-1]],
    }


def main(argv=None) -> int:
    parser = BenchParser("soak", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=1000)
    parser.add_argument("--save-every", type=positive_int, default=50)
    parser.add_argument("--kill-every", type=positive_int, default=200, help="a multiple of --save-every, below --steps")
    parser.add_argument("--nproc", type=positive_int, default=NPROC, help=f"ranks: {NPROC} (the recipe's TP2 x PP2 x DP2)")
    parser.add_argument("--timeout-s", type=positive_int, default=60, help="process-group timeout of the runs")
    parser.add_argument("--work", help="working directory (default: a temporary one, removed afterwards)")
    parser.add_argument("--name", type=result_name, default="soak", help="result file name in benchmarks/results/")
    args = parser.parse_args(argv)
    if args.nproc != NPROC:
        parser.error(f"--nproc {args.nproc}: use {NPROC}; recipes/tiny.yaml is laid out as TP2 x PP2 x DP2 = 8 ranks")
    if args.kill_every % args.save_every:
        parser.error(f"--kill-every {args.kill_every} must be a multiple of --save-every {args.save_every} "
                     f"(a rank is killed while a checkpoint is written), e.g. --kill-every {4 * args.save_every}")
    if args.kill_every >= args.steps:
        parser.error(f"--kill-every {args.kill_every} must be below --steps {args.steps}, or no rank is ever killed; "
                     f"give more --steps or a smaller --kill-every")
    if args.work and Path(args.work).exists() and not Path(args.work).is_dir():
        parser.error(f"--work {args.work}: exists and is not a directory; give a directory or a new path")
    work = Path(args.work or tempfile.mkdtemp(prefix="hybridpar-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    result = soak(args, work)
    soak_s = time.time() - started
    args.save_dir = None
    ref_start = time.time()
    ref = launch(args, work / "uninterrupted", None, resume=False, steps_left=args.steps)
    ref_s = time.time() - ref_start
    verdict = check(args, result["segments"], work, _runs.losses(work / "uninterrupted"))
    payload = {
        "config": {"recipe": "recipes/tiny.yaml", "layout": "TP2 x PP2 x DP2", "steps": args.steps,
                   "save_every": args.save_every, "kill_every": args.kill_every, "nproc": args.nproc,
                   "timeout_s": args.timeout_s},
        **verdict, "soak_wall_s": round(soak_s, 1), "uninterrupted_wall_s": round(ref_s, 1),
        "uninterrupted_exit_code": ref["exit_code"], "segments": result["segments"],
    }
    for seg in payload["segments"]:
        seg["steps"] = [seg["steps"][0], seg["steps"][-1]] if seg["steps"] else []
    path = write_result(args.name, payload)
    print(f"soak: {'OK' if verdict['ok'] else 'FAILED'}: {json.dumps(verdict)}; wrote {path}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if verdict["ok"] and ref["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
