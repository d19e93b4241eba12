"""torchtitan's two selective recomputation policies as the planner costs them (software.TORCHTITAN_2024):
"every-other-block" (every second block checkpointed whole) and "op-selective" (each block keeps its attention
output and every other matmul's output). Both sit between no recomputation and full recomputation, in time and in
memory, by the amounts their definitions give; hybridpar's own runtime does not offer them."""
from pathlib import Path

import pytest

from hybridpar.config.recipe import load_recipe, with_overrides
from hybridpar.topology.cost import layer_time, step_cost
from hybridpar.topology.flops import recompute_flops_per_seq
from hybridpar.topology.hardware import get_gpu
from hybridpar.topology.kernels import gemm_time
from hybridpar.topology.memory import layer_activation_bytes, stage_memory
from hybridpar.topology.models import PRESETS
from hybridpar.topology.plan import Plan
from hybridpar.topology.software import TORCHTITAN_2024
from hybridpar.topology.stages import stages

MODEL = PRESETS["llama3-8b"]
A100 = get_gpu("a100-80gb")


def _plan(recompute: str) -> Plan:
    return Plan(MODEL, 8192, 64, tp=1, cp=1, pp=1, dp=64, micro_batch=1, zero_stage=3, recompute=recompute,
                gpu="a100-80gb")


def _layer(recompute: str):
    return layer_time(MODEL, A100, "bf16", 8192, 1, 1, 1, True, recompute, TORCHTITAN_2024, 8)


def test_every_other_block_recomputes_half_the_forward():
    none, half, full = (_layer(r) for r in ("none", "every-other-block", "full"))
    assert half.bwd - none.bwd == pytest.approx(none.fwd / 2)
    assert full.bwd - none.bwd == pytest.approx(none.fwd)
    assert recompute_flops_per_seq(MODEL, 8192, "every-other-block") == recompute_flops_per_seq(MODEL, 8192, "full") / 2


def test_op_policy_recomputes_three_projections_and_the_elementwise_work():
    """The K, output and up projections (every second matmul: 19,456 of Llama 3 8B's 53,248 weight columns per
    block) and every elementwise chain, no attention: more than those GEMMs, less than half the forward."""
    none, op = _layer("none"), _layer("op-selective")
    h, kv, f = MODEL.hidden, MODEL.kv_heads * MODEL.head_dim, MODEL.ffn_hidden
    peak = A100.peak_tflops("bf16") * 1e12
    projections = sum(gemm_time(8192, h, n, A100, peak) for n in (kv, h, f))
    assert projections < op.bwd - none.bwd < none.fwd / 2
    assert recompute_flops_per_seq(MODEL, 8192, "op-selective") == 8192 * 2 * MODEL.layers * h * (kv + h + f)


def test_memory_between_none_and_full_with_one_block_recomputed():
    by_mode = {r: layer_activation_bytes(_plan(r), TORCHTITAN_2024) for r in ("none", "every-other-block",
                                                                                "op-selective", "full")}
    h, kv, f, a = MODEL.hidden, MODEL.kv_heads * MODEL.head_dim, MODEL.ffn_hidden, MODEL.heads
    assert by_mode["full"] == 8192 * 2 * h
    assert by_mode["every-other-block"] == pytest.approx((by_mode["none"] + by_mode["full"]) / 2)
    assert by_mode["op-selective"] == 8192 * (2 * h + 2 * h + 2 * kv + 2 * f + 2 * h + 4 * a)
    assert by_mode["full"] < by_mode["op-selective"] < by_mode["every-other-block"] < by_mode["none"]
    for mode in ("every-other-block", "op-selective"):  # the block being recomputed holds its whole set
        plan = _plan(mode)
        stage = stages(plan)[0]
        kept = stage_memory(plan, stage, TORCHTITAN_2024).activations
        assert kept == pytest.approx(MODEL.layers * by_mode[mode] + by_mode["none"], rel=0.02)
    assert step_cost(_plan("op-selective"), TORCHTITAN_2024).step_time_s < step_cost(_plan("full"),
                                                                                      TORCHTITAN_2024).step_time_s


def test_the_runtime_refuses_the_planners_torchtitan_policies():
    recipe = with_overrides(load_recipe(str(Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml")), recompute="op-selective")
    assert any("parallel.recompute must be one of none, selective, full" in p for p in recipe.problems())
