"""Bytes per parallel axis per optimizer step, per rank: what the planner's time model charges,
and what hybridpar's runtime actually sends. Pure arithmetic on a Plan (no torch).

Two functions, compared by benchmarks/comm.py against bytes recorded from real steps:

* ``cost_model_bytes(plan)``: the bytes behind cost.py's TP, PP and DP time terms, before they
  are divided by a link bandwidth (tests/test_bench_smoke.py checks that dividing them gives
  back ``step_cost``'s seconds). cost.py charges every layer 4 TP all-reduces per micro-batch
  (2 forward, 2 backward), a PP stage 2 transfers of ``b s h / t`` per micro-batch per virtual
  stage, and DP a ring reduce-scatter of the gradients plus an all-gather of 16-bit weights
  (ZeRO-2: the reduce-scatter every micro-batch).
* ``runtime_bytes(plan, pp_rank)``: hybridpar's calls, one rank of pipeline stage ``pp_rank``:
  the layers' 4 all-reduces (10 all-gathers/reduce-scatters of half the ring bytes with
  sequence parallelism: megatron gathers the input again in backward for the weight gradient),
  plus the vocab-parallel embedding's forward all-reduce on the first stage and the output
  layer's input-gradient all-reduce and three cross-entropy all-reduces of ``b s`` fp32 values
  on the last stage (with sequence parallelism: embedding RS + AG, output layer AG + RS + AG, and
  once per step the TP all-reduce of the norm-weight gradients); full ``b s h`` activations per TP rank between stages unless sequence
  parallel; DeepSpeed's DP reduction in ``grad_bytes`` (hybridpar sets its
  ``communication_data_type`` to fp32) and, ZeRO >= 1, the all-gather of updated weights in the
  model dtype; DeepSpeed all-reduces each ZeRO-1/2 gradient bucket in full by default
  (``use_multi_rank_bucket_allreduce``), 2(n-1)/n instead of a reduce-scatter's (n-1)/n.
  hybridpar's ZeRO-2 reduces once per step (engine.py), not per micro-batch.

"wire" bytes are what the rank sends under bandwidth-optimal ring algorithms (all-reduce
2(n-1)/n of the buffer, all-gather/reduce-scatter/reduce (n-1)/n); "buffer" bytes are the
collectives' logical buffers.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .plan import Plan
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


def cost_model_bytes(plan: Plan, sw: Software = HYBRIDPAR, dtype_bytes: int = 2) -> dict[str, AxisBytes]:
    """Per-rank bytes per step of cost.py's TP, PP and DP terms (its slowest stage; DP on its
    largest stage), with activations and weights of ``dtype_bytes`` (cost.py uses 2)."""
    m, t, d, mb = plan.model, plan.tp, plan.dp, plan.grad_accum
    tokens = plan.micro_batch * plan.seq_len // plan.cp
    worst = max(st.layers for st in stages(plan))
    act = tokens * m.hidden * dtype_bytes
    tp_calls = 4 * worst * mb if t > 1 else 0
    tp = AxisBytes(tp_calls, tp_calls * act, tp_calls * _ring(t, True) * act)
    pp_calls = 2 * plan.vpp * mb if plan.pp > 1 else 0
    pp = AxisBytes(pp_calls, pp_calls * act / t, pp_calls * act / t)
    n = max(params_per_rank(plan, s) for s in stages(plan))
    grad_b = 4 if sw.fp32_grads else dtype_bytes
    rs = n * grad_b * (mb if plan.zero_stage == 2 else 1) * (2 if sw.full_grad_allreduce and plan.zero_stage < 2 else 1)
    gather = n * dtype_bytes
    dp = AxisBytes(0, rs + gather, _ring(d, False) * (rs + gather)) if d > 1 else AxisBytes(0, 0.0, 0.0)
    return {"tp": tp, "pp": pp, "dp": dp}


def runtime_bytes(plan: Plan, pp_rank: int = 0, dtype_bytes: int = 4, grad_bytes: int = 4,
                  bucket_allreduce: bool = True) -> dict[str, AxisBytes]:
    """Per-rank bytes per step that hybridpar's runtime moves on pipeline rank ``pp_rank``
    (no interleaving, untied embeddings; scalars such as the logged loss and norms excluded).

    ``bucket_allreduce``: DeepSpeed's ZeRO-1/2 ``use_multi_rank_bucket_allreduce`` (default on,
    and hybridpar does not set it): each gradient bucket is all-reduced in full, and each rank
    keeps its partition, instead of reducing every partition to its owner."""
    m, t, d, mb = plan.model, plan.tp, plan.dp, plan.grad_accum
    st = _stage(plan, pp_rank)
    tokens = plan.micro_batch * plan.seq_len // plan.cp
    act = tokens * m.hidden * dtype_bytes
    sp = plan.sequence_parallel and t > 1
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
        if sp and st.layers:  # once per step: TP sum of the layers' norm-weight gradients (pipeline.py)
            norms = st.layers * 2 * m.hidden * grad_bytes
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
        reduce = _ring(d, bucket_allreduce) * n * grad_bytes
        dp = AxisBytes(0, n * grad_bytes + n * dtype_bytes, reduce + _ring(d, False) * n * dtype_bytes)
    return {"tp": AxisBytes(tp_calls, tp_buf, tp_wire), "pp": pp, "dp": dp}


def dp_ring_lower_bound(n_params: float, dp: int, grad_bytes: int) -> float:
    """Bytes each rank must send to all-reduce ``n_params`` gradients over ``dp`` ranks."""
    return _ring(dp, True) * n_params * grad_bytes
