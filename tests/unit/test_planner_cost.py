"""FLOPs formula against published values; the time model's shape and communication terms."""
from dataclasses import replace

import pytest

from hybridpar.topology.cost import step_cost
from hybridpar.topology.flops import model_flops_per_seq, recompute_flops_per_seq
from hybridpar.topology.hardware import get_gpu
from hybridpar.topology.links import link_time, nccl_latency, sm_contention
from hybridpar.topology.models import PRESETS, ModelSpec
from hybridpar.topology.plan import Plan
from hybridpar.topology.software import HYBRIDPAR

GPT3 = PRESETS["gpt3-175b"]


def test_flops_match_dgx_cloud_examples():
    # NVIDIA dgxc-benchmarking READMEs (formulas.md §2).
    assert model_flops_per_seq(PRESETS["llama3-8b"], 8192) == pytest.approx(4.74e14, rel=0.005)
    assert model_flops_per_seq(GPT3, 2048) == pytest.approx(2.20e15, rel=0.005)
    nemotron = ModelSpec(96, 18432, 73728, 96, 8, 256000, "gelu", "nemotron4-340b")
    assert model_flops_per_seq(nemotron, 4096) == pytest.approx(8.62e15, rel=0.005)


def test_full_recompute_adds_one_forward():
    m = PRESETS["llama3-70b"]
    extra = recompute_flops_per_seq(m, 8192, "full")
    logits = 6 * m.vocab * m.hidden * 8192
    assert extra == pytest.approx((model_flops_per_seq(m, 8192) - logits) / 3)
    assert recompute_flops_per_seq(m, 8192, "selective", flash=True) == 0
    assert recompute_flops_per_seq(m, 8192, "selective", flash=False) > 0


def _plan(**kw):
    base = dict(model=PRESETS["llama3-70b"], seq_len=8192, global_batch=256, tp=8, pp=4, dp=2,
                micro_batch=1, zero_stage=1, sequence_parallel=True)
    base.update(kw)
    return Plan(**base)


def test_bubble_follows_p_minus_one_over_vm():
    c1 = step_cost(_plan())
    m = 256 // 2
    per_mb = (c1.step_time_s - c1.bubble_s - c1.dp_s - c1.optimizer_s) / m
    assert c1.bubble_s == pytest.approx(3 * per_mb, rel=1e-6)
    c2 = step_cost(_plan(vpp=2))  # interleaved: (p - 1)/v = 3/2 micro-batches of bubble
    per_mb2 = (c2.step_time_s - c2.bubble_s - c2.dp_s - c2.optimizer_s) / m
    assert c2.bubble_s == pytest.approx(3 / 2 * per_mb2, rel=1e-6)


def test_tp_collectives_slow_down_across_nodes():
    inside = step_cost(_plan(tp=8, pp=4, dp=2, gpus_per_node=8))
    across = step_cost(_plan(tp=8, pp=4, dp=2, gpus_per_node=4))
    assert across.tp_s > 5 * inside.tp_s
    assert step_cost(_plan(tp=1, pp=8, dp=8, global_batch=256, zero_stage=3)).tp_s == 0


def test_userbuffers_overlap_each_collective_chunk_by_chunk():
    """ub_ring_exchange: tp - 1 exchange steps, each beside one chunk's GEMM, then the last chunk: a
    collective longer than the GEMM shows through by its excess and one chunk, a shorter one costs only
    the chunks. ub_pipeline: the GEMM in UB_RS_SPLITS parts, each part's reduce-scatter beside the next
    part, the last part's after it."""
    from hybridpar.topology.userbuffers import UB_RS_SPLITS, ub_pipeline, ub_ring_exchange

    assert ub_ring_exchange(7.0, 0.5, 8) == pytest.approx(7.0 + 0.5)  # communication-bound
    assert ub_ring_exchange(1.0, 0.5, 8) == pytest.approx(8 * 0.5)  # GEMM-bound: the chunks alone
    assert ub_pipeline(4.0, 0.1) == pytest.approx(0.1 + (UB_RS_SPLITS - 1) * 1.0 + 1.0)
    assert ub_pipeline(0.4, 1.0) == pytest.approx(UB_RS_SPLITS * 1.0 + 0.1)


def test_tp_comm_overlap_hides_forward_collectives_inside_a_node():
    """Software.tp_comm_overlap (Transformer Engine's userbuffers): Llama 3 70B at TP8, 8K tokens, H100.
    The layer's exposed TP time falls, by at most the forward collectives and output-gradient gathers it
    overlaps (what remains: each overlapped collective's last step, the chunked GEMMs' lost rate, and the
    backward's bulk collectives), its compute is unchanged, and without sequence parallelism or across
    nodes nothing changes (userbuffers need both)."""
    from hybridpar.topology.cost import _tp_allreduce_equivalent, layer_time
    from hybridpar.topology.software import MEGATRON_CORE

    m, h100 = PRESETS["llama3-70b"], get_gpu("h100-80gb")
    ub = replace(MEGATRON_CORE, tp_comm_overlap=True)
    args = (m, h100, "bf16", 8192, 1, 8, 1)
    plain, over = layer_time(*args, True, "none", MEGATRON_CORE, 8), layer_time(*args, True, "none", ub, 8)
    ar = _tp_allreduce_equivalent(8192 * m.hidden * 2, h100, 8, True, 8)
    assert (over.fwd, over.bwd) == (plain.fwd, plain.bwd)
    assert plain.tp - 3 * ar <= over.tp < 0.8 * plain.tp
    assert layer_time(*args, False, "none", ub, 8) == layer_time(*args, False, "none", MEGATRON_CORE, 8)
    assert layer_time(*args, True, "none", ub, 4) == layer_time(*args, True, "none", MEGATRON_CORE, 4)


def test_dp_ring_cost_grows_toward_2x_bytes(monkeypatch):
    from hybridpar.topology import links

    monkeypatch.setattr(links, "NCCL_BASE_LAT_S", 0.0)  # the bandwidth term alone (DP is not cached)
    monkeypatch.setattr(links, "NCCL_HOP_LAT_S", {"nvlink": 0.0, "network": 0.0})
    from hybridpar.topology.links import LINK_EFFICIENCY
    from hybridpar.topology.software import MEGATRON_2021
    from hybridpar.topology.stages import params_per_rank, stages

    plan = _plan(dp=2, global_batch=256)
    two = step_cost(plan, MEGATRON_2021).dp_s
    # Megatron-LM 2021 all-reduces the fp16 gradients after the flush, not overlapped: a ring
    # all-reduce over 2 ranks moves 2 x (2 - 1)/2 of the largest stage's gradient bytes over the
    # network (a replica spans 4 nodes, so DP peers sit on different nodes).
    grads = 2 * max(params_per_rank(plan, s) for s in stages(plan))
    assert two == pytest.approx(2 * (1 / 2) * grads / (get_gpu("h100-80gb").network_gbps * 1e9 * LINK_EFFICIENCY),
                                rel=1e-9)
    many = step_cost(_plan(dp=64, global_batch=256), MEGATRON_2021).dp_s
    assert many / two == pytest.approx((63 / 64) / (1 / 2), rel=1e-6)


def test_every_collective_call_pays_nccls_latency():
    """NCCL's tuning model (Ring/Simple): 8.4 us per call, 3.4 us per NVLink ring step, 9.6 us per
    step across nodes, 1.9x for a multi-node ring all-reduce."""
    assert nccl_latency(2 * 7, 8, 1, allreduce=True) == pytest.approx(8.4e-6 + 14 * 3.4e-6)
    assert nccl_latency(63, 64, 64) == pytest.approx(8.4e-6 + 63 * 9.6e-6)
    assert nccl_latency(2 * 15, 16, 2, allreduce=True) == pytest.approx(1.9 * (8.4e-6 + 28 * 3.4e-6 + 2 * 9.6e-6))
    assert nccl_latency(0, 1, 1) == 0
    # a small TP all-reduce is latency-bound: 8 ranks, 64 tokens of a 4096 hidden size
    # with every TP collective exposed (4 all-reduces per layer, 32 layers, 2 micro-batches), their
    # latency is most of the time
    tiny = _plan(model=PRESETS["llama3-8b"], seq_len=64, global_batch=2, tp=8, pp=1, dp=1, sequence_parallel=False)
    modelled = replace(get_gpu("h100-80gb"), nvlink_collectives=None)  # the model, not H100's measured table
    exposed = step_cost(tiny, replace(HYBRIDPAR, tp_bwd_overlap=False), gpu=modelled).tp_s
    assert 0.8 * exposed < 4 * 2 * 32 * nccl_latency(14, 8, 1, allreduce=True) < exposed


