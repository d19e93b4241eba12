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
# (model, tp, seq_len, recompute, cp); with CP the layer holds seq_len / cp tokens and K/V of all seq_len
CASES = [("llama3-8b", 1, 128, "none", 1), ("llama3-8b", 1, 256, "none", 1), ("llama3-8b", 1, 128, "selective", 1),
         ("llama3-8b", 1, 128, "full", 1), ("llama3-8b", 2, 128, "none", 1), ("llama3-70b", 4, 128, "none", 1),
         ("llama3-8b", 2, 256, "none", 2), ("llama3-8b", 1, 512, "none", 4), ("llama3-8b", 1, 256, "selective", 2)]


@pytest.fixture(scope="module")
def measured():
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "workers" / "activation_probe.py"), json.dumps(CASES)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    return {(r["model"], r["tp"], r["seq_len"], r["recompute"], r["cp"]): r for r in rows}


def planner_bytes(model, tp, seq, recompute, cp) -> float:
    plan = Plan(PRESETS[model], seq, 1, tp=tp, cp=cp, sequence_parallel=tp > 1, recompute=recompute)
    return layer_activation_bytes(plan, HYBRIDPAR)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_planner_formula_matches_the_measured_layer(measured, case):
    got, want = measured[case]["gpu_bytes"], planner_bytes(*case)
    assert abs(want - got) / got <= TOLERANCE, f"{case}: measured {got:,} B, planner {want:,.0f} B"


def test_saved_bytes_are_linear_in_sequence_length(measured):
    short, long = measured[("llama3-8b", 1, 128, "none", 1)], measured[("llama3-8b", 1, 256, "none", 1)]
    assert long["gpu_bytes"] == 2 * short["gpu_bytes"]  # FlashAttention keeps nothing of size s^2


def test_recomputation_keeps_less(measured):
    none, sel, full = (measured[("llama3-8b", 1, 128, r, 1)]["gpu_bytes"] for r in ("none", "selective", "full"))
    h = PRESETS["llama3-8b"].hidden
    assert full == 128 * 2 * h  # only the layer's input, bf16
    assert full < sel < none  # selective drops only the attention's own logsumexp and output copy


def test_cpu_only_tensor_is_the_composite_norms_product(measured):
    """CPU's rms_norm keeps x*rstd (fp32) in each of the layer's two norms: what is left out."""
    h = PRESETS["llama3-8b"].hidden
    assert measured[("llama3-8b", 1, 128, "none", 1)]["cpu_only_bytes"] == 2 * 128 * h * 4
    assert measured[("llama3-8b", 2, 128, "none", 1)]["cpu_only_bytes"] == 2 * 64 * h * 4  # sequence parallel


def test_context_parallel_keeps_the_gathered_k_and_v_of_the_whole_sequence(measured):
    """At the same local tokens (128), a CP layer keeps K and V of all cp x 128 tokens in place of the local
    rotated K and the QKV output, and a copy of the attention output for the projection: (4 cp - 6) kv / tp
    bytes more per token (kv = 8 heads x 128). Its materialised causal mask (CPU only) is left out; with
    selective recomputation the gather reruns in backward and nothing more is kept."""
    kv = 8 * 128
    for tp, cp, base in ((2, 2, ("llama3-8b", 2, 128, "none", 1)), (1, 4, ("llama3-8b", 1, 128, "none", 1))):
        got = measured[("llama3-8b", tp, 128 * cp, "none", cp)]
        assert got["gpu_bytes"] - measured[base]["gpu_bytes"] == 128 * (4 * cp - 6) * kv // tp
        assert got["cpu_only_bytes"] > measured[base]["cpu_only_bytes"]  # the mask
    selective = ("llama3-8b", 1, 256, "selective", 2)
    assert measured[selective]["gpu_bytes"] == measured[("llama3-8b", 1, 128, "selective", 1)]["gpu_bytes"]
