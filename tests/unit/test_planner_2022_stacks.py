"""The 2022 stacks whose profiles differ from Megatron's in their precision and optimizer: NeMo Megatron with O2 and with
autocast (O1), and FlashAttention's own GPT training (autocast over fp32 weights): what each costs and holds."""
from dataclasses import replace

import pytest

from hybridpar.topology.cost import step_cost
from hybridpar.topology.hardware import get_gpu
from hybridpar.topology.models import ModelSpec
from hybridpar.topology.plan import Plan

GPT3_5B = ModelSpec(24, 4096, 16384, 32, 32, 50432, "gelu", "gpt3-5b", tied_embeddings=True)


def test_nemo_2022_overlaps_its_dp_all_reduce_only_without_a_pipeline():
    """NeMo 1.11 (MegatronGPTModel.training_step): O2's all-reduce of the fp32 main grads runs during the last
    backward without PP or SP, after the flush with either (Software.grad_reduce_after_flush_with_pp)."""
    from hybridpar.topology.software import NEMO_MEGATRON_2022

    always = replace(NEMO_MEGATRON_2022, grad_reduce_after_flush_with_pp=False)

    def dp(pp, sw, sp=False):
        plan = Plan(GPT3_5B, 2048, 1440, tp=2, pp=pp, dp=16 // pp, micro_batch=2, zero_stage=0, gpu="a100-80gb",
                    sequence_parallel=sp)
        return step_cost(plan, sw).dp_s

    assert dp(1, NEMO_MEGATRON_2022) == dp(1, always)
    assert dp(2, NEMO_MEGATRON_2022) > dp(2, always) and dp(1, NEMO_MEGATRON_2022, sp=True) > dp(1, always, sp=True)


def test_nemo_2022_o1_all_reduces_after_the_flush_even_without_a_pipeline():
    """NeMo 1.11's O1 (megatron_amp_O2=False): "async grad allreduce is not currently implemented for O1", so the fp32
    gradients are all-reduced after the last backward, exposed, where O2 hides them behind it without PP."""
    from hybridpar.topology.software import NEMO_MEGATRON_2022, NEMO_MEGATRON_2022_O1

    plan = Plan(GPT3_5B, 2048, 1440, tp=2, pp=1, dp=16, micro_batch=2, zero_stage=0, gpu="a100-80gb",
                sequence_parallel=False)
    o1, o2 = step_cost(plan, NEMO_MEGATRON_2022_O1), step_cost(plan, NEMO_MEGATRON_2022)
    overlapped = step_cost(plan, replace(NEMO_MEGATRON_2022_O1, overlap_grad_reduce=True))
    assert o1.dp_s > overlapped.dp_s and o2.dp_s == pytest.approx(overlapped.dp_s, rel=1e-9)


def test_autocast_over_megatron_moves_the_16bit_layers_bytes_and_launches_more_kernels():
    """nemo-megatron-2022-o1's layer: NeMo's fused bias-dropout-add and bias-GELU cast their fp32 arguments to bf16 as
    apex's linears and norms do, so every activation stays bf16 and a layer costs what O2's does per token; only the
    casts of its 12 weights and biases, their casts back and the 4 weight-gradient additions are more kernels."""
    from hybridpar.topology.cost import layer_time
    from hybridpar.topology.software import NEMO_MEGATRON_2022, NEMO_MEGATRON_2022_O1

    gpu = get_gpu("a100-80gb")
    o1, o2 = NEMO_MEGATRON_2022_O1, NEMO_MEGATRON_2022
    assert o1.kernels_per_layer == (o2.kernels_per_layer[0] + 12, o2.kernels_per_layer[1] + 16)
    same_kernels = replace(o1, kernels_per_layer=o2.kernels_per_layer)
    for tp in (1, 2, 8):
        a, b = (layer_time(GPT3_5B, gpu, "bf16", 2048, 2, tp, 1, False, "none", sw, 8) for sw in (o2, same_kernels))
        assert (a.fwd, a.bwd, a.tp) == (b.fwd, b.bwd, b.tp)
        more = layer_time(GPT3_5B, gpu, "bf16", 2048, 2, tp, 1, False, "none", o1, 8)
        assert more.fwd > a.fwd and more.bwd > a.bwd


def test_nemo_2022_o1_holds_fp32_weights_and_steps_them_after_flattening_the_gradients():
    """O1's memory and step: the fp32 weights with a micro-batch's bf16 copies (6 bytes per parameter), fp32 .grad,
    Adam's two moments and no master copy (8); the step flattens, divides and copies back the gradients around the
    all-reduce (24 bytes) beside FusedAdam's 28 on fp32 weights; every micro-batch pays autocast's weight cast,
    gradient cast and accumulation (24)."""
    from hybridpar.topology.cost import optimizer_step_bytes
    from hybridpar.topology.memory import stage_memory
    from hybridpar.topology.software import AUTOCAST_GRAD_BYTES, NEMO_MEGATRON_2022_O1
    from hybridpar.topology.stages import params_per_rank, stages

    sw = NEMO_MEGATRON_2022_O1
    plan = Plan(GPT3_5B, 2048, 1440, tp=2, pp=1, dp=16, micro_batch=2, zero_stage=0, gpu="a100-80gb",
                sequence_parallel=False)
    (stage,) = stages(plan)
    n = params_per_rank(plan, stage)
    mem = stage_memory(plan, stage, sw)
    assert mem.params == pytest.approx(6 * n) and mem.grads == pytest.approx(4 * n)
    assert mem.optimizer == pytest.approx(8 * n)
    assert optimizer_step_bytes(sw, 0, 16) == optimizer_step_bytes(sw, 0, 1) == 28 + 24
    assert sw.grad_accum_bytes_per_param == AUTOCAST_GRAD_BYTES == 24
    assert sw.zero_stages == (0,)  # "Distributed optimizers require O2"