def test_mfu_is_model_flops_over_peak():
    c = step_cost(_plan())
    gpu = get_gpu("h100-80gb")
    assert c.mfu == pytest.approx(c.model_flops / c.step_time_s / 64 / (gpu.bf16_tflops * 1e12))
    assert 0.2 < c.mfu < gpu.gemm_fraction


def test_overlapped_dp_reduction_exposes_its_last_bucket():
    """ZeRO-0 in one node, a long backward: the all-reduce issued from the last backward hides
    behind it except the last 40M-element bucket (the first layers'), complete only at its end;
    while hidden, the SMs NCCL holds are lost to the backward (links.sm_contention)."""
    from dataclasses import replace

    from hybridpar.topology.software import GRAD_BUCKET_NUMEL
    from hybridpar.topology.software import HYBRIDPAR
    from hybridpar.topology.stages import params_per_rank, stages

    plan = Plan(model=PRESETS["llama3-8b"], seq_len=8192, global_batch=16, tp=4, dp=2, micro_batch=4,
                zero_stage=0, sequence_parallel=True)
    after = step_cost(plan, replace(HYBRIDPAR, overlap_grad_reduce=False)).dp_s
    during = step_cost(plan, HYBRIDPAR).dp_s
    n = max(params_per_rank(plan, s) for s in stages(plan))
    shown = after * GRAD_BUCKET_NUMEL / n
    # the hidden rest still holds NCCL's 24 blocks of an NVLink ring: 24 of the H100's 132 SMs
    assert after > 0 and during == pytest.approx(shown + (after - shown) * 24 / 132, rel=1e-9)


