"""The replica check compares every rank that holds the same weights, CP peers included.

With context parallelism the CP ranks of a replica hold the same shard of every weight, so the
check gathers over the dp_cp group, not only DP (hybridpar/reliability/replicas.py). One 4-rank
run of the tiny recipe as CP2 x DP2 (ranks 0, 1: DP replica 0, CP 0 and 1; ranks 2, 3: replica
1): rank 1 flips one bit after step 2, and the check after every step must stop the job there
naming rank 1. A DP-only check would compare rank 1 with rank 3 alone, a tie it would blame on
rank 3, the copy without DP rank 0.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_bit_flipped_on_a_cp_peer_stops_the_job_naming_that_rank(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HYBRIDPAR_FAULT="flip:rank=1:step=2")
    for key in ("RANK", "WORLD_SIZE"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "hybridpar", "train", "--recipe", str(ROOT / "recipes" / "tiny.yaml"),
           "--nproc", "4", "--tp", "1", "--pp", "1", "--cp", "2", "--dp", "2", "--steps", "3",
           "--check-replicas", "1", "--on-drift", "stop", "--out", str(tmp_path / "run")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    flipped = re.search(r"rank 1: flipped bit 0 of byte 0 of (\S+) after step 2", proc.stderr)
    assert flipped, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-4000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hybridpar train: error:")]
    assert errors == [
        "hybridpar train: error: replica drift at step 2: rank 1 (DP replica 0, CP rank 1) differs from rank(s) "
        f"0,2,3, which hold the same weights, in {flipped.group(1)}"
    ], proc.stderr[-4000:]
    steps = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 2, proc.stdout[-2000:]  # steps 1 and 2 trained and checked clean until the flip
