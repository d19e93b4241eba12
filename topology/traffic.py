"""Bytes per parallel axis per optimizer step, per rank: what the planner's time model charges,
and what hybridpar's runtime actually sends. Pure arithmetic on a Plan (no torch).

Two functions, compared by benchmarks/comm.py against bytes recorded from real steps:

* ``cost_model_bytes(plan, pp_rank)``: the bytes behind cost.py's TP, PP and DP time terms,
  before they are divided by a link bandwidth (tests/unit/test_bench_smoke.py checks that dividing
  them gives back ``step_cost``'s seconds where nothing overlaps). cost.py charges, per
  micro-batch, every layer 4 TP all-reduce equivalents of ``b s h`` (5 with sequence
  parallelism: megatron-core all-gathers the input again in backward), the first stage one more
  (vocab-parallel embedding), the last stage 1 (1.5 with SP) more for the output layer plus
  three ``b s`` fp32 cross-entropy all-reduces; a pipeline rank one message per virtual stage
  and direction it sends in (end ranks one direction fewer), ``b s h / t`` with SP or
  scatter/gather, ``b s h`` otherwise; DP a ring reduce-scatter of the gradients plus an
  all-gather of 16-bit weights (classic ZeRO-2: the reduce-scatter every micro-batch;
  hybridpar's ZeRO-2: once per step).
* ``runtime_bytes(plan, pp_rank)``: hybridpar's calls, one rank of pipeline stage ``pp_rank``:
  the layers' 4 all-reduces (10 all-gathers/reduce-scatters of half the ring bytes with
  sequence parallelism: megatron gathers the input again in backward for the weight gradient),
  plus the vocab-parallel embedding's forward all-reduce on the first stage and the output
  layer's input-gradient all-reduce and three cross-entropy all-reduces of ``b s`` fp32 values
  on the last stage (with sequence parallelism: embedding RS + AG, output layer AG + RS + AG, and
  once per step the TP all-reduce of the norm-weight gradients); full ``b s h`` activations per TP rank between stages unless sequence
  parallel; the DP reduction in ``grad_bytes`` (fp32) and, ZeRO >= 1, the all-gather of updated
  weights in the model dtype. ZeRO-0 all-reduces the gradients; ZeRO-1/2 reduce each gradient
  element to the DP rank that steps it (grad_sync.py, zero_partitions.py: the bytes of a
  reduce-scatter, (n-1)/n), except the sequence-parallel norm weights, whose TP sum needs them
  whole (all-reduced, 2(n-1)/n). With the overlap off DeepSpeed reduces instead and all-reduces
  each ZeRO-1/2 gradient bucket in full (its default ``use_multi_rank_bucket_allreduce``;
  ``bucket_allreduce=True``). hybridpar's ZeRO-2 reduces once per step, not per micro-batch.

"wire" bytes are what the rank sends under bandwidth-optimal ring algorithms (all-reduce
2(n-1)/n of the buffer, all-gather/reduce-scatter/reduce (n-1)/n); "buffer" bytes are the
collectives' logical buffers.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .plan import RECOMPUTED_ATTENTION, RECOMPUTED_FORWARDS, Plan
from .software import HYBRIDPAR, Software
from .stages import params_per_rank, stages


@dataclass(frozen=True)
class AxisBytes:
    calls: float
    buffer_bytes: float
    wire_bytes: float

    def to_dict(self) -> dict:
        return asdict(self)


def _ring(n: int, allreduce: bool) -> float:
    if n <= 1:
        return 0.0
    return (2.0 if allreduce else 1.0) * (n - 1) / n


def _stage(plan: Plan, pp_rank: int):
    """The topology Stage describing pipeline rank ``pp_rank`` (first, a middle, or last)."""
    sts = stages(plan)
    if pp_rank == 0:
        return sts[0]
    if pp_rank == plan.pp - 1:
        return sts[-1]
    return sts[1]


def _kv_bytes(plan: Plan, dtype_bytes: int) -> float:
    """K and V of one micro-batch's whole sequence on one TP rank (what a CP all-gather assembles)."""
    m = plan.model
    return plan.micro_batch * plan.seq_len * 2 * m.kv_heads * m.head_dim / plan.tp * dtype_bytes


