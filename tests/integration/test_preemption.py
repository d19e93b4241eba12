"""Preemption and stops on 8 CPU ranks (TP2 x PP2 x DP2): real signals, real checkpoints.

One uninterrupted 14-step run is the reference (tests/tiny_8_ranks.py, shared with
test_train_command.py). A second run of the same recipe, with the same flags, is stopped three
ways and continued each time with ``--resume auto``, as a requeued job script does:
1. SIGTERM to the launcher (what SLURM and Kubernetes send): the ranks finish their step, save
   it, rank 0 prints one line, the job exits 143 and status.json says "stopped";
2. Ctrl-C (SIGINT to the whole process group, as a terminal sends it): the same, exit 130;
3. ``--stop-at-step 11``: exit 4;
then it runs to the end. Every step after each stop equals the reference bit for bit (the same
losses, grad norms and learning rates to the last digit), and metrics.jsonl holds each step once.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from tiny_8_ranks import ROOT, STEPS, environment, train_command


def _start(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(train_command(out, *extra), cwd=ROOT, env=environment(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _steps(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _stop_after(proc: subprocess.Popen, out: Path, step: int, send) -> tuple[int, str, str]:
    """Once ``step`` is logged, ``send`` the signal; returns (exit code, stdout, stderr)."""
    deadline = time.monotonic() + 240
    while not any(m["step"] >= step for m in _steps(out)):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended or stalled before the stop"
        time.sleep(0.05)
    send(proc)
    stdout, stderr = proc.communicate(timeout=240)
    return proc.returncode, stdout, stderr


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    stdout, stderr = proc.communicate(timeout=300)
    return proc.returncode, stdout, stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("preemption")
    out = base / "stopped"
    stops = [
        _stop_after(_start(out), out, 3, lambda p: p.send_signal(signal.SIGTERM)),
        _stop_after(_start(out, "--resume", "auto"), out, 7, lambda p: os.killpg(p.pid, signal.SIGINT)),
        _finish(_start(out, "--resume", "auto", "--stop-at-step", "11")),
    ]
    status = [json.loads((out / "status.json").read_text())]
    last = _finish(_start(out, "--resume", "auto"))
    assert last[0] == 0, last[2][-3000:]
    return base, stops, status


def test_each_stop_saves_its_step_says_one_line_and_exits_with_its_code(runs):
    _, stops, _ = runs
    for (code, _, stderr), want_code, reason in zip(stops, (143, 130, 4), ("SIGTERM", "SIGINT", "--stop-at-step")):
        lines = [l for l in stderr.splitlines() if l.startswith("hybridpar train: stopped at step")]
        assert code == want_code, (code, stderr[-3000:])
        assert len(lines) == 1 and f"by {reason}; saved " in lines[0] and "resume with --resume auto" in lines[0], stderr
        assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]


def test_status_file_tells_a_job_script_to_requeue(runs):
    base, _, status = runs
    assert status[0]["status"] == "stopped" and status[0]["step"] == 11 and status[0]["exit_code"] == 4
    assert status[0]["checkpoint"].endswith("step-000011")
    final = json.loads((base / "stopped" / "status.json").read_text())
    assert final["status"] == "finished" and final["step"] == STEPS


def test_resumed_steps_equal_the_uninterrupted_run_bit_for_bit(runs, tiny_8_ranks):
    base, _, _ = runs
    ref, got = _steps(tiny_8_ranks[0]), _steps(base / "stopped")
    assert [m["step"] for m in got] == [m["step"] for m in ref] == list(range(1, STEPS + 1))  # each step once, in order
    for a, b in zip(ref, got):
        assert (a["loss"], a["grad_norm"], a["lr"]) == (b["loss"], b["grad_norm"], b["lr"]), (a, b)
