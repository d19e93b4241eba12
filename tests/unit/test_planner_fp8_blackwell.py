"""FP8 on Blackwell (hardware.GPU.fp8_transposes False): its GEMMs take either operand layout from the one rowwise
fp8 copy, so Transformer Engine makes no transposed copies; the casts, kernels, kept activations and cached weights
that leaves (topology/fp8.py)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from hybridpar.topology.cost import step_cost
from hybridpar.topology.fp8 import layer_cast_bytes, layer_cast_kernels, saved_bytes_change
from hybridpar.topology.hardware import get_gpu, load_gpu
from hybridpar.topology.memory import layer_activation_bytes, stage_memory
from hybridpar.topology.models import PRESETS
from hybridpar.topology.plan import Plan
from hybridpar.topology.software import MEGATRON_CORE
from hybridpar.topology.stages import layer_params_per_rank, stages
from plan_cli import run
from tensor_listing import listed_bytes

B200 = get_gpu("b200-180gb")
L8B = PRESETS["llama3-8b"]


def _casts_without_transposes(m, tp: int, sp: bool) -> tuple[list, list]:
    """(elements per token, bytes per element) of every tensor TE casts in one layer when no transpose is made:
    the norms' fp8 output counted as the byte it saves, every other cast read 2, write 1."""
    h, kv, f = m.hidden, m.kv_heads * m.head_dim, m.ffn_hidden
    local = 1 / tp if sp else 1.0
    forward = [(h * local, -1), (h * local, -1), (h / tp, 3), (f / tp, 3)]  # norms; proj's and fc2's inputs
    backward = [((h + 2 * kv) / tp, 3), (2 * f / tp, 3)]  # QKV's and fc1's output gradients
    backward += [(h * local, 3), (h * local, 3)]  # proj's and fc2's output gradients (each rank's slice with SP)
    return forward, backward


def test_b200_makes_no_transposes_and_h100_does():
    assert B200.fp8_transposes is False and get_gpu("h100-80gb").fp8_transposes is True


@pytest.mark.parametrize("tp,sp", [(1, False), (4, True), (2, False)])
def test_casts_without_transposes_are_the_casts_summed(tp, sp):
    forward, backward = _casts_without_transposes(L8B, tp, sp)
    assert layer_cast_bytes(L8B, tp, sp, transposes=False) == pytest.approx(listed_bytes(forward, backward))
    assert layer_cast_kernels(sp, transposes=False) == (2, 4)
    (f, b), (hopper_f, hopper_b) = layer_cast_bytes(L8B, tp, sp, transposes=False), layer_cast_bytes(L8B, tp, sp)
    assert f <= hopper_f and b < hopper_b


@pytest.mark.parametrize("tp,sp", [(1, False), (4, True)])
def test_kept_activations_are_the_fp8_copies_alone(tp, sp):
    h, f = L8B.hidden, L8B.ffn_hidden
    assert saved_bytes_change(L8B, tp, sp, transposes=False) == pytest.approx(-2 * h * (1 / tp if sp else 1)
                                                                              + h / tp - f / tp)
    plan = Plan(L8B, 8192, 64, tp=tp, pp=1, cp=1, dp=8 // tp, vpp=1, micro_batch=1, zero_stage=1, recompute="none",
                sequence_parallel=sp, gpu="b200-180gb", precision="fp8")
    assert (layer_activation_bytes(plan, MEGATRON_CORE, fp8_transposes=False)
            <= layer_activation_bytes(plan, MEGATRON_CORE))


def test_an_fp8_weight_is_one_byte_a_parameter():
    plan = Plan(L8B, 8192, 64, tp=2, pp=1, cp=1, dp=4, vpp=1, micro_batch=1, zero_stage=1, recompute="none",
                sequence_parallel=True, gpu="b200-180gb", precision="fp8")
    stage = stages(plan)[0]
    layer_params = stage.layers * layer_params_per_rank(plan)
    bf16 = stage_memory(replace(plan, precision="bf16"), stage, MEGATRON_CORE, fp8_transposes=False).params
    cached = stage_memory(plan, stage, MEGATRON_CORE, fp8_transposes=False).params
    fp8_params = stage_memory(plan, stage, replace(MEGATRON_CORE, fp8_params=True), fp8_transposes=False).params
    assert cached - bf16 == pytest.approx(layer_params)  # the cached copy beside the 16-bit weight
    assert bf16 - fp8_params == pytest.approx(layer_params)  # the weight is its fp8 copy


def test_the_step_is_faster_without_transposes():
    plan = Plan(L8B, 8192, 64, tp=1, pp=1, cp=1, dp=8, vpp=1, micro_batch=1, zero_stage=1, recompute="none",
                sequence_parallel=False, gpu="b200-180gb", precision="fp8")
    hopper_like = replace(B200, fp8_transposes=True)
    assert step_cost(plan, MEGATRON_CORE, B200).step_time_s < step_cost(plan, MEGATRON_CORE, hopper_like).step_time_s


def test_gpu_files_keep_or_set_the_transposes(tmp_path, capsys):
    kept = tmp_path / "b200.yaml"
    kept.write_text("base: b200-180gb\ngemm_fraction: 0.7\n")
    assert load_gpu(str(kept)).fp8_transposes is False
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: b200-180gb\nfp8_transposes: 1\n")
    code, _, err = run(["--model", "llama3-8b", "--gpus", "8", "--gpu", str(bad)], capsys)
    assert code == 2 and "fp8_transposes must be true" in err and len(err.strip().splitlines()) == 1
