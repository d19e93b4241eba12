"""scripts/gpu_session.sh keeps its time budget and reports every step, even when steps hang.

The script runs for real with stand-in ``python3``, ``nvidia-smi`` and ``timeout``-able commands on
PATH: here every Python step hangs (as a stuck NCCL collective would). With a 17 s budget the
session must end within it (plus the kill grace), and session.json must name every step with its
exit code: the first killed by its timeout (124), the rest skipped (-1) for want of time.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["setup", "kernels", "layer_kernels", "attention", "train_bf16", "init", "bench_gpu"]


def _stub(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_hung_steps_cannot_overrun_the_budget(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "gpu_session.sh", repo / "scripts" / "gpu_session.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir / "python3", "#!/bin/sh\nexec sleep 600\n")
    _stub(bin_dir / "nvidia-smi", "#!/bin/sh\necho 'GPU 0: stand-in'\n")
    out = tmp_path / "out"
    env = dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin", OUT=str(out), BUDGET_S="17")
    start = time.monotonic()
    proc = subprocess.run(["bash", str(repo / "scripts" / "gpu_session.sh")], env=env, capture_output=True, text=True,
                          timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert elapsed < 17 + 5 + 3, elapsed  # the budget, the kill grace, and the shell's own start
    session = json.loads((out / "session.json").read_text())
    assert [s["step"] for s in session["steps"]] == STEPS
    assert session["steps"][0]["exit"] == 124  # the hung step was stopped by its timeout
    assert all(s["exit"] == -1 for s in session["steps"][1:]), session  # no time left: skipped, not started
    assert (out / "session.tgz").exists()  # the logs come back in one file