def _cp_gathers(plan: Plan) -> float:
    """K/V all-gathers per layer and micro-batch: forward, plus backward when recomputed."""
    return 1 + RECOMPUTED_ATTENTION.get(plan.recompute, 0)


def cost_model_bytes(plan: Plan, sw: Software = HYBRIDPAR, dtype_bytes: int = 2,
                     pp_rank: int | None = None) -> dict[str, AxisBytes]:
    """Per-rank bytes per step behind cost.py's TP, PP and DP terms on pipeline rank ``pp_rank``
    (None: the slowest rank, the one ``step_cost`` charges), with activations and weights of
    ``dtype_bytes`` (cost.py uses 2). These are wire bytes: cost.py's TP seconds are only their
    exposed part where a backward collective overlaps a GEMM (software.Software.tp_bwd_overlap)."""
    from .cost import pp_message_bytes, pp_messages, step_cost

    m, t, d, mb = plan.model, plan.tp, plan.zero_group, plan.grad_accum
    st = _stage(plan, step_cost(plan, sw).stage_rank if pp_rank is None else pp_rank)
    tokens = plan.micro_batch * plan.seq_len // plan.cp
    act = tokens * m.hidden * dtype_bytes
    sp = plan.sequence_parallel and t > 1
    tp = AxisBytes(0, 0.0, 0.0)
    if t > 1:  # in all-reduce equivalents of b s h per micro-batch (cost.layer_time, end_stage_tp_time)
        per_layer = (5 if sp else 4) + 2 * (RECOMPUTED_FORWARDS.get(plan.recompute, 1) - 1)
        ars = st.layers * per_layer + (1 if st.has_embedding else 0) + ((1.5 if sp else 1) if st.has_output else 0)
        calls = ars * (2 if sp else 1) + (3 if st.has_output else 0)
        ce = 3 * tokens * 4 if st.has_output else 0  # cross-entropy: 3 all-reduces of b s fp32
        tp = AxisBytes(calls * mb, (ars * act + ce) * mb, _ring(t, True) * (ars * act + ce) * mb)
    pp = AxisBytes(0, 0.0, 0.0)
    if plan.pp > 1:
        sends = pp_messages(plan, st) * mb
        msg = pp_message_bytes(plan, sw, dtype_bytes)
        pp = AxisBytes(2 * sends, sends * msg, sends * msg)
    # DP: cost.py charges the largest stage; a given rank sends its own stage's parameters.
    n = max(params_per_rank(plan, s) for s in stages(plan)) if pp_rank is None else params_per_rank(plan, st)
    grad_b = 4 if sw.fp32_grads else dtype_bytes
    per_mb = plan.zero_stage == 2 and not sw.zero2_reduce_once
    full = sw.full_grad_allreduce and (plan.zero_stage == 1 or (plan.zero_stage == 2 and not per_mb))
    rs = n * grad_b * (mb if per_mb else 1) * (2 if full else 1)
    gather = n * dtype_bytes
    dp = AxisBytes(0, rs + gather, _ring(d, False) * (rs + gather)) if d > 1 else AxisBytes(0, 0.0, 0.0)
    cp = AxisBytes(0, 0.0, 0.0)
    if plan.cp > 1 and st.layers:  # cost.layer_time: K/V all-gather(s) + one dK/dV reduce-scatter
        kv = _kv_bytes(plan, dtype_bytes) * st.layers * mb * (_cp_gathers(plan) + 1)
        cp = AxisBytes(0, kv, _ring(plan.cp, False) * kv)
    return {"tp": tp, "cp": cp, "pp": pp, "dp": dp}


