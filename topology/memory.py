"""Memory per GPU for a Plan: model states under ZeRO, activations, and what the frameworks hold
besides (logits, pipeline buffers, framework copies, the optimizer step's temporaries, CUDA
context, NCCL buffers, allocator fragmentation), each a part of the total.

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
plus one layer's full activations while it is being recomputed. torchtitan's policies: every second block
checkpointed whole (half the blocks keep their input only), or each block keeping its input, the attention's
output and logsumexp and every other matmul's output (Q, V, gate, down: 2h + 2kv + 2F + 2h), each with one
block's full set while it is recomputed.
What a rotary (Llama) layer of megatron-core keeps besides, measured on hybridpar's layer
(hybridpar/observe/activation_audit.py; tests/integration/test_activation_audit.py): FlashAttention's fp32 logsumexp
(4a), and, where software/profile.py says the stack does so, the rotated Q and K (2h + 2kv: RoPE is out of
place while V, a view of the fused QKV output, keeps that output whole; rope_copies_kept), the
cos/sin tables of unfused RoPE (8 head_dim, not split by TP; rope_fusion) and two more F-sized
tensors of unfused SwiGLU (10F in all; swiglu_fusion). RMSNorm's fp32 rstd (8 bytes per token) is
left out. torchtitan's eager layer (software.TORCHTITAN_2024), measured tensor by tensor on CPU
(tests/unit/test_planner_torchtitan_activations.py): K and V repeated to every query head (2h each),
silu's input and output, the other projection and the product (8F), and with its PyTorch RMSNorm each norm's
fp32 copy of its input and the bf16 cast before the weight instead of the input (4h more per norm); its
complex RoPE keeps only the shared frequency table. hybridpar's context parallelism all-gathers K and V and keeps
them for the whole sequence (Software.cp_gathered_kv_kept); a ring (Transformer Engine's) keeps the local ones.
"""
from __future__ import annotations

import math

from dataclasses import dataclass
from functools import lru_cache

from .fp8 import fp8_weight_bytes, saved_bytes_change
from .hardware import GIB
from .plan import Plan
from .software import CROSS_ENTROPY_KERNELS, GRAD_BUCKET_NUMEL, HYBRIDPAR, Software
from .stages import Stage, layer_params_per_rank, params_per_rank, stages

