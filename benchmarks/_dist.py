"""Helpers shared by the multi-rank benchmarks: launching workers, waiting for a quiet machine,
medians with spread. Not a benchmark itself (bench --list skips names starting with '_')."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hybridpar.benchmarks._cli import nonnegative_float, positive_float

ROOT = Path(__file__).resolve().parents[1]


def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def wait_for_quiet(max_load: float, max_wait_s: float, poll_s: float = 10.0) -> dict:
    """Poll the 1-minute load average until it is below ``max_load`` or ``max_wait_s`` passes."""
    start = time.time()
    first = loadavg()
    while loadavg()[0] >= max_load and time.time() - start < max_wait_s:
        time.sleep(poll_s)
    now = loadavg()
    return {"load_at_start": first, "load_when_started": now, "waited_s": round(time.time() - start, 1),
            "quiet": now[0] < max_load}


def torchrun(module: str, nproc: int, args: list[str], timeout_s: float) -> dict:
    """Run ``python -m module --worker OUT args`` on ``nproc`` local ranks; rank 0 writes OUT (JSON)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", module, "--worker", out, *args]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"{module} on {nproc} ranks failed (exit {proc.returncode}):\n"
                               + proc.stdout[-2000:] + proc.stderr[-5000:])
        return json.loads(Path(out).read_text())


def finish_worker(out: str, payload) -> None:
    """End of a worker: rank 0 writes ``payload`` to ``out`` (read by ``torchrun``), then all ranks leave."""
    import torch.distributed as dist

    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(payload, f)
    dist.barrier()
    dist.destroy_process_group()


def add_quiet_machine_options(parser, timeout_s: float) -> None:
    """--max-load/--max-wait (wait_for_quiet) and --timeout (torchrun) for a timing benchmark."""
    parser.add_argument("--max-load", type=positive_float, default=1.5, help="start each launch below this 1-minute load")
    parser.add_argument("--max-wait", type=nonnegative_float, default=600, help="seconds to wait for that load")
    parser.add_argument("--timeout", type=positive_float, default=timeout_s, help="seconds allowed per launch")


def spread(values: list[float]) -> dict:
    """Median, min, max and interquartile range of a list of timings."""
    v = sorted(values)
    q = statistics.quantiles(v, n=4) if len(v) >= 2 else [v[0], v[0], v[0]]
    return {"median": statistics.median(v), "min": v[0], "max": v[-1], "q1": q[0], "q3": q[2], "n": len(v)}


def quiet_worker_env() -> None:
    """Silence library warnings and logging in worker processes."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
