"""Time per optimizer step for a Plan: each layer's kernels (topology/kernels.py), its collectives,
the pipeline bubble, the DP reduction, the optimizer; throughput and MFU (topology/flops.py) from those.

Assumptions (docs/planner.md lists them with the rest):
* A layer, per micro-batch: its GEMMs, attention core and memory-bound work at kernels.py's rates,
  then kernels.kernel_bound for its launches; full recomputation repeats the forward.
* Collectives: ring cost, at links.LINK_EFFICIENCY of the link's per-direction peak. TP: per layer 4
  all-reduce equivalents (5 with sequence parallelism), plus the embedding's and output layer's
  on the end stages; forward ones exposed, megatron-core's async column-parallel backward ones
  hidden behind the GEMM they precede (software.Software.tp_bwd_overlap). A collective hidden
  behind compute still costs the compute the SMs NCCL holds (links.sm_contention). CP and
  (non-interleaved) PP transfers exposed, PP per rank (end stages send one way). DP overlap as in
  software.Software.
* Step = m micro-batches on the slowest pipeline rank + bubble (p - 1)/v of them + exposed DP
  communication + optimizer step.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from math import ceil

from .eager_layer import eager_layer_bytes
from .flops import causal_attention_flops, model_flops_per_seq
from .fp8 import (AMAX_BYTES, CURRENT, CURRENT_SCALING_KERNELS, GATHER_SHARE, TRANSFORMER_ENGINE, amax_reductions,
                  current_scaling_bytes, layer_cast_bytes, layer_cast_kernels)
from .hardware import GPU, get_gpu
from .kernels import (FLASH_BACKWARD_RATIO, ROPE_UNFUSED_HBM, ROPE_UNFUSED_PASSES, SWIGLU_UNFUSED_HBM,
                      SWIGLU_UNFUSED_PASSES, attention_kernel_slowdown, attention_shape_factor, gemm_fwd_bwd, gemm_time,
                      hbm_time, kernel_bound, unfused_attention_core, unfused_attention_slowdown, unfused_time)
from .links import (allreduce_time, collective_time, dp_link_gbps, dp_ranks_per_node, group_nodes, link_time,
                    nccl_latency, nccl_sm_share, pp_crosses_nodes, sm_contention)
from .models import ModelSpec
from .plan import RECOMPUTED_ATTENTION, RECOMPUTED_FORWARDS, Plan
from .software import CROSS_ENTROPY_KERNELS, GRAD_BUCKET_NUMEL, HYBRIDPAR, Software
from .stages import Stage, params_per_rank, stages
from .userbuffers import UB_BULK_SMS, userbuffers_tp_time


def optimizer_step_bytes(sw: Software, zero_stage: int, zero_group: int) -> int:
    """HBM bytes of the optimizer step per parameter of the optimizer shard: what the stack's step was
    counted to move (Software.optimizer_step_bytes_counted), else a fused Adam's: read and write the
    master weights, momentum and variance (2 x 12 in fp32, 2 x 6 in bf16), read the gradient as fp32
    (4), write the 16-bit weight (2)."""
    if sw.optimizer_step_bytes_counted is not None:
        zero0_alone, sharded_alone, replicated = sw.optimizer_step_bytes_counted
        if zero_group > 1:
            return replicated
        return zero0_alone if zero_stage == 0 else sharded_alone
    return 2 * sw.optimizer_state_bytes_per_param + 4 + 2


@dataclass(frozen=True)
class LayerTime:
    """One transformer layer, one micro-batch, one GPU (seconds)."""
    fwd: float  # compute
    bwd: float  # compute, including recomputation
    tp: float  # exposed TP collectives, fwd + bwd
    cp: float  # exposed CP K/V exchange, fwd + bwd


def _tp_bw(gpu: GPU, tp: int, gpus_per_node: int) -> float:
    return gpu.nvlink_gbps if tp <= gpus_per_node else gpu.network_gbps


def _tp_allreduce_equivalent(nbytes: float, gpu: GPU, tp: int, sp: bool, gpus_per_node: int) -> float:
    """One all-reduce equivalent of TP over an activation of ``nbytes``: an all-reduce, or with sequence
    parallelism an all-gather and a reduce-scatter of it (links.collective_time)."""
    bw, nodes = _tp_bw(gpu, tp, gpus_per_node), group_nodes(tp, tp, gpus_per_node)
    if sp:
        return (collective_time("all-gather", nbytes, tp, nodes, bw, gpu)
                + collective_time("reduce-scatter", nbytes, tp, nodes, bw, gpu))
    return collective_time("all-reduce", nbytes, tp, nodes, bw, gpu)


def _with_contention(comm: float, shown: float, gpu: GPU, nodes: int, compute: float = float("inf")) -> float:
    """What a collective of ``comm`` seconds costs the step when ``shown`` of it is exposed: that
    part, and the compute's loss to the SMs NCCL holds while the rest runs behind it
    (links.sm_contention), on at most ``compute`` seconds of compute."""
    return shown + sm_contention(min(comm - shown, compute), gpu, nodes)


def _hidden(comm: float, gemm: float, sw: Software, gpu: GPU, nodes: int) -> float:
    """Cost of an async TP collective issued before a GEMM it can overlap, on NCCL's channels."""
    if not sw.tp_bwd_overlap:
        return comm
    return _beside_gemm(comm, gemm, nccl_sm_share(gpu, nodes))


def _beside_gemm(comm: float, gemm: float, sm_share: float) -> float:
    """A collective of ``comm`` seconds beside a GEMM of ``gemm``: what outlasts the GEMM, and the GEMM's
    loss to the ``sm_share`` of the SMs the collective holds meanwhile."""
    return max(0.0, comm - gemm) + min(comm, gemm) * sm_share


@lru_cache(maxsize=None)
def layer_time(m: ModelSpec, gpu: GPU, precision: str, seq: int, mb: int, tp: int, cp: int,
               sp: bool, recompute: str, sw: Software, gpus_per_node: int) -> LayerTime:
    peak = gpu.peak_tflops(precision) * 1e12
    peak16 = gpu.bf16_tflops * 1e12
    te_fp8 = precision == "fp8"
    if te_fp8 and sw.fp8 != TRANSFORMER_ENGINE:
        raise ValueError(f"{sw.name} has no fp8 training to cost")
    in_bytes = 1 if te_fp8 else 2
    h, f, kv, d = m.hidden, m.ffn_hidden, m.kv_heads * m.head_dim, m.head_dim
    s_loc = seq // cp
    tokens = mb * s_loc
    fwd = bwd = 0.0
    up = f * (2 if m.mlp == "swiglu" else 1)
    gemms = []  # (k, n, forward, input-gradient, weight-gradient) of QKV, proj, fc1, fc2
    for k_dim, n_dim in ((h, (h + 2 * kv) // tp), (h // tp, h), (h, up // tp), (f // tp, h)):
        gf = gemm_time(tokens, k_dim, n_dim, gpu, peak, 1, in_bytes)
        dgrad = gemm_time(tokens, n_dim, k_dim, gpu, peak, 1, in_bytes)
        wgrad = gemm_time(k_dim, tokens, n_dim, gpu, peak, 1, in_bytes)
        fwd, bwd = fwd + gf, bwd + dgrad + wgrad
        gemms.append((k_dim, n_dim, gf, dgrad, wgrad))
    heads = m.heads // tp
    if sw.flash_attention:
        # With context parallelism each kernel call sees one ring step's keys, seq / cp (megatron-core's
        # CP through Transformer Engine: cp steps per layer, each a FlashAttention call on the local
        # queries and one peer's keys and values), so its fixed per-query-block cost is amortised over
        # s / cp, not s.
        fraction = ((sw.attention_fraction or gpu.attention_fraction) * gpu.sustained_clock
                    * attention_shape_factor(seq // cp, d, gpu.attention_curve))
        af = causal_attention_flops(mb, s_loc, seq, heads, d) / (peak16 * fraction)
        ab = FLASH_BACKWARD_RATIO * af
        slow_f, slow_b = attention_kernel_slowdown(sw.attention_kernel, seq // cp, d)
        af, ab = af * slow_f, ab * slow_b
    else:
        # the GEMMs and softmax at the measured shortfall of their roofline (kernels.unfused_attention_slowdown);
        # dropout on the probabilities: a mask byte and the 16-bit result, read again backward
        core_f, core_b = unfused_attention_core(s_loc, seq, d, mb * heads, gpu)
        slowdown = unfused_attention_slowdown(gpu, seq, d)
        scores = mb * heads * s_loc * seq
        drop_f, drop_b = (5, 5) if sw.dropout else (0, 0)
        af = core_f * slowdown + hbm_time(scores * drop_f, gpu)
        ab = core_b * slowdown + hbm_time(scores * drop_b, gpu)
    fwd, bwd = fwd + af, bwd + ab
    before_elementwise = fwd
    # Norms (2 x read+write h) and residual adds (2 x 2 reads + 1 write), 2 bytes each, split
    # over TP only with sequence parallelism; activation function on the TP-split intermediate.
    mask = 1 if sw.dropout else 0
    hidden_bytes = ((2 * 2 * 2 if sw.norm_fusion else 0) + 2 * 3 * 2 + 2 * mask) * h
    swiglu_unfused = m.mlp == "swiglu" and not sw.swiglu_fusion
    rope_unfused = sw.rotary and not sw.rope_fusion
    gelu_epilogue = m.mlp != "swiglu" and sw.gelu_in_gemm_epilogue
    act_bytes = 0.0 if swiglu_unfused or gelu_epilogue else (3 if m.mlp == "swiglu" else 2) * 2 * f / tp
    # RoPE fused reads and writes the rank's Q and K heads, 2 bytes each
    rope_bytes = 2 * 2 * (h + kv) / tp if sw.rotary and sw.rope_fusion else 0.0
    ew = tokens * (hidden_bytes / (tp if sp else 1) + act_bytes + rope_bytes)
    fwd += hbm_time(ew, gpu)
    bwd += hbm_time(2 * ew, gpu)
    if gelu_epilogue:  # the pre-activation the epilogue keeps: written forward, read by DGELU backward
        fwd, bwd = fwd + hbm_time(tokens * 2 * f / tp, gpu), bwd + hbm_time(tokens * 2 * f / tp, gpu)
    halves = sw.rope_style == "rotate-half"
    for unfused, elements, passes, efficiency in (
            (rope_unfused and halves, (h + kv) / tp, ROPE_UNFUSED_PASSES, ROPE_UNFUSED_HBM),
            (swiglu_unfused and not sw.swiglu_separate_projections, f / tp, SWIGLU_UNFUSED_PASSES, SWIGLU_UNFUSED_HBM)):
        if unfused:  # op by op, at the measured rate of kernels on strided halves (kernels.py)
            f_s, b_s = unfused_time(tokens * elements, passes, efficiency, gpu)
            fwd, bwd = fwd + f_s, bwd + b_s
    f_b, b_b = eager_layer_bytes(m, sw, tp, sp)
    kernels_f, kernels_b = sw.kernels_per_layer
    amax_f = amax_b = 0.0  # current scaling's amax all-reduces, on the compute stream
    if te_fp8:  # Transformer Engine's casts and transposes around the GEMMs (topology/fp8.py)
        te_sp = sp and tp > 1  # TE's own sequence_parallel flag is off at TP 1
        cast_f, cast_b = layer_cast_bytes(m, tp, te_sp, gpu.fp8_transposes)
        f_b, b_b = f_b + cast_f, b_b + cast_b
        extra_f, extra_b = layer_cast_kernels(te_sp, gpu.fp8_transposes)
        kernels_f, kernels_b = kernels_f + extra_f, kernels_b + extra_b
        if sw.fp8_scaling == CURRENT:
            more_f, more_b = current_scaling_bytes(m, tp, te_sp)
            f_b, b_b = f_b + more_f, b_b + more_b
            kernels_f, kernels_b = kernels_f + CURRENT_SCALING_KERNELS[0], kernels_b + CURRENT_SCALING_KERNELS[1]
            amax_s = collective_time("all-reduce", AMAX_BYTES, tp, group_nodes(tp, tp, gpus_per_node),
                                     _tp_bw(gpu, tp, gpus_per_node), gpu)
            amax_f, amax_b = (n * amax_s for n in amax_reductions(te_sp, tp))
    fwd, bwd = fwd + hbm_time(tokens * f_b, gpu), bwd + hbm_time(tokens * b_b, gpu)
    elementwise_fwd = fwd - before_elementwise
    fwd = kernel_bound(fwd, kernels_f, sw.launch_blocking) + amax_f
    bwd = kernel_bound(bwd, kernels_b, sw.launch_blocking) + amax_b
    if recompute == "full":
        bwd += fwd
    elif recompute == "every-other-block":  # half the blocks repeat their forward: per block on average
        bwd += fwd / 2
    elif recompute == "op-selective":
        # torchtitan's op policy keeps the attention's output and every other matmul's (in forward order: Q, V,
        # the gate, the down projection) and recomputes the rest: the K, output and up projections and every
        # elementwise operation
        bwd += (elementwise_fwd + gemm_time(tokens, h, kv // tp, gpu, peak, 1, in_bytes) + gemms[1][2]
                + gemm_time(tokens, h, f // tp, gpu, peak, 1, in_bytes))
    elif recompute == "selective" and not sw.flash_attention:
        bwd += af

    tp_t = 0.0
    if tp > 1:
        # Per layer (megatron-core 0.16.1, tensor_parallel/layers.py and mappings.py), in
        # all-reduce equivalents `ar` of the b s h activation:
        #   forward: the row-parallel output all-reduces (SP: 2 all-gathers + 2 reduce-scatters) = 2 ar
        #   backward without SP: the column-parallel input-gradient all-reduces = 2 ar
        #   backward with SP: row-parallel output-gradient all-gathers (1 ar) + the column-parallel
        #     input re-all-gathered for the weight gradient (the forward's gather is not kept) and
        #     the input-gradient reduce-scatter (2 ar): 5 ar per layer, not 4.
        # Exposure: see software.Software.tp_bwd_overlap. Full recomputation repeats the forward's 2.
        ar = _tp_allreduce_equivalent(tokens * h * 2, gpu, tp, sp, gpus_per_node)
        nodes = group_nodes(tp, tp, gpus_per_node)
        # With sequence parallelism `ar` is an all-gather and a reduce-scatter, half each; under Transformer
        # Engine's fp8 the gathers (norm outputs, row-parallel output gradients) move fp8 (topology/fp8.py).
        gather = ar / 2 * (_fp8_gather_share(tokens * h * 2, gpu, tp, gpus_per_node) if te_fp8 and sp else 1.0)
        userbuffers = sw.tp_comm_overlap and sp and nodes == 1
        if userbuffers:
            fwd_tp, row_grad_gathers = userbuffers_tp_time(gemms, tokens, h * 2, gpu, peak, in_bytes, tp,
                                                           gather_token_bytes=h * in_bytes)
        else:
            fwd_tp, row_grad_gathers = (2 * (gather + ar / 2), 2 * gather) if sp else (2 * ar, 0.0)
        tp_t = RECOMPUTED_FORWARDS.get(recompute, 1) * fwd_tp + row_grad_gathers
        for name, (*_, dgrad, wgrad) in zip(("qkv", "fc1"), gemms[::2]):  # the column-parallel QKV and fc1
            if userbuffers:  # bulk overlaps on the SMs userbuffers' configuration gives them
                gather_sms, scatter_sms = UB_BULK_SMS[name]
                tp_t += (_beside_gemm(gather, dgrad, gather_sms / gpu.sms)
                         + _beside_gemm(ar / 2, wgrad, scatter_sms / gpu.sms))
            elif sp:
                tp_t += _hidden(gather, dgrad, sw, gpu, nodes) + _hidden(ar / 2, wgrad, sw, gpu, nodes)
            else:
                tp_t += _hidden(ar, wgrad, sw, gpu, nodes)
    cp_t = 0.0
    if cp > 1:
        # K/V all-gather fwd, dK/dV reduce-scatter bwd (a ring moves the same bytes: K/V forward, K/V and
        # dK/dV backward); recomputation (full, or selective: core attention, where the exchange lives)
        # gathers again in backward.
        exchanges = 2 + RECOMPUTED_ATTENTION.get(recompute, 0)
        kv_bytes = mb * seq * 2 * kv / tp * 2
        cp_bw = gpu.nvlink_gbps if tp * cp <= gpus_per_node else gpu.network_gbps
        cp_nodes = group_nodes(cp, tp * cp, gpus_per_node)
        gather = collective_time("all-gather", kv_bytes, cp, cp_nodes, cp_bw, gpu)
        scatter = collective_time("reduce-scatter", kv_bytes, cp, cp_nodes, cp_bw, gpu)
        if sw.cp_ring_overlap:
            # each of the cp - 1 transfers beside one ring step's attention (the last step sends nothing),
            # which loses the SMs NCCL holds meanwhile
            ring = (cp - 1) / cp
            share = nccl_sm_share(gpu, cp_nodes)
            cp_t = ((exchanges - 1) * _beside_gemm(gather, af * ring, share)
                    + _beside_gemm(gather + scatter, ab * ring, share))
        else:
            cp_t = (exchanges - 1) * gather + scatter
    return LayerTime(fwd, bwd, tp_t, cp_t)


def _fp8_gather_share(nbytes: float, gpu: GPU, tp: int, gpus_per_node: int) -> float:
    """An fp8 all-gather's time over that of the 16-bit one of ``nbytes`` it replaces."""
    bw, nodes = _tp_bw(gpu, tp, gpus_per_node), group_nodes(tp, tp, gpus_per_node)
    whole = collective_time("all-gather", nbytes, tp, nodes, bw, gpu)
    return collective_time("all-gather", nbytes * GATHER_SHARE, tp, nodes, bw, gpu) / whole if whole else 1.0


@lru_cache(maxsize=None)
def output_layer_time(m: ModelSpec, gpu: GPU, tokens: int, tp: int, cross_entropy: str) -> tuple[float, float]:
    """Logits GEMM and the cross-entropy over the rank's vocabulary slice on the last stage (fwd, bwd). In 16 bits
    whatever the layers run in: under fp8 the output layer is outside Transformer Engine's fp8_autocast."""
    f, b = gemm_fwd_bwd(tokens, m.hidden, m.vocab // tp, gpu, gpu.bf16_tflops * 1e12)
    logits, ce = tokens * m.vocab / tp, CROSS_ENTROPY_KERNELS[cross_entropy]
    return f + hbm_time(logits * ce.forward_bytes, gpu), b + hbm_time(logits * ce.backward_bytes, gpu)


@lru_cache(maxsize=None)
def end_stage_tp_time(m: ModelSpec, gpu: GPU, tokens: int, tp: int, sp: bool,
                      sw: Software, gpus_per_node: int, embedding: bool, output: bool) -> float:
    """Exposed TP seconds per micro-batch outside the layers (megatron-core 0.16.1):
    * first stage, VocabParallelEmbedding: its output all-reduce in forward (SP: reduce-scatter
      forward, all-gather backward) = 1 ar;
    * last stage, the ColumnParallelLinear output layer: without SP its input-gradient all-reduce
      (1 ar, async behind the logits' weight-gradient GEMM); with SP the input all-gather in
      forward (exposed), again in backward (behind the input-gradient GEMM) and the
      input-gradient reduce-scatter (behind the weight-gradient GEMM) = 1.5 ar; plus the
      vocab-parallel cross-entropy's 3 all-reduces of b s fp32 values (max, target logit, sum).
    The output layer's GEMMs are 16-bit, as in output_layer_time."""
    if tp == 1:
        return 0.0
    bw = _tp_bw(gpu, tp, gpus_per_node)
    nodes = group_nodes(tp, tp, gpus_per_node)
    ar = _tp_allreduce_equivalent(tokens * m.hidden * 2, gpu, tp, sp, gpus_per_node)
    t = ar if embedding else 0.0
    if output:
        peak = gpu.bf16_tflops * 1e12
        n = m.vocab // tp
        dgrad = gemm_time(tokens, n, m.hidden, gpu, peak)
        wgrad = gemm_time(m.hidden, tokens, n, gpu, peak)
        if sp:
            t += ar / 2 + _hidden(ar / 2, dgrad, sw, gpu, nodes) + _hidden(ar / 2, wgrad, sw, gpu, nodes)
        else:
            t += _hidden(ar, wgrad, sw, gpu, nodes)
        t += 3 * allreduce_time(tokens * 4, tp, nodes, bw, gpu)
    return t


def pp_messages(plan: Plan, st: Stage) -> int:
    """Pipeline messages a rank sends per micro-batch: an activation forward unless it holds the
    last stage, a gradient backward unless it holds the first (per virtual stage)."""
    return 2 * plan.vpp - (1 if st.has_embedding else 0) - (1 if st.has_output else 0)


def pp_message_bytes(plan: Plan, sw: Software, dtype_bytes: int = 2) -> float:
    """One pipeline message per TP rank: b s h / t with sequence parallelism or Megatron-LM
    2021's scatter/gather; the full b s h otherwise (megatron-core p2p_communication.py sends
    each TP rank's whole output tensor)."""
    split = (plan.sequence_parallel and plan.tp > 1) or sw.p2p_scatter_gather
    return plan.micro_batch * plan.seq_len // plan.cp * plan.model.hidden * dtype_bytes / (plan.tp if split else 1)


# ---------------------------------------------------------------- step ----------------------
@dataclass(frozen=True)
class StepCost:
    step_time_s: float
    compute_s: float  # m micro-batches of compute on the slowest pipeline rank
    bubble_s: float  # pipeline fill and drain: (p - 1)/v micro-batches of everything
    tp_s: float  # exposed TP communication, and the compute lost beside the hidden part (links.sm_contention)
    cp_s: float
    pp_s: float
    dp_s: float  # exposed DP communication, and the compute lost beside the hidden part
    optimizer_s: float
    model_flops: float  # per step, whole job
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    stage_rank: int = 0  # the slowest pipeline rank, whose per-micro-batch terms are above
    replica_loss_s: float = 0.0  # synchronous snapshot and exchange after the step (redundancy.py)

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.step_time_s

    def with_replica_loss(self, seconds: float) -> "StepCost":
        """This step followed by ``seconds`` of synchronous work: the step lengthens and tokens per
        second, TFLOP/s per GPU and MFU shrink in proportion (the FLOPs per step do not change)."""
        step = self.step_time_s + seconds
        scale = self.step_time_s / step
        return replace(self, step_time_s=step, replica_loss_s=self.replica_loss_s + seconds,
                       tokens_per_s=self.tokens_per_s * scale, tflops_per_gpu=self.tflops_per_gpu * scale,
                       mfu=self.mfu * scale)

    def comm(self) -> dict:
        return {"tp": self.tp_s, "cp": self.cp_s, "pp": self.pp_s, "dp": self.dp_s}


def after_first_backward(n_mb: int, mb_s: float, fwd_s: float, pp: int, vpp: int) -> float:
    """Seconds from the first pipeline rank's first backward to the end of the step, in the ideal
    timeline of Megatron's 1F1B (vpp 1) and interleaved schedules: uniform stages, a micro-batch
    of mb_s seconds of which fwd_s forward, step n mb_s + (p - 1) mb_s / v. That backward starts
    at p f + (p - 1)(mb_s - f) / v; tests/unit/test_planner_cost.py checks this against a simulation of
    the schedules' order."""
    return n_mb * mb_s - fwd_s * (pp - (pp - 1) / vpp)


def _dp_time(plan: Plan, gpu: GPU, sw: Software, n_params: float, fwd_mb: float, bwd_mb: float,
             nic_free_mb: float) -> float:
    """DP time on the step: exposed communication, and the compute lost to NCCL's SMs behind the
    hidden part (links.sm_contention). nic_free_mb: the part of a micro-batch on the slowest rank during which
    the scale-out link is free for DP traffic (compute and NVLink TP collectives)."""
    d = plan.zero_group  # CP ranks hold the same weights: gradients are reduced over DP x CP
    if d == 1:
        return 0.0
    bw = dp_link_gbps(plan, gpu, sw)
    overlap_reduce = sw.overlap_grad_reduce and not (
        sw.grad_reduce_after_flush_with_pp and (plan.pp > 1 or plan.sequence_parallel))
    # one reduce-scatter and one all-gather call per gradient bucket
    # megatron-core's bucket grows with DP (DistributedDataParallelConfig: max(40M, 1M x dp))
    bucket = GRAD_BUCKET_NUMEL if sw.zero2_reduce_once else max(GRAD_BUCKET_NUMEL, 1_000_000 * d)
    nodes = ceil(d / dp_ranks_per_node(plan, sw))
    calls = ceil(n_params / bucket)

    def bucketed(op: str, bytes_per_param: int) -> float:
        return calls * collective_time(op, n_params / calls * bytes_per_param, d, nodes, bw, gpu)

    grad = bucketed("reduce-scatter", 4 if sw.fp32_grads else 2)
    # 16-bit weights; fp8 ones where the stack gathers the fp8 parameters (Software.fp8_param_gather)
    gather = bucketed("all-gather", 1 if plan.precision == "fp8" and sw.fp8_param_gather else 2)

    def exposed(t: float, behind: float, on: bool) -> float:
        """Bucket by bucket behind ``behind`` seconds of compute, except one bucket (the first
        layers'), which that compute cannot hide: the reduction's last bucket is complete only
        when the backward ends, the gather's first is needed before the forward starts."""
        return max(t - behind, t * min(1.0, bucket / n_params)) if on else t

    def reduced(t: float) -> float:  # issued from the last micro-batch's backward
        return _with_contention(t, exposed(t, bwd_mb, overlap_reduce), gpu, nodes)

    def gathered(t: float) -> float:  # issued after the step, behind the next step's first forward
        return _with_contention(t, exposed(t, fwd_mb, sw.overlap_param_gather), gpu, nodes)

    if plan.zero_stage == 3:  # gather for fwd and for bwd, reduce-scatter, every micro-batch
        per_mb = 2 * gather + grad
        if not (overlap_reduce and sw.overlap_param_gather):
            return plan.grad_accum * per_mb
        # contention only beside compute, not beside the rank's NVLink TP collectives
        return plan.grad_accum * _with_contention(per_mb, max(0.0, per_mb - nic_free_mb), gpu, nodes,
                                                  fwd_mb + bwd_mb)
    if plan.zero_stage == 0:  # one all-reduce = reduce-scatter + all-gather of the gradients
        return reduced(2 * grad)
    if sw.full_grad_allreduce and (plan.zero_stage == 1 or sw.zero2_reduce_once):
        # all-reduce = reduce-scatter + all-gather of the same buffer
        grad *= 2
    if plan.zero_stage == 2 and not sw.zero2_reduce_once:
        # Sharded gradients cannot be accumulated locally: each micro-batch's gradients are
        # reduce-scattered during its backward (DeepSpeed ZeRO-2, FSDP SHARD_GRAD_OP). Overlapped,
        # the reduction runs on its own stream and keeps the link busy through the micro-batches
        # that follow (only the buffer it reads must wait for it): it is exposed only where the n
        # reductions outlast the time from the first pipeline rank's first backward to the end of
        # the step, and at least its last bucket.
        n = plan.grad_accum
        if not overlap_reduce:  # every reduction exposed
            return n * grad + gathered(gather)
        window = max(bwd_mb, after_first_backward(n, nic_free_mb, fwd_mb, plan.pp, plan.vpp))
        shown = max(n * grad - window, exposed(grad, bwd_mb, True))
        return _with_contention(n * grad, shown, gpu, nodes, n * (fwd_mb + bwd_mb)) + gathered(gather)
    # ZeRO-1, and hybridpar's ZeRO-2 (one reduction of the full accumulated gradients per step,
    # engine.py _defer_zero2_reduction): reduced once, then the updated weights gathered.
    return reduced(grad) + gathered(gather)


def _tied_embedding_sync(plan: Plan, gpu: GPU, sw: Software) -> float:
    """Tied input/output embeddings with pp > 1: the first and last stage each hold a copy and
    all-reduce its gradient once per step after the flush (Megatron's embedding group, DeepSpeed's
    tied-module all-reduce); a 2-rank ring moves the whole gradient once."""
    if not plan.model.tied_embeddings or plan.pp == 1:
        return 0.0
    crosses = pp_crosses_nodes(plan, sw)
    bw = gpu.network_gbps if crosses else gpu.nvlink_gbps
    return allreduce_time(plan.model.embedding_params / plan.tp * (4 if sw.fp32_grads else 2), 2,
                          2 if crosses else 1, bw)


def step_cost(plan: Plan, sw: Software = HYBRIDPAR, gpu: GPU | None = None) -> StepCost:
    """gpu overrides the catalogue entry named by plan.gpu (e.g. a cluster with other NICs)."""
    m, gpu = plan.model, gpu or get_gpu(plan.gpu)
    lt = layer_time(m, gpu, plan.precision, plan.seq_len, plan.micro_batch, plan.tp, plan.cp,
                    plan.sequence_parallel or plan.tp == 1, plan.recompute, sw, plan.gpus_per_node)
    tokens = plan.micro_batch * plan.seq_len // plan.cp
    sp = plan.sequence_parallel and plan.tp > 1
    pp_msg = 0.0
    if plan.pp > 1 and not (sw.overlap_p2p and plan.vpp > 1):
        crosses = pp_crosses_nodes(plan, sw)
        bw = gpu.network_gbps if crosses else gpu.nvlink_gbps
        # Paired send+receive exchanges, or (blocking_p2p) a send and a receive one at a time.
        pp_msg = (2 if sw.blocking_p2p else 1) * (link_time(pp_message_bytes(plan, sw), bw)
                                                  + nccl_latency(1, 2, 2 if crosses else 1))
    worst = None
    for st in stages(plan):  # the slowest pipeline rank, all its per-micro-batch terms
        fwd, bwd = st.layers * lt.fwd, st.layers * lt.bwd
        if st.has_output:
            of, ob = output_layer_time(m, gpu, tokens, plan.tp, sw.cross_entropy)
            fwd, bwd = fwd + of, bwd + ob
        tp = st.layers * lt.tp + end_stage_tp_time(m, gpu, tokens, plan.tp, sp, sw,
                                                    plan.gpus_per_node, st.has_embedding, st.has_output)
        pp = pp_messages(plan, st) * pp_msg
        key = fwd + bwd + tp + st.layers * lt.cp + pp
        if worst is None or key > worst[0]:
            worst = (key, st, fwd, bwd, tp, pp)
    _, st, fwd_mb, bwd_mb, tp_mb, pp_mb = worst
    cp_mb = st.layers * lt.cp
    n_params = max(params_per_rank(plan, s) for s in stages(plan))
    bwd_mb += hbm_time(sw.grad_accum_bytes_per_param * n_params, gpu, sw.grad_accum_hbm_efficiency)  # outside the GEMMs
    if plan.zero_stage == 3:  # each micro-batch gathers every layer for its forward and again for its backward
        copy_out = hbm_time(sw.gather_copy_out_bytes_per_param * n_params, gpu)
        fwd_mb, bwd_mb = fwd_mb + copy_out, bwd_mb + copy_out
    mb_total = fwd_mb + bwd_mb + tp_mb + cp_mb + pp_mb
    n_mb = plan.grad_accum
    bubble = (plan.pp - 1) / plan.vpp * mb_total

    dp = _dp_time(plan, gpu, sw, n_params, fwd_mb, bwd_mb, fwd_mb + bwd_mb + tp_mb)
    tied = _tied_embedding_sync(plan, gpu, sw)
    shard = n_params / (plan.zero_group if plan.zero_stage >= 1 else 1)
    optimizer = hbm_time(optimizer_step_bytes(sw, plan.zero_stage, plan.zero_group) * shard, gpu)

    step = n_mb * mb_total + bubble + dp + tied + optimizer
    flops = plan.global_batch * model_flops_per_seq(m, plan.seq_len)
    world = plan.world_size
    tflops = flops / step / world / 1e12
    return StepCost(
        step_time_s=step, compute_s=n_mb * (fwd_mb + bwd_mb), bubble_s=bubble,
        tp_s=n_mb * tp_mb, cp_s=n_mb * cp_mb, pp_s=n_mb * pp_mb + tied, dp_s=dp, optimizer_s=optimizer,
        model_flops=flops, tokens_per_s=plan.tokens_per_step / step, tflops_per_gpu=tflops,
        mfu=tflops / gpu.peak_tflops(plan.precision), stage_rank=st.rank,
    )