# What frameworks hold beyond weights, gradients, optimizer state and activations (issue 15 §2):
# CUDA context (driver state and the kernels loaded lazily, CUDA_MODULE_LOADING=LAZY, PyTorch's
# default since CUDA 11.7): 426 MiB in nvidia-smi after a bare torch 2.10 process touched the GPU
# (unsloth-zoo PR #1053's measurement, cu130) [M], "around 400MB if CUDA >= 11.7 is used and lazy module
# loading enabled" (pytorch/pytorch#109888) [S]. Stacks that loaded every kernel at start (before CUDA
# 11.7, Software.eager_module_loading): 1573 MiB on an A100 40GB of Jean Zay, where BLOOM ran
# (bigscience tr11-176B-ml/chronicles-prequel.md: `torch.ones(1).cuda()` and nvidia-smi) [M].
# Plus cuBLAS/cuBLASLt workspaces: PyTorch keeps 32 MiB per handle and stream on Hopper
# (CUBLAS_WORKSPACE_CONFIG default, torch docs "cuBLAS workspaces"), Transformer Engine and
# megatron-core another 32 MiB cuBLASLt workspace per stream [S]; two streams assumed, for every stack.
CUBLAS_WORKSPACE_BYTES = 4 * 32 * 2**20
CUDA_CONTEXT_BYTES = 426 * 2**20 + CUBLAS_WORKSPACE_BYTES
EAGER_CUDA_CONTEXT_BYTES = 1573 * 2**20 + CUBLAS_WORKSPACE_BYTES
# NCCL buffers per communicator a rank uses for ring/tree collectives: one buffer per channel and
# protocol set, 10 MiB each (NVIDIA/nccl issue 1685, NCCL_DEBUG_SUBSYS=ALLOC on 8 x H100: 10,485,760-
# and 2,097,152-byte buffers per channel connection, up to 32 channels over NVLink); "memory usage is
# linearly tied to the number of channels ... Ring uses a limited amount of memory as it only has 2
# connections regardless of the scale" (sjeaugey, issues 864/986). A ring channel receives from one
# peer: 32 channels x (10 + 2) MiB inside a node; over the network NCCL opens 2 channels per NIC
# (one NIC per GPU on DGX-class nodes, NCCL's default NCCL_MIN_NCHANNELS for IB is small) [R]:
# 4 channels x 12 MiB assumed, plus the proxy's host-pinned buffers, which are not GPU memory.
NCCL_CHANNEL_BYTES = 12 * 2**20
NCCL_CHANNELS_NVLINK = 32
NCCL_CHANNELS_NETWORK = 4
# The PyTorch caching allocator keeps freed blocks for reuse: reserved exceeds allocated by the
# blocks that no request of the right size reuses. Where the stack's own reserve was measured
# (Software.allocator_reserve: reserved over peak allocated, minus 1), that share of everything the
# allocator holds; otherwise assumed 10% of the memory that is allocated and freed every
# micro-batch (activations, logits, pipeline buffers, temporaries), none of the model states,
# which are allocated once [assumption, stated]. NCCL's buffers and the CUDA context are outside
# the allocator.
FRAGMENTATION = 0.10
# A plan within this share of the GPU's memory is marked "tight": the allocator and framework terms
# above are estimates, and a few percent is what they may be off by [assumption, stated].
TIGHT_MARGIN = 0.05
PARTS = ("params", "grads", "optimizer", "activations", "logits", "pipeline_buffers", "framework_buffers",
         "optimizer_step_temp", "cuda_context", "nccl", "fragmentation")


@dataclass(frozen=True)
class StageMemory:
    """Peak bytes on one GPU of a pipeline stage, part by part; total is their sum."""
    stage: str
    params: float  # 16-bit weights (the rank's ZeRO-3 shard); under fp8, Transformer Engine's cached fp8 copies too;
    # fp32 weights and their bf16 autocast copies where the stack keeps them (Software.autocast_fp32_weights)
    grads: float
    optimizer: float  # fp32 master weights, momentum, variance (sharded by ZeRO)
    activations: float  # tensors the layers keep for backward, every in-flight micro-batch
    logits: float = 0.0  # last stage: the vocab-parallel cross-entropy's logits
    pipeline_buffers: float = 0.0  # send/receive buffers of pipeline parallelism
    framework_buffers: float = 0.0  # ZeRO-3 gathers, gradient buckets, FSDP's flat gradient of one layer
    optimizer_step_temp: float = 0.0  # the optimizer step's temporary beyond the activations it reuses
    cuda_context: float = 0.0  # CUDA context, cuBLAS/cuBLASLt workspaces
    nccl: float = 0.0  # NCCL buffers of the communicators the rank uses
    fragmentation: float = 0.0  # the caching allocator's unreused blocks

    @property
    def total(self) -> float:  # the sum over PARTS, written out: the search calls it for every candidate
        return (self.params + self.grads + self.optimizer + self.activations + self.logits + self.pipeline_buffers
                + self.framework_buffers + self.optimizer_step_temp + self.cuda_context + self.nccl + self.fragmentation)

    @property
    def states(self) -> float:
        return self.params + self.grads + self.optimizer

    @property
    def overhead(self) -> float:
        """Everything beyond model states and activations."""
        return self.total - self.states - self.activations

    def tight(self, capacity_bytes: float) -> bool:
        return self.total > (1 - TIGHT_MARGIN) * capacity_bytes

    def gib(self) -> dict:
        """Every part and the total in GiB to 2 decimals, the parts rounded so that they add up to the
        rounded total exactly (largest remainder: the parts that lost most by rounding down get the
        hundredths left over)."""
        hundredths = {k: getattr(self, k) / GIB * 100 for k in PARTS}
        total = round(sum(hundredths.values()))
        parts = {k: math.floor(v) for k, v in hundredths.items()}
        by_remainder = sorted(PARTS, key=lambda k: hundredths[k] - parts[k], reverse=True)
        for k in by_remainder[:max(0, total - sum(parts.values()))]:
            parts[k] += 1
        return {**{k: parts[k] / 100 for k in PARTS}, "total": total / 100}


