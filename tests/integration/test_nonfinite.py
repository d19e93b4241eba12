"""A NaN that reaches the loss ends the run (hybridpar/reliability/nonfinite.py): exit 6, one line naming the step,
status.json says why, nothing of that step is logged or saved, every rank ends; with --tolerate-replica-loss it is
the job's decision, not a lost replica. The NaN is real: a fault turns one rank's first-chunk output into NaN
(reliability/faults.py nan-in-step), and it flows through TP and the pipeline into the loss."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _train(out: Path, *flags: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HYBRIDPAR_FAULT="nan-in-step:rank=1:step=4")
    return subprocess.run([sys.executable, "-m", "hybridpar", "train", "--recipe", str(ROOT / "recipes" / "tiny.yaml"),
                           "--steps", "6", "--out", str(out), "--no-progress", *flags],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("flags", [
    ["--nproc", "8", "--save-every", "2"],  # TP2 x PP2 x DP2: rank 1 is the first stage's second TP rank
    ["--nproc", "4", "--tp", "1", "--pp", "1", "--dp", "4", "--global-batch", "24", "--micro-batch", "2",
     "--save-every", "2", "--tolerate-replica-loss", "--timeout-s", "30"],
], ids=["tp2_pp2_dp2", "dp4_tolerant"])
def test_a_nan_loss_ends_the_run_before_the_step_is_recorded(tmp_path, flags):
    out = tmp_path / "run"
    proc = _train(out, *flags)
    assert proc.returncode == 6, proc.stdout[-2000:] + proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hybridpar train: error:")]
    assert len(errors) == 1 and errors[0].startswith("hybridpar train: error: step 4: the loss is nan"), proc.stderr
    assert "--resume auto" in errors[0] and "lost" not in proc.stdout + proc.stderr  # no replica was dropped
    status = json.loads((out / "status.json").read_text())
    assert status == {"status": "failed", "step": 4, "exit_code": 6, "reason": "non-finite loss or gradient norm at step 4"}
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert (out / "ckpt" / "latest").read_text().strip() == "step-000002"
    assert not (out / "ckpt" / "step-000004").exists()
