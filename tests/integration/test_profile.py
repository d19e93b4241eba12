"""`hybridpar train --profile-steps A-B --profile-ranks ...`: a real torch.profiler trace of exactly those steps
on those ranks, written where the run directory keeps it (hybridpar/observe/profile.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_profiled_steps_of_every_rank_are_in_their_traces(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "hybridpar", "train", "--recipe", str(ROOT / "recipes" / "tiny.yaml"),
                           "--nproc", "2", "--tp", "1", "--pp", "2", "--steps", "4", "--out", str(out), "--no-progress",
                           "--profile-steps", "2-3", "--profile-ranks", "all"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    traces = sorted((out / "profile").iterdir())
    assert [t.name for t in traces] == ["rank-00000-steps-2-3.json", "rank-00001-steps-2-3.json"]
    for trace in traces:
        names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
        assert {"step 2", "step 3"} <= names and not {"step 1", "step 4"} & names, trace
        assert any(n and n.startswith("aten::") for n in names)  # the ops themselves, not just the ranges
        assert any(n and ("send" in n.lower() or "recv" in n.lower()) for n in names)  # pipeline p2p
    assert f"profile of steps 2-3 on every rank: {out / 'profile'}/rank-*-steps-2-3.json" in proc.stdout