def model_state_bytes(n_params: float, dp: int, zero_stage: int, fp32_grads: bool = False,
                      zero2_reduce_once: bool = False, optimizer_bytes: int = 12):
    """(weights, gradients, optimizer) bytes per GPU for n_params held by its model-parallel rank.

    ``zero2_reduce_once`` (hybridpar's ZeRO-2, software.Software): the gradients accumulate in a
    full buffer until the step's one reduction (hybridpar/zero/engine.py _defer_zero2_reduction), so
    ZeRO-2 shards only the optimizer state, like ZeRO-1."""
    grad_bytes = 4 if fp32_grads else 2
    weights = 2 * n_params / (dp if zero_stage >= 3 else 1)
    sharded_grads = zero_stage >= 3 or (zero_stage == 2 and not zero2_reduce_once)
    grads = grad_bytes * n_params / (dp if sharded_grads else 1)
    optimizer = optimizer_bytes * n_params / (dp if zero_stage >= 1 else 1)
    return weights, grads, optimizer


def layer_activation_bytes(plan: Plan, sw: Software, full_layer: bool = False, fp8_transposes: bool = True) -> float:
    """Bytes one transformer layer keeps for one micro-batch on one GPU (under fp8, on a GPU whose fp8 GEMMs need
    transposed copies or not: hardware.GPU.fp8_transposes)."""
    m, t = plan.model, plan.tp
    tokens = plan.micro_batch * plan.seq_len / plan.cp
    h, kv, f = m.hidden, m.kv_heads * m.head_dim, m.ffn_hidden
    sp = plan.sequence_parallel or t == 1
    block_input = tokens * 2 * h / (t if sp else 1)
    if plan.recompute == "full" and not full_layer:
        return block_input
    if plan.recompute == "every-other-block" and not full_layer:  # per block on average
        return (block_input + layer_activation_bytes(plan, sw, True, fp8_transposes)) / 2
    if plan.recompute == "op-selective" and not full_layer:
        # torchtitan's op policy: the block's input, the attention's output and fp32 logsumexp, and the outputs of
        # every other matmul in forward order (Q, V, the gate projection, the down projection)
        return block_input + tokens * (2 * h + 2 * kv + 2 * f + 2 * h + 4 * m.heads) / t
    mask = h if sw.dropout else 0
    replicated = 2 * h + mask + 2 * h + mask + 4 * h  # QKV input, MLP input, masks, norm inputs
    if not sw.norm_fusion:  # each norm keeps an fp32 copy of its input (4h) and the cast before the weight (2h),
        replicated += 2 * 4 * h  # not the input itself (2h)
    swiglu = 6 * f if sw.swiglu_fusion else 8 * f if sw.swiglu_separate_projections else 10 * f
    k_and_v = 4 * h if sw.kv_heads_repeated else 4 * kv  # repeated to every query head, the attention keeps them
    split = 2 * h + k_and_v + 2 * h + (swiglu if m.mlp == "swiglu" else 4 * f)
    if sw.rotary and sw.rope_copies_kept:  # rotated Q and K beside the QKV output V's view keeps whole
        split += 2 * h + 2 * kv
    if sw.flash_attention:  # its fp32 logsumexp per head (with selective recomputation: rerun)
        if plan.recompute == "none" or full_layer:
            split += 4 * m.heads
    elif plan.recompute == "none" or full_layer:
        split += (5 if sw.dropout else 4) * m.heads * plan.seq_len
    if plan.cp > 1 and sw.cp_gathered_kv_kept and (plan.recompute == "none" or full_layer):
        # K and V all-gathered over CP are kept for the whole sequence, cp times the local 4kv. In hybridpar's
        # layer the local rotated K and the QKV output (kept whole at CP 1 by V's view) are freed and the two
        # chunks' attention output is concatenated and copied for the projection: 2kv less (measured,
        # tests/integration/test_activation_audit.py at CP 2 and 4). Selective recomputation reruns the gather.
        split += 4 * kv * (plan.cp - 1) - (2 * kv if sw.rope_copies_kept else 0)
    per_token = (replicated + split) / t if sp else replicated + split / t
    if sw.rotary and not sw.rope_fusion and sw.rope_style == "rotate-half":  # cos and sin for Q and for K, per position
        per_token += 4 * 2 * m.head_dim
    if plan.precision == "fp8":  # what Transformer Engine keeps in fp8 (topology/fp8.py)
        per_token += saved_bytes_change(m, t, sp and t > 1, fp8_transposes)  # TE's sequence_parallel is off at TP 1
    return tokens * per_token


