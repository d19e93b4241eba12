"""Launching ``hybridpar train`` runs from the benchmarks that kill, stop and resume them (soak,
replica_soak, failure_cost): the command, its environment, a wall-clock limit that counts as a
hang, and what the run left in its metrics. Not a benchmark itself."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hybridpar.benchmarks._dist import ROOT

TINY = ROOT / "recipes" / "tiny.yaml"


def train_command(run_dir: Path, *flags: str, recipe: Path = TINY, nproc: int = 8) -> list[str]:
    return [sys.executable, "-m", "hybridpar", "train", "--recipe", str(recipe), "--nproc", str(nproc),
            "--out", str(run_dir), *flags]


def run_env(fault: str | None) -> dict:
    """The benchmark's environment for a run: one thread a rank, only the given fault injected."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for key in ("RANK", "WORLD_SIZE", "HYBRIDPAR_FAULT"):
        env.pop(key, None)
    if fault:
        env["HYBRIDPAR_FAULT"] = fault
    return env


@dataclass
class Finished:
    exit_code: int | None  # None: killed after its limit (hung)
    stdout: str
    stderr: str
    wall_s: float
    ended: float  # unix time

    @property
    def hung(self) -> bool:
        return self.exit_code is None


def run(cmd: list[str], fault: str | None, limit_s: float, run_dir: Path) -> Finished:
    """Run to the end, or kill the launcher and its ranks after ``limit_s``; stdout and stderr
    are kept in ``run_dir``."""
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=run_env(fault), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return finish(proc, start, limit_s, run_dir)


def finish(proc: subprocess.Popen, start: float, limit_s: float, run_dir: Path) -> Finished:
    try:
        out, err = proc.communicate(timeout=max(limit_s - (time.time() - start), 1))
        code = proc.returncode
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)  # the ranks run in their own sessions: kill them by ancestry
        out, err = proc.communicate()
        code = None
    wall = time.time() - start
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "stdout.txt").write_text(out)
    (run_dir / "stderr.txt").write_text(err)
    return Finished(code, out, err, wall, start + wall)


def kill_tree(pid: int) -> None:
    import psutil

    root = psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def metrics(run_dir: Path) -> list[dict]:
    """Every row of the run's metrics.jsonl, in the order written (none if it wrote none)."""
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics(run_dir)}
