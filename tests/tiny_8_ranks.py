"""One uninterrupted run of the tiny recipe on 8 ranks (TP2 x PP2 x DP2), shared through the
session fixture ``tiny_8_ranks`` (tests/conftest.py): the reference of
tests/integration/test_preemption.py and the 8 ranks of the 8 == 1 check in
tests/integration/test_train_command.py. An 8-rank launch costs ~30 s of start-up on 2 cores."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes" / "tiny.yaml"
STEPS = 14
LAYOUT = ["--nproc", "8", "--tp", "2", "--pp", "2", "--dp", "2"]


def train_command(out: Path, *extra: str) -> list[str]:
    """``hybridpar train`` of the tiny recipe on LAYOUT for STEPS steps (saving only the last)."""
    return [sys.executable, "-m", "hybridpar", "train", "--recipe", str(TINY), *LAYOUT, "--steps", str(STEPS),
            "--out", str(out), "--save-every", "100", "--no-progress", *extra]


def environment() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for key in ("RANK", "WORLD_SIZE"):
        env.pop(key, None)
    return env


def run(out: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(train_command(out), cwd=ROOT, env=environment(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc
