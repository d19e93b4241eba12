"""FP8 current scaling (Transformer Engine's Float8CurrentScaling, topology/fp8.py): what it adds to a layer over
delayed scaling, tensor by tensor as TE 2.7 quantizes them; the --fp8-scaling flag; Megatron-Bridge's published runs
costed with it."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hybridpar.topology import validation
from hybridpar.topology.cases import VALIDATION_PATH, load_cases
from hybridpar.topology.cost import layer_time, step_cost
from hybridpar.topology.fp8 import CURRENT, DELAYED, amax_reductions, current_scaling_bytes
from hybridpar.topology.hardware import get_gpu
from hybridpar.topology.kernels import KERNEL_GAP_S, hbm_time
from hybridpar.topology.links import collective_time
from hybridpar.topology.models import PRESETS
from hybridpar.topology.plan import Plan
from hybridpar.topology.software import MEGATRON_CORE_BF16_GRADS
from plan_cli import run
from tensor_listing import listed_bytes

H100 = get_gpu("h100-80gb")
L8B = PRESETS["llama3-8b"]


def _more_than_delayed(m, tp: int, sp: bool) -> tuple[list, list]:
    """(elements per token, bytes per element) current scaling adds, quantization by quantization: the norms
    cannot write fp8 (normalization.cpp force_unfused_kernel), so each writes 16 bits, its amax on the way, and
    a cast reads them back and writes the fp8 byte the fused norm wrote; every other cast first reads its 16-bit
    input once for the amax (Float8CurrentScalingQuantizer::quantize_impl, nvte_compute_amax)."""
    h, kv, f = m.hidden, m.kv_heads * m.head_dim, m.ffn_hidden
    local = 1 / tp if sp else 1.0
    forward = [(h * local, 2 + 2 + 1 - 1)] * 2  # the norms before QKV and fc1
    forward += [(h / tp, 2), (f / tp, 2)]  # proj's and fc2's inputs
    backward = [((h + 2 * kv) / tp, 2), (2 * f / tp, 2)]  # QKV's and fc1's output gradients (SwiGLU: gate and up)
    backward += [(h * local, 2)] * 2  # proj's and fc2's output gradients, each rank's slice with SP
    return forward, backward


@pytest.mark.parametrize("tp,sp", [(1, False), (4, True), (8, True), (2, False)])
def test_current_scaling_bytes_are_its_quantizations_summed(tp, sp):
    forward, backward = _more_than_delayed(L8B, tp, sp)
    assert current_scaling_bytes(L8B, tp, sp) == pytest.approx(listed_bytes(forward, backward))


def test_a_layer_pays_the_bytes_the_kernels_and_the_amax_reductions():
    """At TP4 with sequence parallelism the gathered tensors (norm outputs forward, row-parallel output gradients
    backward) agree on one amax first: two 4-byte all-reduces over the TP group each way, on the compute stream;
    at TP1 there are none."""
    tokens, tp = 8192, 4
    delayed, current = (replace(MEGATRON_CORE_BF16_GRADS, fp8_scaling=s) for s in (DELAYED, CURRENT))
    a, b = (layer_time(L8B, H100, "fp8", 8192, 1, tp, 1, True, "none", sw, 8) for sw in (delayed, current))
    amax = collective_time("all-reduce", 4, tp, 1, H100.nvlink_gbps, H100)
    f_b, b_b = current_scaling_bytes(L8B, tp, True)
    assert amax_reductions(True, tp) == (2, 2) and amax_reductions(False, 1) == (0, 0)
    assert b.fwd - a.fwd == pytest.approx(hbm_time(tokens * f_b, H100) + 4 * KERNEL_GAP_S + 2 * amax, rel=1e-6)
    assert b.bwd - a.bwd == pytest.approx(hbm_time(tokens * b_b, H100) + 4 * KERNEL_GAP_S + 2 * amax, rel=1e-6)
    assert (b.tp, b.cp) == (a.tp, a.cp)


def test_current_scaling_slows_the_step_and_keeps_the_memory():
    plan = Plan(L8B, 8192, 64, tp=2, pp=1, cp=1, dp=4, vpp=1, micro_batch=1, zero_stage=1, recompute="none",
                sequence_parallel=True, gpu="h100-80gb", precision="fp8")
    delayed, current = (step_cost(plan, replace(MEGATRON_CORE_BF16_GRADS, fp8_scaling=s)) for s in (DELAYED, CURRENT))
    assert 1.0 < current.step_time_s / delayed.step_time_s < 1.05


def test_fp8_scaling_flag(capsys):
    argv = ["--model", "llama3-70b", "--gpus", "64", "--seq-len", "8192", "--global-batch", "128", "--tp", "4",
            "--pp", "8", "--cp", "1", "--vpp", "5", "--micro-batch", "1", "--precision", "fp8", "--fp8-params",
            "--tp-comm-overlap", "--software", "megatron-core-bf16-grads", "--json"]
    steps = {s: json.loads(run([*argv, "--fp8-scaling", s], capsys)[1])["plans"][0]["step_time_s"]
             for s in ("delayed", "current")}
    assert steps["delayed"] == json.loads(run(argv, capsys)[1])["plans"][0]["step_time_s"]  # the default
    assert steps["current"] > steps["delayed"]
    code, _, err = run(["--model", "llama3-8b", "--gpus", "8", "--fp8-scaling", "current"], capsys)
    assert code == 2 and "--fp8-scaling" in err and "--precision fp8" in err and len(err.strip().splitlines()) == 1


def test_megatron_bridge_runs_are_costed_with_current_scaling():
    """Megatron-Bridge's performance recipes (25.09, 26.02) train FP8 with current scaling: each of its rows says so,
    and costed with delayed scaling instead each would be predicted faster."""
    rows = [c for c in load_cases(VALIDATION_PATH) if c["id"].startswith("mbridge")]
    assert len(rows) == 6 and all(r["fp8_scaling"] == CURRENT and r["precision"] == "fp8" for r in rows)
    for r in rows:
        assert validation.check(dict(r, fp8_scaling=DELAYED)).predicted_mfu > validation.check(r).predicted_mfu