def runtime_bytes(plan: Plan, pp_rank: int = 0, dtype_bytes: int = 4, grad_bytes: int = 4,
                  bucket_allreduce: bool = False) -> dict[str, AxisBytes]:
    """Per-rank bytes per step that hybridpar's runtime moves on pipeline rank ``pp_rank``
    (no interleaving, untied embeddings; scalars such as the logged loss and norms excluded).

    ``bucket_allreduce``: the ZeRO-1/2 reduction is DeepSpeed's (``overlap_grad_reduce`` off),
    whose default ``use_multi_rank_bucket_allreduce`` all-reduces each gradient bucket in full,
    each rank keeping its partition. False: hybridpar's grad_sync reduces every element to its
    owner (sequence-parallel norm weights all-reduced whole)."""
    m, t, d, mb = plan.model, plan.tp, plan.zero_group, plan.grad_accum
    st = _stage(plan, pp_rank)
    tokens = plan.micro_batch * plan.seq_len // plan.cp
    act = tokens * m.hidden * dtype_bytes
    sp = plan.sequence_parallel and t > 1
    # Sequence-parallel norm weights (two per layer, the final norm on the last stage): summed over TP.
    sp_norms = (st.layers * 2 + (1 if st.has_output else 0)) * m.hidden if sp else 0
    tp_calls = tp_buf = tp_wire = 0.0
    if t > 1:
        if sp:  # fwd: 2 AG + 2 RS; bwd: 2 RS + 2 AG + 2 AG again for the weight gradients
            layer_calls, layer_wire = 10, 10 * _ring(t, False) * act
        else:
            layer_calls, layer_wire = 4, 4 * _ring(t, True) * act
        tp_calls, tp_buf, tp_wire = st.layers * layer_calls, st.layers * layer_calls * act, st.layers * layer_wire
        if st.has_embedding:  # vocab-parallel embedding: all-reduce fwd (SP: reduce-scatter fwd, all-gather bwd)
            extra = 2 if sp else 1
            tp_calls += extra
            tp_buf += extra * act
            tp_wire += extra * _ring(t, not sp) * act
        if st.has_output:  # output layer: input-gradient all-reduce (SP: all-gather fwd, RS + all-gather bwd)
            extra = 3 if sp else 1
            tp_calls += extra
            tp_buf += extra * act
            tp_wire += extra * _ring(t, not sp) * act
            ce = tokens * 4  # vocab-parallel cross-entropy: max, target logit, sum of exp (fp32)
            tp_calls += 3
            tp_buf += 3 * ce
            tp_wire += 3 * _ring(t, True) * ce
        tp_calls, tp_buf, tp_wire = tp_calls * mb, tp_buf * mb, tp_wire * mb
        if sp and sp_norms:  # once per step: TP sum of the norm-weight gradients (pipeline.py)
            norms = sp_norms * grad_bytes
            tp_calls, tp_buf, tp_wire = tp_calls + 1, tp_buf + norms, tp_wire + _ring(t, True) * norms
    msg = act / t if sp else act
    sends = (0 if st.has_output else 1) + (0 if st.has_embedding else 1)
    pp = AxisBytes(2 * sends * mb, sends * mb * msg, sends * mb * msg) if plan.pp > 1 else AxisBytes(0, 0.0, 0.0)
    n = params_per_rank(plan, st)
    if d == 1:
        dp = AxisBytes(0, 0.0, 0.0)
    elif plan.zero_stage == 0:  # one all-reduce of the gradients (bucketed)
        dp = AxisBytes(0, n * grad_bytes, _ring(d, True) * n * grad_bytes)
    else:  # reduce (or all-reduce) the gradients, then all-gather the updated weights
        whole = 0 if bucket_allreduce else sp_norms  # their TP sum needs them whole: all-reduced
        reduce = _ring(d, bucket_allreduce) * (n - whole) * grad_bytes + _ring(d, True) * whole * grad_bytes
        dp = AxisBytes(0, n * grad_bytes + n * dtype_bytes, reduce + _ring(d, False) * n * dtype_bytes)
    cp = AxisBytes(0, 0.0, 0.0)
    if plan.cp > 1 and st.layers:
        # hybridpar/runtime/attention.py: K and V each all-gathered (again when recomputed); backward sums
        # dK and dV with a reduce-scatter.
        kv = _kv_bytes(plan, dtype_bytes) * st.layers * mb
        gathers = _cp_gathers(plan)
        cp = AxisBytes(2 * (gathers + 1) * st.layers * mb, kv * (gathers + 1),
                       _ring(plan.cp, False) * kv * (gathers + 1))
    return {"tp": AxisBytes(tp_calls, tp_buf, tp_wire), "cp": cp, "pp": pp, "dp": dp}


def dp_ring_lower_bound(n_params: float, dp: int, grad_bytes: int) -> float:
    """Bytes each rank must send to all-reduce ``n_params`` gradients over ``dp`` ranks."""
    return _ring(dp, True) * n_params * grad_bytes
