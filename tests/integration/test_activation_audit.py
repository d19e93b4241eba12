"""One transformer layer's saved-for-backward bytes, measured on CPU (hybridpar/activation_audit.py)
at Llama 3 8B's and 70B's real hidden size and head layout with short sequences, against the
planner's per-layer formula (topology/memory.py layer_activation_bytes, hybridpar's profile).

Measured in fp32 on CPU, converted to a bf16 GPU run's bytes per element (2; 4 for the fp32
logsumexp and rstd); the x*rstd that only CPU's composite rms_norm keeps is left out (CUDA's fused
kernel does not keep it). TOLERANCE: the planner leaves out RMSNorm's rstd (8 bytes per token,
0.004%) and the selective checkpoint's 4-byte mask-type tensor; 0.5% is the memory audit's bound.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridpar.topology.memory import layer_activation_bytes
from hybridpar.topology.models import PRESETS
from hybridpar.topology.plan import Plan
from hybridpar.topology.software import HYBRIDPAR

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 0.005
CASES = [("llama3-8b", 1, 128, "none"), ("llama3-8b", 1, 256, "none"), ("llama3-8b", 1, 128, "selective"),
         ("llama3-8b", 1, 128, "full"), ("llama3-8b", 2, 128, "none"), ("llama3-70b", 4, 128, "none")]


@pytest.fixture(scope="module")
def measured():
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "workers" / "activation_probe.py"), json.dumps(CASES)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    return {(r["model"], r["tp"], r["seq_len"], r["recompute"]): r for r in rows}


def planner_bytes(model, tp, seq, recompute) -> float:
    plan = Plan(PRESETS[model], seq, 1, tp=tp, sequence_parallel=tp > 1, recompute=recompute)
    return layer_activation_bytes(plan, HYBRIDPAR)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_planner_formula_matches_the_measured_layer(measured, case):
    got, want = measured[case]["gpu_bytes"], planner_bytes(*case)
    assert abs(want - got) / got <= TOLERANCE, f"{case}: measured {got:,} B, planner {want:,.0f} B"


def test_saved_bytes_are_linear_in_sequence_length(measured):
    short, long = measured[("llama3-8b", 1, 128, "none")], measured[("llama3-8b", 1, 256, "none")]
    assert long["gpu_bytes"] == 2 * short["gpu_bytes"]  # FlashAttention keeps nothing of size s^2


def test_recomputation_keeps_less(measured):
    none, sel, full = (measured[("llama3-8b", 1, 128, r)]["gpu_bytes"] for r in ("none", "selective", "full"))
    h = PRESETS["llama3-8b"].hidden
    assert full == 128 * 2 * h  # only the layer's input, bf16
    assert full < sel < none  # selective drops only the attention's own logsumexp and output copy


def test_cpu_only_tensor_is_the_composite_norms_product(measured):
    """CPU's rms_norm keeps x*rstd (fp32) in each of the layer's two norms: what is left out."""
    h = PRESETS["llama3-8b"].hidden
    assert measured[("llama3-8b", 1, 128, "none")]["cpu_only_bytes"] == 2 * 128 * h * 4
    assert measured[("llama3-8b", 2, 128, "none")]["cpu_only_bytes"] == 2 * 64 * h * 4  # sequence parallel
