"""Memory per GPU for a Plan: model states under ZeRO, activations, and an allowance.

Every pipeline rank that can be the largest (first, middle, last) is computed; the largest
total decides whether the plan fits.

Model states (Rajbhandari et al. 2020, mixed-precision Adam): 2 bytes of 16-bit weights,
2 bytes of gradients (4 with fp32 gradients), 12 bytes of optimizer state (fp32 master copy,
momentum, variance) per parameter held by the rank; ZeRO-1 shards the optimizer state over
the DP axis, ZeRO-2 also the gradients (not hybridpar's own ZeRO-2, which keeps them whole until
the step's one reduction), ZeRO-3 also the weights.

Activations (Korthikanti et al. 2022), per layer and micro-batch, in bytes per token of the
local sequence (s / cp); the generalisation to GQA and SwiGLU follows the same tensor-by-tensor
count (tensors stored for the backward pass, 2 bytes per element, 1 per dropout mask):
  attention: QKV input 2h, Q 2h, K and V 2 x 2kv, projection input 2h, dropout mask h
  MLP:       input 2h, GELU in+out 4F or SwiGLU gate+up+out 6F, dropout mask h
  norms:     2 x 2h
  scores:    5 a s (softmax output, dropout mask and output) unless FlashAttention or
             selective recomputation
With MHA and F = 4h this is Korthikanti's 34 sbh + 5 a s^2 b. Tensor parallelism splits Q, K,
V, the projection input, the MLP intermediates and the scores over t; sequence parallelism
splits the rest too. Full recomputation keeps each layer's input (2h, split over t with SP)
plus one layer's full activations while it is being recomputed.
"""
from __future__ import annotations

from dataclasses import dataclass

from .hardware import GIB
from .plan import Plan
from .software import HYBRIDPAR, Software
from .stages import Stage, layer_params_per_rank, params_per_rank, stages

# Stated allowance, not derived: CUDA context, cuBLAS workspaces and NCCL buffers of a few
# communicators take 2-3 GiB per process; the caching allocator's fragmentation and the
# temporary buffers of collectives add roughly a tenth of the dynamic (activation) memory.
FIXED_OVERHEAD_BYTES = 3 * GIB
FRAGMENTATION = 0.10


@dataclass(frozen=True)
class StageMemory:
    stage: str
    params: float  # bytes
    grads: float
    optimizer: float
    activations: float
    buffers: float  # allowance: context, workspaces, fragmentation, ZeRO-3 gather buffers

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers

    def gib(self) -> dict:
        return {k: round(getattr(self, k) / GIB, 2)
                for k in ("params", "grads", "optimizer", "activations", "buffers", "total")}


def model_state_bytes(n_params: float, dp: int, zero_stage: int, fp32_grads: bool = False,
                      zero2_reduce_once: bool = False):
    """(weights, gradients, optimizer) bytes per GPU for n_params held by its model-parallel rank.

    ``zero2_reduce_once`` (hybridpar's ZeRO-2, software.Software): the gradients accumulate in a
    full buffer until the step's one reduction (hybridpar/engine.py _defer_zero2_reduction), so
    ZeRO-2 shards only the optimizer state, like ZeRO-1."""
    grad_bytes = 4 if fp32_grads else 2
    weights = 2 * n_params / (dp if zero_stage >= 3 else 1)
    sharded_grads = zero_stage >= 3 or (zero_stage == 2 and not zero2_reduce_once)
    grads = grad_bytes * n_params / (dp if sharded_grads else 1)
    optimizer = 12 * n_params / (dp if zero_stage >= 1 else 1)
    return weights, grads, optimizer


def layer_activation_bytes(plan: Plan, sw: Software, full_layer: bool = False) -> float:
    """Bytes one transformer layer keeps for one micro-batch on one GPU."""
    m, t = plan.model, plan.tp
    tokens = plan.micro_batch * plan.seq_len / plan.cp
    h, kv, f = m.hidden, m.kv_heads * m.head_dim, m.ffn_hidden
    sp = plan.sequence_parallel or t == 1
    if plan.recompute == "full" and not full_layer:
        return tokens * 2 * h / (t if sp else 1)
    mask = h if sw.dropout else 0
    replicated = 2 * h + mask + 2 * h + mask + 4 * h  # QKV input, MLP input, masks, norm inputs
    split = 2 * h + 4 * kv + 2 * h + (6 * f if m.mlp == "swiglu" else 4 * f)
    if not sw.flash_attention and (plan.recompute == "none" or full_layer):
        split += (5 if sw.dropout else 4) * m.heads * plan.seq_len
    per_token = (replicated + split) / t if sp else replicated + split / t
    return tokens * per_token


def in_flight(plan: Plan, rank: int) -> float:
    """Micro-batch-chunks whose activations rank holds at the peak of the 1F1B schedule."""
    p, v, mb = plan.pp, plan.vpp, plan.grad_accum
    if v == 1:
        return min(p - rank, mb)
    # Megatron's interleaved warm-up: 2(p - rank - 1) + (v - 1) p chunks, plus the one in flight.
    return min(2 * (p - rank - 1) + (v - 1) * p + 1, mb * v)


def stage_memory(plan: Plan, stage: Stage, sw: Software = HYBRIDPAR) -> StageMemory:
    m, t = plan.model, plan.tp
    n = params_per_rank(plan, stage)
    weights, grads, optimizer = model_state_bytes(n, plan.zero_group, plan.zero_stage, sw.fp32_grads,
                                                  sw.zero2_reduce_once)

    tokens = plan.micro_batch * plan.seq_len / plan.cp
    chunks = in_flight(plan, stage.rank)
    layers_per_chunk = stage.layers / plan.vpp
    act = chunks * layers_per_chunk * layer_activation_bytes(plan, sw)
    if plan.recompute == "full" and stage.layers:
        act += layer_activation_bytes(plan, sw, full_layer=True)
    if stage.has_embedding:  # embedding output of every in-flight micro-batch
        act += min(chunks, plan.grad_accum) * tokens * 2 * m.hidden / t
    if stage.has_output:  # final norm, output layer input, fp32 logits: 4sbh/t (1 + V/h)
        act += tokens * 4 * m.hidden / t * (1 + m.vocab / m.hidden)

    buffers = FIXED_OVERHEAD_BYTES + FRAGMENTATION * act
    if plan.zero_stage >= 3:  # the gathered layer being computed and the one prefetched
        buffers += 2 * 2 * layer_params_per_rank(plan)
    return StageMemory(stage.name, weights, grads, optimizer, act, buffers)


def plan_memory(plan: Plan, sw: Software = HYBRIDPAR) -> StageMemory:
    """The pipeline rank with the largest total: it decides whether the plan fits."""
    return max((stage_memory(plan, s, sw=sw) for s in stages(plan)), key=lambda x: x.total)


def weights_floor_bytes(plan: Plan) -> float:
    """A lower bound on any ZeRO stage's model states, for fast pruning and error messages."""
    n = max(params_per_rank(plan, s) for s in stages(plan))
    return 16 * n / plan.zero_group