def in_flight(plan: Plan, rank: int) -> float:
    """Micro-batch-chunks whose activations rank holds at the peak of the 1F1B schedule."""
    p, v, mb = plan.pp, plan.vpp, plan.grad_accum
    if v == 1:
        return min(p - rank, mb)
    # Megatron's interleaved warm-up: 2(p - rank - 1) + (v - 1) p chunks, plus the one in flight.
    return min(2 * (p - rank - 1) + (v - 1) * p + 1, mb * v)




def _nccl_bytes(plan: Plan, stage: Stage) -> float:
    """NCCL buffers of the communicators this rank runs collectives or sends on: TP, CP, the
    pipeline's neighbours, DP x CP, the tied-embedding group of the end stages and the world group
    (loss and timing reductions). A group that leaves the node rings over the network."""
    tied_end = plan.model.tied_embeddings and (stage.has_embedding or stage.has_output)
    return _nccl_group_bytes(plan.tp, plan.cp, plan.pp, plan.dp, plan.gpus_per_node, tied_end)


@lru_cache(maxsize=None)
def _nccl_group_bytes(tp: int, cp: int, pp: int, dp: int, per_node: int, tied_end: bool) -> float:
    groups = []  # span in GPUs (for locality) of each group with more than one rank
    if tp > 1:
        groups.append(tp)
    if cp > 1:
        groups.append(tp * cp)
    if pp > 1:
        groups += [tp * cp * pp] * (2 if tied_end else 1)
    world = tp * cp * pp * dp
    if dp * cp > 1:
        groups.append(world if dp > 1 else tp * cp)
    if world > 1:
        groups.append(world)
    return sum(NCCL_CHANNEL_BYTES * (NCCL_CHANNELS_NVLINK if span <= per_node else NCCL_CHANNELS_NETWORK)
               for span in groups)


