"""Memory model: ZeRO arithmetic, Korthikanti's activation formulas, largest stage decides."""
from dataclasses import replace

import pytest

from hybridpar.topology.memory import CUDA_CONTEXT_BYTES, EAGER_CUDA_CONTEXT_BYTES, NCCL_CHANNEL_BYTES, PARTS, TIGHT_MARGIN, layer_activation_bytes, model_state_bytes, plan_memory, stage_memory
from hybridpar.topology.models import PRESETS, ModelSpec
from hybridpar.topology.plan import Plan
from hybridpar.topology.software import DEEPSPEED_BF16_PIPE, HYBRIDPAR, MEGATRON_2021, MEGATRON_CORE
from hybridpar.topology.stages import params_per_rank, stages


@pytest.mark.parametrize("zero, expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_example(zero, expected_gb):
    # Rajbhandari et al. 2020, Figure 1: 7.5B parameters, N_d = 64.
    total = sum(model_state_bytes(7.5e9, 64, zero)) / 1e9
    assert total == pytest.approx(expected_gb, abs=0.06)


def test_zero3_shrinks_to_one_over_dp():
    for dp in (1, 8, 64, 1024):
        assert sum(model_state_bytes(1e9, dp, 3)) == pytest.approx(16e9 / dp)
    assert model_state_bytes(1e9, 8, 2, fp32_grads=True)[1] == pytest.approx(4e9 / 8)


def _gpt(a=96, h=12288, layers=96):
    return ModelSpec(layers, h, 4 * h, a, a, 51200, "gelu", "gpt")


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_tp_without_sp(t):
    m, s, b = _gpt(), 2048, 1
    plan = Plan(m, s, 8, tp=t, micro_batch=b)
    expected = s * b * m.hidden * (10 + 24 / t + 5 * m.heads * s / (m.hidden * t))
    assert layer_activation_bytes(plan, MEGATRON_2021) == pytest.approx(expected)


def test_korthikanti_sp_selective_and_full():
    m, s, t = _gpt(), 2048, 8
    sp = Plan(m, s, 8, tp=t, sequence_parallel=True)
    assert layer_activation_bytes(sp, MEGATRON_2021) == pytest.approx(s * m.hidden / t * (34 + 5 * m.heads * s / m.hidden))
    sel = sp.with_(recompute="selective")
    assert layer_activation_bytes(sel, MEGATRON_2021) == pytest.approx(34 * s * m.hidden / t)
    full = sp.with_(recompute="full")
    assert layer_activation_bytes(full, MEGATRON_2021) == pytest.approx(2 * s * m.hidden / t)
    # FlashAttention never stores the scores: as small as selective recomputation, plus its fp32
    # logsumexp per head and token (what its backward reads instead of the softmax).
    flash = MEGATRON_2021.__class__(dropout=True)
    assert layer_activation_bytes(sp, flash) == pytest.approx(34 * s * m.hidden / t + 4 * m.heads * s / t)


def test_cp_splits_activations_and_an_all_gather_keeps_the_whole_sequences_k_and_v():
    """A ring (megatron-core's CP through Transformer Engine) keeps each rank's own tokens: a quarter at CP 4.
    hybridpar's all-gather keeps K and V of all 8,192 tokens, (4 cp - 6) kv / tp bytes more per local token
    (measured: tests/integration/test_activation_audit.py)."""
    from hybridpar.topology.software import MEGATRON_CORE

    m = PRESETS["llama3-70b"]
    kv = m.kv_heads * m.head_dim
    for sw in (MEGATRON_CORE, HYBRIDPAR):
        one = layer_activation_bytes(Plan(m, 8192, 64, tp=8, sequence_parallel=True), sw)
        four = layer_activation_bytes(Plan(m, 8192, 64, tp=8, cp=4, sequence_parallel=True), sw)
        gathered = 2048 * (4 * 4 - 6) * kv / 8 if sw.cp_gathered_kv_kept else 0
        assert four == pytest.approx(one / 4 + gathered)


def test_first_stage_holds_pp_micro_batches_and_interleaving_adds():
    m = PRESETS["llama3-70b"]
    base = Plan(m, 8192, 512, tp=8, pp=8, dp=4, sequence_parallel=True)
    first, *_, last = stages(base)
    a_first = stage_memory(base, first).activations
    a_last = stage_memory(base, last).activations
    per_layer = layer_activation_bytes(base, HYBRIDPAR)
    assert a_first >= 8 * first.layers * per_layer  # p micro-batches in flight
    assert a_last < a_first
    inter = base.with_(vpp=2)
    # Korthikanti: x (1 + (p - 1)/(p v)) on the first stage.
    ratio = stage_memory(inter, first).activations / a_first
    assert ratio == pytest.approx(1 + 7 / 16, rel=0.02)


def test_largest_stage_decides_and_the_parts_add_up_to_the_total():
    m = PRESETS["llama3-8b"]
    plan = Plan(m, 8192, 64, tp=1, pp=4, dp=2, zero_stage=1)
    totals = [stage_memory(plan, s).total for s in stages(plan)]
    assert plan_memory(plan).total == max(totals)
    for s in stages(plan):
        mem = stage_memory(plan, s)
        assert sum(getattr(mem, k) for k in PARTS) == pytest.approx(mem.total)
        shown = mem.gib()  # 2 decimals, the parts rounded to add up to the rounded total exactly
        assert round(sum(v for k, v in shown.items() if k != "total"), 2) == shown["total"] == round(mem.total / 2**30, 2)
        assert all(abs(shown[k] - getattr(mem, k) / 2**30) < 0.01 for k in PARTS)
        assert mem.cuda_context == CUDA_CONTEXT_BYTES and mem.nccl > 0


def test_stacks_before_lazy_module_loading_hold_the_larger_cuda_context():
    from hybridpar.topology.software import DEEPSPEED_PIPE_ZERO1, MEGATRON_2021, MEGATRON_CORE
    plan = Plan(PRESETS["llama3-8b"], 2048, 64, tp=2, pp=2, dp=2, zero_stage=1)
    modern = plan_memory(plan, sw=MEGATRON_CORE)
    assert modern.cuda_context == CUDA_CONTEXT_BYTES
    for sw in (MEGATRON_2021, DEEPSPEED_PIPE_ZERO1):
        old = plan_memory(plan, sw=sw)
        assert old.cuda_context == EAGER_CUDA_CONTEXT_BYTES


def test_a_measured_allocator_reserve_scales_everything_the_allocator_holds():
    from hybridpar.topology.memory import FRAGMENTATION
    from hybridpar.topology.software import DEEPSPEED_PIPE_ZERO1, MEGATRON_2021, MEGATRON_CORE
    plan = Plan(PRESETS["llama3-8b"], 2048, 64, tp=2, pp=2, dp=2, zero_stage=1)
    for sw in (DEEPSPEED_PIPE_ZERO1, MEGATRON_2021):
        mem = plan_memory(plan, sw=sw)
        allocated = mem.total - mem.cuda_context - mem.nccl - mem.fragmentation
        assert mem.fragmentation == pytest.approx(sw.allocator_reserve * allocated)
    assert MEGATRON_2021.allocator_reserve > DEEPSPEED_PIPE_ZERO1.allocator_reserve > 0
    # without a measurement: the assumed share of what is allocated and freed every micro-batch
    mem = plan_memory(plan, sw=MEGATRON_CORE)
    assert MEGATRON_CORE.allocator_reserve is None
    assert mem.fragmentation == pytest.approx(FRAGMENTATION * (mem.activations + mem.logits + mem.pipeline_buffers))


def test_each_communicator_adds_its_nccl_buffers_and_the_network_ones_are_smaller():
    m = PRESETS["llama3-70b"]
    alone = plan_memory(Plan(m, 8192, 64, tp=8, pp=1, dp=1, sequence_parallel=True)).nccl
    with_dp = plan_memory(Plan(m, 8192, 64, tp=8, pp=1, dp=8, sequence_parallel=True)).nccl
    with_pp = plan_memory(Plan(m, 8192, 64, tp=8, pp=8, dp=1, sequence_parallel=True)).nccl
    assert alone == pytest.approx(2 * 32 * NCCL_CHANNEL_BYTES)  # TP and world, both inside the node
    # TP inside the node; DP (or PP) and the world group ring over the network, with fewer channels
    assert with_dp == with_pp == pytest.approx((32 + 4 + 4) * NCCL_CHANNEL_BYTES)
    tied = Plan(replace(_gpt(64, 8192, 80), tied_embeddings=True), 2048, 64, tp=8, pp=8, dp=1, sequence_parallel=True)
    first, middle, _ = stages(tied)
    assert stage_memory(tied, first).nccl - stage_memory(tied, middle).nccl == pytest.approx(4 * NCCL_CHANNEL_BYTES)


def test_logits_on_the_last_stage_only_as_many_bytes_as_the_loss_kernel_holds():
    m = PRESETS["llama3-8b"]
    plan = Plan(m, 8192, 64, tp=2, pp=4, dp=2, micro_batch=2, sequence_parallel=True)
    first, middle, last = stages(plan)
    assert stage_memory(plan, first).logits == stage_memory(plan, middle).logits == 0
    logits_per_rank = 2 * 8192 * m.vocab / 2
    # megatron-core's vocab-parallel loss: the 16-bit logits and their fp32 copy
    assert stage_memory(plan, last).logits == pytest.approx(6 * logits_per_rank)
    # a fused 16-bit loss (flash-attn's xentropy): the logits and their 16-bit gradient
    fused = replace(HYBRIDPAR, cross_entropy="fused-16bit")
    assert stage_memory(plan, last, sw=fused).logits == pytest.approx(4 * logits_per_rank)


def test_deepspeed_pipeline_keeps_each_in_flight_output():
    m = _gpt(64, 14336, 72)
    plan = Plan(m, 2048, 2048, tp=8, pp=12, dp=4, micro_batch=4, zero_stage=1, recompute="full")
    first = stages(plan)[0]
    ds = stage_memory(plan, first, DEEPSPEED_BF16_PIPE).pipeline_buffers
    mega = stage_memory(plan, first, MEGATRON_2021).pipeline_buffers
    assert ds - mega == pytest.approx(12 * 4 * 2048 * 14336 * 2)  # 12 micro-batches in flight on stage 0


def test_fsdp_holds_one_layers_flat_gradient_beside_what_it_concatenates():
    from hybridpar.topology.software import PYTORCH_FSDP, PYTORCH_FSDP_FP32_REDUCE
    from hybridpar.topology.stages import layer_params_per_rank
    m = PRESETS["llama3-8b"]
    plan = Plan(m, 4096, 64, tp=1, pp=1, dp=64, micro_batch=1, zero_stage=3, recompute="full")
    stage = stages(plan)[0]
    core = stage_memory(plan, stage, replace(PYTORCH_FSDP, layer_grad_peak_bytes_per_param=0)).framework_buffers
    layer = layer_params_per_rank(plan)  # 218M parameters per Llama 3 8B layer
    assert stage_memory(plan, stage, PYTORCH_FSDP).framework_buffers - core == pytest.approx(4 * layer)
    assert stage_memory(plan, stage, PYTORCH_FSDP_FP32_REDUCE).framework_buffers - core == pytest.approx(6 * layer)
    assert stage_memory(plan, stage, MEGATRON_CORE).framework_buffers == pytest.approx(core)  # the gathered layers only
    # FSDP's state: no 16-bit weights between gathers, the gradient shard in fp32 whatever the reduction,
    # the fp32 weight with the optimizer: 16 bytes per parameter over DP, as megatron-core's 2 + 2 + 12
    n = params_per_rank(plan, stage)
    for sw in (PYTORCH_FSDP, PYTORCH_FSDP_FP32_REDUCE):
        mem = stage_memory(plan, stage, sw)
        assert (mem.params, mem.grads, mem.optimizer) == (0.0, pytest.approx(4 * n / 64), pytest.approx(12 * n / 64))
        assert mem.optimizer_step_temp == 0


def test_the_optimizer_step_temporary_counts_only_beyond_the_activations_it_reuses():
    m = PRESETS["llama3-8b"]
    small = Plan(m, 128, 8, tp=1, pp=1, dp=8, zero_stage=1)  # tiny activations: the step's temporaries decide
    mem = plan_memory(small, HYBRIDPAR)
    shard = m.total_params / 8
    dynamic = mem.activations + mem.logits + mem.pipeline_buffers
    assert mem.optimizer_step_temp == pytest.approx(8 * shard - dynamic, rel=0.01)
    assert plan_memory(small, MEGATRON_CORE).optimizer_step_temp == 0  # FusedAdam steps in place
    big = Plan(m, 8192, 64, tp=1, pp=1, dp=8, zero_stage=1)
    assert plan_memory(big, HYBRIDPAR).optimizer_step_temp == 0


def test_a_plan_near_capacity_is_tight():
    mem = plan_memory(Plan(PRESETS["llama3-8b"], 8192, 64, dp=8, zero_stage=1))
    assert mem.tight(mem.total / (1 - TIGHT_MARGIN / 2))
    assert not mem.tight(mem.total / (1 - 2 * TIGHT_MARGIN))


def test_embedding_on_first_and_output_on_last():
    m = PRESETS["llama3-8b"]
    plan = Plan(m, 8192, 64, tp=2, pp=4, dp=2, zero_stage=0)
    first, middle, last = stages(plan)
    assert first.layers == middle.layers == last.layers == 8
    p_first, p_mid, p_last = (stage_memory(plan, s).params for s in (first, middle, last))
    # bf16 weights (2 bytes), TP2: the first stage adds its half of the input embedding, the last
    # its half of the (untied) output layer and the whole final RMSNorm weight (hidden elements).
    assert not m.tied_embeddings
    assert p_first - p_mid == 2 * m.vocab * m.hidden / 2
    assert p_last - p_mid == 2 * (m.vocab * m.hidden / 2 + m.hidden)


def test_lighter_end_stages_split_llama3_405b():
    m = PRESETS["llama3-405b"]
    plan = Plan(m, 8192, 2048, tp=8, pp=16, dp=128, lighter_end_stages=True)
    assert not plan.violations()
    assert [s.layers for s in stages(plan)] == [7, 8, 7]
    assert Plan(m, 8192, 2048, tp=8, pp=16, dp=128).violations()  # 126 does not divide by 16


def test_nemo_distributed_fused_adam_holds_bf16_gradients_and_its_state_in_its_dtype():
    """apex DistributedFusedAdam as NeMo 1's recipes configure it (grad_sync_dtype bf16): a 2-byte gradient
    buffer; its state (parameter copy and two moments) in fp32, or in bf16 where the recipe says dtype
    bf16; the Adam step moves that state twice."""
    from dataclasses import replace

    from hybridpar.topology.cost import optimizer_step_bytes
    from hybridpar.topology.software import MEGATRON_CORE, PROFILES

    nemo = PROFILES["nemo-distributed-fused-adam"]
    assert not nemo.fp32_grads and MEGATRON_CORE.fp32_grads
    assert model_state_bytes(1e9, 8, 1, nemo.fp32_grads, optimizer_bytes=nemo.optimizer_state_bytes_per_param) == (
        pytest.approx(2e9), pytest.approx(2e9), pytest.approx(12e9 / 8))
    bf16_state = replace(nemo, optimizer_state_bytes_per_param=6)
    assert model_state_bytes(1e9, 8, 1, optimizer_bytes=6)[2] == pytest.approx(6e9 / 8)
    assert optimizer_step_bytes(MEGATRON_CORE, 1, 8) == 30 and optimizer_step_bytes(bf16_state, 1, 8) == 18


def test_deepspeed_pipeline_gradients_as_each_optimizer_holds_them():
    """BF16_Optimizer under the PipelineEngine keeps the bf16 .grad beside its fp32 accumulation buffer
    (6 bytes per parameter at the peak); DeepSpeed's own ZeRO-1 on 16-bit weights, as BigScience's
    layout sweep ran before BF16_Optimizer existed, holds only the 16-bit .grad (2), and its step
    casts the owned slice to fp32 after the activations are gone."""
    from hybridpar.topology.software import DEEPSPEED_PIPE_ZERO1

    m = _gpt(64, 14336, 72)
    plan = Plan(m, 2048, 2016, tp=8, pp=2, dp=24, micro_batch=1, zero_stage=1, recompute="full")
    first = stages(plan)[0]
    n = params_per_rank(plan, first)
    bf16 = stage_memory(plan, first, DEEPSPEED_BF16_PIPE)
    zero1 = stage_memory(plan, first, DEEPSPEED_PIPE_ZERO1)
    assert bf16.grads == pytest.approx(6 * n) and zero1.grads == pytest.approx(2 * n)
    assert bf16.optimizer == zero1.optimizer == pytest.approx(12 * n / 24)
    assert zero1.optimizer_step_temp == max(0.0, 6 * n / 24 - (zero1.activations + zero1.logits + zero1.pipeline_buffers))


def test_model_states_match_the_allocated_bytes_nemo_2_logs():
    """dgxc-benchmarking v25.04.01 llama3.1/README.md quotes a NeMo 2 log line of its Llama 3.1 8B run on
    8 H100s (TP1 CP2 DP4; bf16 gradients, as the performance recipe sets for BF16 and FP8 alike; weights
    in bf16 either way): "memory_allocated: 44271689728" after a step, when only the weights, gradient
    buffer and sharded optimizer state are left. The planner's states under megatron-core-bf16-grads:
    2 + 2 bytes per parameter plus 12 over DP x CP = 8."""
    from hybridpar.topology.software import PROFILES
    plan = Plan(PRESETS["llama3-8b"], 8192, 128, tp=1, pp=1, cp=2, dp=4, zero_stage=1)
    states = plan_memory(plan, sw=PROFILES["megatron-core-bf16-grads"]).states
    assert states == pytest.approx(44_271_689_728, rel=0.005)