def test_nemo_2022_o1_keeps_a_bf16_weight_copy_for_every_micro_batch_in_flight():
    """apex's linears save the bf16 weight they cast for their backward, so under 1F1B the first of 4 stages holds 4
    micro-batches' copies (one counted with the weights), the last stage one; without a pipeline nothing more."""
    from hybridpar.topology.memory import stage_memory
    from hybridpar.topology.software import NEMO_MEGATRON_2022_O1
    from hybridpar.topology.stages import layer_params_per_rank, stages

    once = replace(NEMO_MEGATRON_2022_O1, autocast_copy_per_micro_batch=False)
    plan = Plan(GPT3_5B, 2048, 1440, tp=2, pp=4, dp=4, micro_batch=2, zero_stage=0, gpu="a100-80gb",
                sequence_parallel=False)
    first, *_, last = stages(plan)
    extra = [stage_memory(plan, st, NEMO_MEGATRON_2022_O1).activations - stage_memory(plan, st, once).activations
             for st in (first, last)]
    assert extra[0] == pytest.approx(3 * 2 * first.layers * layer_params_per_rank(plan)) and extra[1] == 0
    flat = Plan(GPT3_5B, 2048, 1440, tp=2, pp=1, dp=16, micro_batch=2, zero_stage=0, gpu="a100-80gb",
                sequence_parallel=False)
    (only,) = stages(flat)
    assert stage_memory(flat, only, NEMO_MEGATRON_2022_O1).total == stage_memory(flat, only, once).total


def test_gelu_in_the_gemm_epilogue_costs_only_the_kept_pre_activation():
    """FusedDenseGeluDense (flash-attn-training-2022): no GELU pass of its own, only the pre-activation the epilogue
    keeps, written forward and read backward: the layer saves 2 of the pass's 4 bytes per element of the
    intermediate forward and 6 of its 8 backward, and nothing else moves."""
    from hybridpar.topology.cost import layer_time
    from hybridpar.topology.kernels import hbm_time
    from hybridpar.topology.software import FLASH_ATTN_TRAINING_2022

    m, gpu, tokens = ModelSpec(24, 2048, 8192, 16, 16, 50264, "gelu", "gpt3-1.3b"), get_gpu("a100-80gb"), 8 * 2048
    fused = FLASH_ATTN_TRAINING_2022
    assert fused.gelu_in_gemm_epilogue
    a, b = (layer_time(m, gpu, "bf16", 2048, 8, 1, 1, True, "none", sw, 8)
            for sw in (replace(fused, gelu_in_gemm_epilogue=False), fused))
    assert a.fwd - b.fwd == pytest.approx(hbm_time(tokens * 2 * m.ffn_hidden, gpu), rel=1e-6)
    assert a.bwd - b.bwd == pytest.approx(hbm_time(tokens * 6 * m.ffn_hidden, gpu), rel=1e-6)


def test_autocasts_weight_and_gradient_casts_are_paid_every_micro_batch():
    """flash-attn-training-2022's fp32 weights under autocast: each micro-batch casts every weight to bf16, casts its
    gradient back and adds it into the fp32 .grad (software.AUTOCAST_GRAD_BYTES per parameter): the step pays those
    bytes once per micro-batch, at the rate the profile charges gradient accumulation."""
    from hybridpar.topology.kernels import hbm_time
    from hybridpar.topology.software import AUTOCAST_GRAD_BYTES, FLASH_ATTN_TRAINING_2022
    from hybridpar.topology.stages import params_per_rank, stages

    sw = FLASH_ATTN_TRAINING_2022
    m = ModelSpec(24, 2048, 8192, 16, 16, 50264, "gelu", "gpt3-1.3b")
    plan = Plan(m, 2048, 512, dp=8, micro_batch=8, zero_stage=1, gpu="a100-80gb")
    bare = replace(sw, grad_accum_bytes_per_param=0)
    gpu, (stage,) = get_gpu("a100-80gb"), stages(plan)
    added = step_cost(plan, sw).step_time_s - step_cost(plan, bare).step_time_s
    assert AUTOCAST_GRAD_BYTES == 24
    per_mb = hbm_time(24 * params_per_rank(plan, stage), gpu, sw.grad_accum_hbm_efficiency)
    assert added == pytest.approx(plan.grad_accum * per_mb, rel=1e-6)


def test_autocast_over_fp32_weights_holds_them_and_a_bf16_copy():
    """flash-attn-training-2022's memory: the fp32 weight and autocast's bf16 copy (6 bytes per parameter), fp32
    gradients, and only Adam's two moments as optimizer state, sharded over DP under ZeRO-1; its step reads the
    weight, gradient and moments and writes the weight and moments (28 bytes)."""
    from hybridpar.topology.cost import optimizer_step_bytes
    from hybridpar.topology.memory import stage_memory
    from hybridpar.topology.software import FLASH_ATTN_TRAINING_2022
    from hybridpar.topology.stages import params_per_rank, stages

    sw = FLASH_ATTN_TRAINING_2022
    m = ModelSpec(32, 2560, 10240, 20, 20, 50264, "gelu", "gpt3-2.7b")
    plan = Plan(m, 2048, 512, dp=8, micro_batch=4, zero_stage=1, gpu="a100-80gb")
    (stage,) = stages(plan)
    n = params_per_rank(plan, stage)
    mem = stage_memory(plan, stage, sw)
    assert mem.params == pytest.approx(6 * n) and mem.grads == pytest.approx(4 * n)
    assert mem.optimizer == pytest.approx(8 * n / 8)
    assert optimizer_step_bytes(sw, 1, 8) == optimizer_step_bytes(sw, 0, 8) == 28