def stage_memory(plan: Plan, stage: Stage, sw: Software = HYBRIDPAR, fp8_transposes: bool = True) -> StageMemory:
    m, t = plan.model, plan.tp
    n = params_per_rank(plan, stage)
    weights, grads, optimizer = model_state_bytes(n, plan.zero_group, plan.zero_stage, sw.fp32_grads,
                                                  sw.zero2_reduce_once, sw.optimizer_state_bytes_per_param)
    if sw.keeps_16bit_grads:
        grads += 2 * n
    if sw.autocast_fp32_weights:  # the fp32 weight and autocast's bf16 copy of it, where 2 bytes were counted
        weights += 4 * n
    if sw.fp32_flat_shards and plan.zero_stage >= 3:
        weights, grads = 0.0, 4 * n / plan.zero_group
    if plan.precision == "fp8":  # Transformer Engine's fp8 weights (topology/fp8.py): cached beside the 16-bit ones,
        # or with fp8 parameters in place of them (counted at 2 bytes above)
        per_param = fp8_weight_bytes(fp8_transposes) - (2 if sw.fp8_params else 0)
        weights += per_param * stage.layers * layer_params_per_rank(plan)

    tokens = plan.micro_batch * plan.seq_len / plan.cp
    chunks = in_flight(plan, stage.rank)
    layers_per_chunk = stage.layers / plan.vpp
    act = chunks * layers_per_chunk * layer_activation_bytes(plan, sw, fp8_transposes=fp8_transposes)
    if plan.recompute in ("full", "every-other-block", "op-selective") and stage.layers:  # a block recomputed
        act += layer_activation_bytes(plan, sw, True, fp8_transposes)
    if sw.autocast_fp32_weights and sw.autocast_copy_per_micro_batch:  # beyond the copy counted with the weights
        act += (chunks - 1) * 2 * stage.layers * layer_params_per_rank(plan)
    if stage.has_embedding:  # embedding output of every in-flight micro-batch
        act += min(chunks, plan.grad_accum) * tokens * 2 * m.hidden / t
    logits = 0.0
    if stage.has_output:  # final norm and output layer inputs (Korthikanti's 4sbh/t), then the logits
        act += tokens * 4 * m.hidden / t
        logits = tokens * m.vocab / t * CROSS_ENTROPY_KERNELS[sw.cross_entropy].peak_bytes

    pipe = 0.0
    if plan.pp > 1:
        # The activation received for the next forward and the gradient for the next backward
        # (megatron-core p2p_communication.py allocates both per exchange).
        message = tokens * m.hidden * 2 / (t if plan.sequence_parallel else 1)
        pipe = 2 * message
        if sw.pipeline_output_buffers and not stage.has_output:
            pipe += min(chunks, plan.grad_accum) * tokens * m.hidden * 2
    framework = sw.layer_grad_peak_bytes_per_param * layer_params_per_rank(plan)
    if plan.zero_stage >= 3:  # the gathered layer being computed and the one prefetched
        framework += 2 * 2 * layer_params_per_rank(plan)
    elif sw.zero2_reduce_once and plan.zero_group > 1:  # grad_sync.py's fp32 copy of one bucket
        framework += 4 * min(GRAD_BUCKET_NUMEL, n)
    # The optimizer step runs after the last backward, when activations, logits and pipeline
    # buffers are free: its temporaries reuse that memory and add only what exceeds it.
    shard = n / (plan.zero_group if plan.zero_stage >= 1 else 1)
    dynamic = act + logits + pipe
    temp = sw.optimizer_temp_bytes_per_param * shard
    step_extra = max(0.0, temp - dynamic)
    if sw.allocator_reserve is not None:
        allocated = weights + grads + optimizer + dynamic + framework + step_extra
        fragmentation = sw.allocator_reserve * allocated
    else:
        fragmentation = FRAGMENTATION * max(dynamic, temp)
    return StageMemory(stage.name, weights, grads, optimizer, act, logits, pipe, framework, step_extra,
                       EAGER_CUDA_CONTEXT_BYTES if sw.eager_module_loading else CUDA_CONTEXT_BYTES,
                       _nccl_bytes(plan, stage), fragmentation)


def plan_memory(plan: Plan, sw: Software = HYBRIDPAR, fp8_transposes: bool = True) -> StageMemory:
    """The pipeline rank with the largest total: it decides whether the plan fits."""
    return max((stage_memory(plan, s, sw, fp8_transposes) for s in stages(plan)), key=lambda x: x.total)


def weights_floor_bytes(plan: Plan) -> float:
    """A lower bound on any ZeRO stage's model states, for fast pruning and error messages."""
    n = max(params_per_rank(plan, s) for s in stages(plan))
    return 16 * n / plan.zero_group
