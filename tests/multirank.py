"""Starting a multi-rank test worker and reading back what rank 0 wrote.

The ranks are forked by hybridpar's CPU launcher (``python -m hybridpar.launch.forked``, what
``torchrun --standalone`` does, with the libraries imported once: hybridpar/launch/forked.py).

A worker (tests/workers/*.py) takes the path of a config.json, runs its scenarios on every
rank, and rank 0 writes ``results.json`` into ``cfg["out"]`` (``workers/results_io.py``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKERS = ROOT / "tests" / "workers"


def run_worker(worker: str, nproc: int, cfg: dict, out: Path, timeout: int) -> dict:
    """Run ``tests/workers/<worker>`` on ``nproc`` local ranks with ``cfg`` (plus ``out``)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dict(cfg, out=str(out))))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "hybridpar.launch.forked", f"--nproc={nproc}", str(WORKERS / worker),
           str(out / "config.json")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads((out / "results.json").read_text())


def run_probe(code: str, arg, timeout: int = 600):
    """Run ``code`` in a fresh Python (its own process groups, none of the test process's) with ``arg``
    as JSON in sys.argv[1]; return the JSON its last line of output prints."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(arg)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_single_process_worker(worker: str, out: Path, timeout: int = 300) -> dict:
    """Run ``tests/workers/<worker> OUT.json`` as one plain process (a world of one); return its JSON."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(WORKERS / worker), str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(Path(out).read_text())
