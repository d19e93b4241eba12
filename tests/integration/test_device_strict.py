"""Strict device mode (hybridpar/compat/cpu.py): CPU ranks that fail where a GPU would.

The whole suite runs its ranks under ``HYBRIDPAR_STRICT_DEVICE=1`` (tests/conftest.py); the
multi-rank tests check that the mode was on in every rank (test_runtime.py). Here, in a fresh
process: a tensor created without ``device=`` lands on ``meta``; every way of using it with real
tensors fails in one named error instead of computing garbage (some CPU kernels accept a meta
operand silently); a scalar created without a device is a CPU scalar, which CUDA kernels accept
beside device tensors; explicit devices work; the mode is off unless asked for.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _probe(strict: str) -> dict:
    env = dict(os.environ, HYBRIDPAR_STRICT_DEVICE=strict, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "workers" / "strict_probe.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_strict_mode_fails_every_use_of_a_tensor_created_without_a_device():
    r = _probe("1")
    assert r["default_device"] == "meta" and r["ids_device"] == "meta", r
    for case in ("embedding", "index", "matmul", "add", "cat", "old_rmsnorm"):
        assert r[case] in ("MixedDeviceError", "RuntimeError"), (case, r[case])
    assert r["to_device"] == "NotImplementedError" and r["item"] in ("RuntimeError", "NotImplementedError"), r
    assert r["scalar_is_host"] == "no error", r  # device-less scalars stay on the CPU: CUDA ops accept them
    assert r["explicit"] is True


def test_strict_mode_is_off_unless_asked_for():
    r = _probe("0")
    assert r["default_device"] == "cpu", r
    assert all(r[case] == "no error" for case in ("embedding", "matmul", "add", "to_device", "old_rmsnorm")), r