def _megatron_order(p: int, rank: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """(kind, model chunk, micro-batch) in the order megatron-core's schedules run them on rank:
    warm-up forwards, 1F1B pairs, cool-down backwards; interleaved: groups of p micro-batches per
    chunk, backwards from the last chunk."""
    total = m * v
    if v == 1:
        warmup = min(p - rank - 1, m)
    else:
        warmup = min(2 * (p - rank - 1) + (v - 1) * p, total)
    fwd = lambda k: ("F", (k // p) % v, (k // (p * v)) * p + k % p)
    bwd = lambda k: ("B", v - 1 - (k // p) % v, (k // (p * v)) * p + k % p)
    ops = [fwd(k) for k in range(warmup)]
    for k in range(warmup, total):
        ops += [fwd(k), bwd(k - warmup)]
    return ops + [bwd(k) for k in range(total - warmup, total)]


def _simulate(p: int, m: int, v: int, f: float, b: float) -> tuple[float, float]:
    """Ideal timeline (no communication time): returns (step, first pipeline rank's first
    backward start)."""
    orders = [_megatron_order(p, r, m, v) for r in range(p)]
    done, clock, nxt = {}, [0.0] * p, [0] * p
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while nxt[r] < len(orders[r]):
                kind, c, i = orders[r][nxt[r]]
                if kind == "F":
                    dep = ("F", r - 1, c, i) if r else (("F", p - 1, c - 1, i) if c else None)
                else:
                    dep = ("B", r + 1, c, i) if r < p - 1 else (("B", 0, c + 1, i) if c < v - 1 else ("F", r, c, i))
                if dep is not None and dep not in done:
                    break
                start = max(clock[r], done[dep] if dep else 0.0)
                clock[r] = start + (f if kind == "F" else b) / v
                done[(kind, r, c, i)] = clock[r]
                nxt[r] += 1
                moved = True
    assert all(nxt[r] == len(orders[r]) for r in range(p)), "schedule deadlocked"
    first_bwd = min(t for (kind, r, _, _), t in done.items() if kind == "B" and r == 0) - b / v
    return max(clock), first_bwd


@pytest.mark.parametrize("p,m,v", [(4, 8, 1), (16, 32, 1), (16, 16, 1), (4, 8, 2), (16, 32, 2),
                                   (16, 32, 8), (16, 16, 8), (8, 24, 3)])
def test_reduction_window_matches_a_simulated_schedule(p, m, v):
    from hybridpar.topology.cost import after_first_backward
    f, b = 1.0, 2.1
    step, first_bwd = _simulate(p, m, v, f, b)
    assert step == pytest.approx(m * (f + b) + (p - 1) / v * (f + b))
    assert step - first_bwd == pytest.approx(after_first_backward(m, f + b, f, p, v))


def test_classic_zero2_reduce_scatters_hide_behind_later_micro_batches():
    from dataclasses import replace

    from hybridpar.topology.software import MEGATRON_CORE
    # Llama 3 405B, TP8 PP16 DP64, 32 micro-batches: each fp32 reduce-scatter (0.31 s) outlasts
    # its own micro-batch's backward but the stream of 32 is mostly hidden by those that follow.
    plan = Plan(PRESETS["llama3-405b"], 8192, 2048, tp=8, pp=16, dp=64, micro_batch=1, zero_stage=2,
                sequence_parallel=True, lighter_end_stages=True)
    one_at_a_time = step_cost(plan, replace(MEGATRON_CORE, overlap_grad_reduce=False)).dp_s
    streamed = step_cost(plan, MEGATRON_CORE).dp_s
    cost = step_cost(plan, MEGATRON_CORE)
    assert one_at_a_time > 9.0  # 32 x 0.31 s, all exposed
    # hidden at most behind all the step's compute and NVLink time, and at least two thirds hidden
    assert one_at_a_time - cost.compute_s - cost.tp_s < streamed < one_at_a_time / 3
    zero1 = step_cost(replace(plan, zero_stage=1), MEGATRON_CORE).dp_s
    assert streamed > zero1  # 32 reduce-scatters instead of one


def test_zero_group_of_cp_ranks_inside_a_node_runs_on_nvlink():
    from dataclasses import replace
    # TP4 x CP2 without DP: ZeRO's group is the two CP ranks, inside an 8-GPU node, not across a
    # 4-GPU one.
    plan = Plan(PRESETS["llama3-70b"], 8192, 64, tp=4, cp=2, pp=4, dp=1, micro_batch=1, zero_stage=1,
                sequence_parallel=True)
    inside = step_cost(plan).dp_s
    across = step_cost(replace(plan, gpus_per_node=4)).dp_s
    assert 0 < inside < across / 5


def test_unfused_gradient_accumulation_costs_its_bytes_every_micro_batch():
    from dataclasses import replace

    from hybridpar.topology.kernels import hbm_time
    from hybridpar.topology.software import DEEPSPEED_BF16_PIPE, GRAD_ADD_CAST_COPY, GRAD_ADD_MIXED, MEGATRON_2021
    from hybridpar.topology.stages import params_per_rank, stages
    # BLOOM's layout: DeepSpeed's BF16_Optimizer casts each bf16 gradient to an fp32 temporary
    # before adding it (18 B/param), Megatron-LM 2021 adds with an on-the-fly cast (10 B/param).
    m = ModelSpec(70, 14336, 57344, 112, 112, 250880, "gelu", "bloom", tied_embeddings=True)
    plan = Plan(m, 2048, 2048, tp=4, pp=12, dp=8, micro_batch=2, zero_stage=1, recompute="full",
                gpu="a100-80gb", lighter_end_stages=True)
    a100 = get_gpu("a100-80gb")
    n_params = max(params_per_rank(plan, s) for s in stages(plan))
    fused = step_cost(plan, replace(DEEPSPEED_BF16_PIPE, grad_accum_bytes_per_param=0), a100)
    for sw, nbytes in [(DEEPSPEED_BF16_PIPE, GRAD_ADD_CAST_COPY), (MEGATRON_2021, GRAD_ADD_MIXED)]:
        assert sw.grad_accum_bytes_per_param == nbytes
    cast_copy = step_cost(plan, DEEPSPEED_BF16_PIPE, a100)
    per_mb = hbm_time(18 * n_params, a100)
    # every micro-batch pays it, and the pipeline's fill and drain stretch with the longer backward
    expected = (plan.grad_accum + (plan.pp - 1) / plan.vpp) * per_mb
    assert cast_copy.step_time_s - fused.step_time_s == pytest.approx(expected, rel=0.05)
    assert 5.0 < expected < 6.5  # 4.0B parameters on an end stage, 128 micro-batches + 11 of fill and drain


def test_fsdp_moves_each_gathered_gradient_through_hbm_every_micro_batch():
    from hybridpar.topology.kernels import hbm_time
    from hybridpar.topology.software import PROFILES, PYTORCH_FSDP, PYTORCH_FSDP_FP32_REDUCE
    from hybridpar.topology.stages import params_per_rank, stages
    # the flat gradient's concatenation (2 + 2) and in-place pre-division (2 + 2 in bf16); with fp32
    # reduction a cast (2 + 4) and the division in fp32 (4 + 4)
    assert (PYTORCH_FSDP.grad_accum_bytes_per_param, PYTORCH_FSDP_FP32_REDUCE.grad_accum_bytes_per_param) == (8, 18)
    assert (PYTORCH_FSDP.fp32_grads, PYTORCH_FSDP_FP32_REDUCE.fp32_grads) == (False, True)
    assert PYTORCH_FSDP.zero_stages == PYTORCH_FSDP_FP32_REDUCE.zero_stages == (3,)  # FULL_SHARD only
    assert {PROFILES["pytorch-fsdp"], PROFILES["pytorch-fsdp-fp32-reduce"]} == {PYTORCH_FSDP, PYTORCH_FSDP_FP32_REDUCE}
    # MPT-13B on one node of 8 A100 80GB, FULL_SHARD, micro-batch 2, 3 micro-batches per step
    m = ModelSpec(40, 5120, 20480, 40, 40, 50368, "gelu", "mpt-13b", tied_embeddings=True)
    plan = Plan(m, 2048, 48, tp=1, pp=1, dp=8, micro_batch=2, zero_stage=3, recompute="none", gpu="a100-80gb")
    a100 = get_gpu("a100-80gb")
    n_params = params_per_rank(plan, stages(plan)[0])
    for sw in (PYTORCH_FSDP, PYTORCH_FSDP_FP32_REDUCE):
        without = step_cost(plan, replace(sw, grad_accum_bytes_per_param=0), a100)
        expected = plan.grad_accum * hbm_time(sw.grad_accum_bytes_per_param * n_params, a100)
        assert step_cost(plan, sw, a100).compute_s - without.compute_s == pytest.approx(expected, rel=1e-6)
    # 13B parameters x 8 bytes over 85% of 2.039 TB/s, three times: 0.18 s of a step near 5 s
    assert 0.17 < plan.grad_accum * hbm_time(8 * n_params, a100) < 0.19


def test_the_cross_entropy_costs_the_bytes_its_kernel_moves_over_the_vocabulary():
    from hybridpar.topology.kernels import hbm_time
    from hybridpar.topology.software import CROSS_ENTROPY_KERNELS
    # MPT-125M's shape on one A100: the loss over 50,368 logits per token weighs against small layers.
    m = ModelSpec(12, 768, 3072, 12, 12, 50368, "gelu", "mpt-125m", tied_embeddings=True)
    plan = Plan(m, 2048, 16, tp=1, pp=1, dp=1, micro_batch=8, gpu="a100-80gb")
    a100 = get_gpu("a100-80gb")
    megatron, fused = CROSS_ENTROPY_KERNELS["vocab-parallel-fp32"], CROSS_ENTROPY_KERNELS["fused-16bit"]
    assert (megatron.forward_bytes, megatron.backward_bytes) == (38, 14)
    assert (fused.forward_bytes, fused.backward_bytes) == (4, 4)
    # megatron-core's cross_entropy_loss_fusion: the same steps, one pass per compiled function
    assert (CROSS_ENTROPY_KERNELS["vocab-parallel-fused"].forward_bytes,
            CROSS_ENTROPY_KERNELS["vocab-parallel-fused"].backward_bytes) == (22, 10)
    slow = step_cost(plan, HYBRIDPAR, a100)
    fast = step_cost(plan, replace(HYBRIDPAR, cross_entropy="fused-16bit"), a100)
    logits = 8 * 2048 * 50368
    expected = plan.grad_accum * hbm_time((52 - 8) * logits, a100)
    assert slow.step_time_s - fast.step_time_s == pytest.approx(expected, rel=1e-9)
    assert 0.05 < expected / slow.step_time_s < 0.2  # a term a small model's plan must not drop


def test_torch_ddp_hides_the_all_reduce_behind_the_last_backward():
    """Narayanan et al.'s 1.7B-18B runs used torch DDP (examples/sc21/run_table_1.sh DDP=torch):
    its bucketed all-reduce overlaps the last micro-batch's backward, where Megatron's local DDP
    all-reduces after the schedule. The same layout differs by (nearly) the whole DP time, and
    fp16 gradients accumulate in place (6 B/param), not into an fp32 main grad (10 B/param)."""
    from hybridpar.topology.software import GRAD_BUCKET_NUMEL
    from hybridpar.topology.software import MEGATRON_2021, MEGATRON_2021_TORCH_DDP

    m = ModelSpec(24, 2304, 9216, 24, 24, 51200, "gelu", "gpt-1.7b", tied_embeddings=True)
    plan = Plan(m, 2048, 512, tp=1, pp=1, dp=32, micro_batch=16, zero_stage=0, recompute="full", precision="fp16",
                gpu="a100-80gb")
    local, torch_ddp = step_cost(plan, MEGATRON_2021), step_cost(plan, MEGATRON_2021_TORCH_DDP)
    # 3.4 GB of fp16 gradients in a ring over 32 GPUs on 4 nodes: each node's 8 members are consecutive
    # in it (Megatron's rank order), so the ring leaves a node once, over the node's 8 HDR NICs
    ring = link_time(2 * 31 / 32 * 2 * m.total_params, 8 * get_gpu("a100-80gb").network_gbps)
    assert ring < local.dp_s < ring + 0.02  # plus NCCL latency: 2 calls per 40M-element bucket, 43 buckets
    # exposed: its last bucket; hidden, the rest still holds a cross-node ring's 16 blocks, 16 of the
    # A100's 108 SMs (links.sm_contention)
    last = GRAD_BUCKET_NUMEL / m.total_params
    assert torch_ddp.dp_s == pytest.approx(local.dp_s * (last + (1 - last) * 16 / 108), rel=1e-9)
    assert torch_ddp.step_time_s < local.step_time_s - 0.8 * local.dp_s


def test_megatron_lm_2022_is_2021_with_sequence_parallelism_and_selective_recomputation():
    """Korthikanti et al. 2022's stack: GPT-3 175B at TP8 PP8 with SP and selective recomputation is
    faster than Megatron-LM 2021's full recomputation of the same layout, and ZeRO-2 is not part of it."""
    from hybridpar.topology.search import Request, search
    from hybridpar.topology.software import MEGATRON_2021, PROFILES

    sw = PROFILES["megatron-lm-2022"]
    assert sw.sequence_parallel and "selective" in sw.recompute_modes and not sw.flash_attention
    pins = {"tp": 8, "pp": 8, "cp": 1, "dp": 1, "micro_batch": 1, "vpp": 1, "zero_stage": 0}
    new = search(Request(GPT3, 64, 64, 2048, gpu="a100-80gb", software=sw, pins={**pins, "recompute": "selective"}))
    old = search(Request(GPT3, 64, 64, 2048, gpu="a100-80gb", software=MEGATRON_2021, pins={**pins, "recompute": "full"}))
    assert new.plans[0].plan.sequence_parallel and new.plans[0].cost.step_time_s < 0.9 * old.plans[0].cost.step_time_s
    with pytest.raises(Exception, match="ZeRO-2 is not part of Megatron-LM 2022"):
        search(Request(GPT3, 64, 64, 2048, gpu="a100-80gb", software=sw, pins={"zero_stage": 2}))


def test_kernels_cost_their_boundaries_and_their_issue():
    """kernels.kernel_bound: every kernel of a layer adds KERNEL_GAP_S; when the GPU work is shorter
    than the host's issue of the kernels, the host's time is the layer's. Large layers barely notice
    (under 1% for Llama 3 8B at 8K on H100), tiny ones are issue-bound."""
    from hybridpar.topology.cost import layer_time
    from hybridpar.topology.kernels import HOST_OP_S, KERNEL_GAP_S, kernel_bound

    assert kernel_bound(1e-3, 50) == pytest.approx(1e-3 + 50 * KERNEL_GAP_S)
    assert kernel_bound(1e-6, 50) == pytest.approx(50 * HOST_OP_S)
    h100, m = get_gpu("h100-80gb"), PRESETS["llama3-8b"]
    none = replace(HYBRIDPAR, kernels_per_layer=(0, 0))
    big = [layer_time(m, h100, "bf16", 8192, 1, 1, 1, True, "none", sw, 8) for sw in (HYBRIDPAR, none)]
    assert 1 < (big[0].fwd + big[0].bwd) / (big[1].fwd + big[1].bwd) < 1.01
    tiny = layer_time(m, h100, "bf16", 16, 1, 8, 1, True, "none", HYBRIDPAR, 8)
    assert (tiny.fwd, tiny.bwd) == (pytest.approx(43 * HOST_OP_S), pytest.approx(58 * HOST_OP_S))


def test_blocking_launches_add_every_kernels_issue_to_its_work():
    """With CUDA_LAUNCH_BLOCKING=1 (BigScience's runs on Jean Zay) the host issues a kernel only after
    the previous one finished: the issue adds to the GPU's work instead of hiding behind it, for large
    layers and tiny ones alike, and cases.py sets it for those runs alone."""
    from hybridpar.topology.cases import case_software, load_cases, VALIDATION_PATH
    from hybridpar.topology.cost import layer_time
    from hybridpar.topology.kernels import HOST_OP_S, KERNEL_GAP_S, kernel_bound

    assert kernel_bound(1e-3, 50, launch_blocking=True) == pytest.approx(1e-3 + 50 * (KERNEL_GAP_S + HOST_OP_S))
    assert kernel_bound(1e-6, 50, launch_blocking=True) == pytest.approx(1e-6 + 50 * (KERNEL_GAP_S + HOST_OP_S))
    h100, m = get_gpu("h100-80gb"), PRESETS["llama3-8b"]
    blocking = replace(HYBRIDPAR, launch_blocking=True)
    free, held = (layer_time(m, h100, "bf16", 8192, 1, 1, 1, True, "none", sw, 8) for sw in (HYBRIDPAR, blocking))
    assert held.fwd - free.fwd == pytest.approx(43 * HOST_OP_S)
    runs = load_cases(VALIDATION_PATH)
    assert {r["id"].startswith("bloom") for r in runs if case_software(r)[0].launch_blocking} == {True}
    assert any(case_software(r)[0].launch_blocking for r in runs)


def test_a_hidden_collective_costs_the_compute_the_sms_nccl_holds():
    """A collective behind compute is not free: NCCL's blocks hold 24 SMs for a ring inside an
    NVSwitch node, 16 for one across nodes (links.NCCL_COLLECTIVE_CTAS), and the compute beside it
    runs on the rest. ZeRO-3 in one node, its per-micro-batch gathers and reduce-scatter all hidden:
    the step pays 24/132 of their time, not none of it."""
    from hybridpar.topology.software import MEGATRON_CORE

    h100, a100 = get_gpu("h100-80gb"), get_gpu("a100-80gb")
    assert sm_contention(1.0, h100, 1) == pytest.approx(24 / 132)
    assert sm_contention(1.0, a100, 2) == pytest.approx(16 / 108)
    plan = Plan(model=PRESETS["llama3-8b"], seq_len=8192, global_batch=32, tp=1, dp=8, micro_batch=2,
                zero_stage=3)
    exposed = step_cost(plan, replace(MEGATRON_CORE, overlap_grad_reduce=False))
    hidden = step_cost(plan, MEGATRON_CORE)
    assert exposed.dp_s < exposed.compute_s  # short enough to hide entirely
    assert hidden.dp_s == pytest.approx(exposed.dp_s * 24 / 132, rel=1e-9)
