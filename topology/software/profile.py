"""What a software profile says (Software), the gradient and loss kernels it points to, and the profiles of
hybridpar's own runtime and of the megatron-core stacks (megatron-core, NeMo 1 and 2)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..fp8 import DELAYED, TRANSFORMER_ENGINE
from ..kernels import HBM_EFFICIENCY, MIXED_ADD_HBM


# Gradient bucket of the overlapped DP reduction: megatron-core's default 40M elements
# (DistributedDataParallelConfig: max(40M, 1M x dp)); hybridpar/zero/grad_sync.py uses this one.
GRAD_BUCKET_NUMEL = 40_000_000
GRAD_ADD_MIXED = 10  # read 2 (16-bit gradient) + read 4 + write 4 (fp32 buffer)
GRAD_ADD_CAST_COPY = 18  # cast: read 2 + write 4; add: read 4 + read 4 + write 4
GRAD_ADD_16BIT = 6  # autograd's in-place add into a 16-bit .grad: read 2 + read 2 + write 2


@dataclass(frozen=True)
class CrossEntropyKernel:
    """The loss over the vocabulary, per logit (one token, one vocabulary entry of the rank's slice)."""
    forward_bytes: int  # HBM bytes read and written in forward
    backward_bytes: int  # HBM bytes read and written in backward, up to the 16-bit logits' gradient
    peak_bytes: int  # bytes held at the loss's peak (memory.py: the last stage's logits)


# Megatron's vocab-parallel cross-entropy (megatron-core tensor_parallel/cross_entropy.py; the same steps in
# Megatron-LM 2021's mpu/cross_entropy.py, which BLOOM's Megatron-DeepSpeed ran), on the 16-bit logits of the
# output layer. Forward: .float() (read 2, write 4), max (read 4), in-place subtract of the max (read 4,
# write 4), exp into itself (read 4, write 4), sum (read 4), in-place divide into the softmax it saves
# (read 4, write 4): 38. Backward: the in-place multiply by the loss gradient (read 4, write 4) and the
# cast back to 16 bits (read 4, write 2): 14. At its peak the 16-bit logits and their fp32 copy both
# exist: 6. hybridpar's runtime calls it through megatron-core's GPTModel (no cross_entropy_loss_fusion).
# The same steps as megatron-core's cross_entropy_loss_fusion runs them (fusions/fused_cross_entropy.py, the
# "native" implementation, megatron-core's default): each step a function under torch.compile
# (core/jit.py: jit_fuser from torch 2.2), one pass per function, inputs it mutates written back.
# Forward: cast and max in one pass (read 2, write 4), subtract, exp and sum (read 4, write 4), divide
# (read 4, write 4): 22. Backward: multiply and cast (read 4, write the fp32 softmax back 4 and the 16-bit
# gradient 2): 10. Peak as unfused, 6. NeMo 2's GPTConfig turns the fusion on.
# PyTorch's own, on logits cast to fp32 first (torchtitan: self.output(h).float(), then F.cross_entropy), counted
# by TrafficCounter (tests/unit/test_planner_torchtitan_ops.py): forward the cast (read 2, write 4), log_softmax
# (read 4, write 4) and nll_loss, which gathers one value per token: 14; backward nll_loss's gradient (a
# zero-fill, 4, and a scatter), log_softmax's (read 4 + 4, write 4) and the cast back (read 4, write 2): 22 (the
# counter charges each nll_loss a full read, 4 more each way, that its CUDA kernels do not make). Peak in
# log_softmax's backward: the fp32 logits (train.py keeps `pred`), the saved log-probabilities, nll_loss's
# gradient and log_softmax's output, 4 bytes each: 16; the 16-bit logits are freed after the cast.
# flash-attn's xentropy CUDA kernel (flash_attn/losses/cross_entropy.py and csrc/xentropy/xentropy_kernel.cu,
# v1.0.9, the version llm-foundry pinned; MosaicML's MPT default loss_fn, fused_crossentropy): on the 16-bit
# logits, fp32 only in registers. Forward: one pass for the max, one for the sum of exponentials (read 2 each);
# it saves the logits and an fp32 log-sum-exp per row. Backward: read the logits, write a new 16-bit gradient
# (inplace_backward off, llm-foundry's setting): 4. Peak: the logits and that gradient, 4.
CROSS_ENTROPY_KERNELS = {
    "vocab-parallel-fp32": CrossEntropyKernel(forward_bytes=38, backward_bytes=14, peak_bytes=6),
    "vocab-parallel-fused": CrossEntropyKernel(forward_bytes=22, backward_bytes=10, peak_bytes=6),
    "fused-16bit": CrossEntropyKernel(forward_bytes=4, backward_bytes=4, peak_bytes=4),
    "torch-fp32": CrossEntropyKernel(forward_bytes=14, backward_bytes=22, peak_bytes=16),
}


@dataclass(frozen=True)
class Software:
    # What `hybridpar plan --software NAME` calls it, and how errors name it.
    name: str = "hybridpar"
    label: str = "hybridpar's runtime"
    # Sequence parallelism (Korthikanti et al. 2022) exists in the stack: with TP > 1 the planner
    # uses it (megatron-core, hybridpar). Megatron-LM 2021 had none.
    sequence_parallel: bool = True
    # FlashAttention: scores never stored, masked (causal) blocks skipped. Without it the
    # s x s scores are written to HBM and softmax/dropout run as memory-bound kernels.
    flash_attention: bool = True
    # Dropout masks are stored and applied (1 byte per element), as in GPT-3-era training.
    dropout: bool = False
    # The DP gradient reduction is issued bucket by bucket during the last micro-batch's backward
    # and hidden behind it up to that backward's length (megatron-core overlap_grad_reduce;
    # hybridpar/zero/grad_sync.py). False: it runs after the backward, exposed.
    overlap_grad_reduce: bool = True
    # With pipeline or sequence parallelism the reduction waits for the pipeline flush whatever
    # overlap_grad_reduce says (NeMo 1.11's MegatronGPTModel.training_step: O2's no_sync hooks overlap it only
    # without either; with them it all-reduces the main grads after the flush).
    grad_reduce_after_flush_with_pp: bool = False
    # ZeRO's all-gather of the updated 16-bit weights overlaps the next step's first forward, all
    # but its first bucket (megatron-core overlap_param_gather; hybridpar/zero/param_gather.py). False:
    # it runs inside the optimizer step, exposed.
    overlap_param_gather: bool = True
    # Pipeline sends/receives overlap compute in the interleaved schedule (overlap_p2p_comm).
    overlap_p2p: bool = True
    # Gradients reduced in fp32 (Llama 3: "FP32 gradient accumulation and reduce-scatter").
    fp32_grads: bool = False
    # HBM bytes per parameter and micro-batch spent adding the 16-bit weight gradient into the
    # fp32 accumulation buffer outside the GEMM. 0: the GEMM epilogue accumulates into the fp32
    # main grad (megatron-core gradient_accumulation_fusion). GRAD_ADD_MIXED (10): one add that
    # casts on the fly, reading the 16-bit gradient and reading and writing the fp32 buffer
    # (Megatron-LM 2021: main_grad.add_(grad); hybridpar's runtime, engine._fp32_grad).
    # GRAD_ADD_CAST_COPY (18): the gradient is first cast into an fp32 temporary (read 2, write 4),
    # then added (read 4 + 4, write 4): DeepSpeed's BF16_Optimizer.update_hp_grads,
    # hp_grad.add_(lp.grad.to(hp_grad.dtype)), after every micro-batch's backward
    # (runtime/pipe/engine.py _exec_backward_pass; the same code since the optimizer was written
    # for BLOOM), and torch autograd with Tensor.grad_dtype = float32, which casts each incoming
    # gradient first.
    grad_accum_bytes_per_param: int = 0
    # Each pipeline send and receive is its own blocking call, so the four transfers a stage
    # makes per micro-batch (receive activation, send activation, receive gradient, send
    # gradient) run one after another instead of as two paired send+receive exchanges
    # (DeepSpeed PipelineEngine: runtime/pipe/p2p.py send/recv assert async_op == False).
    blocking_p2p: bool = False
    # Gradients are all-reduced in full over DP (in fp32 when fp32_grads) although the optimizer
    # is sharded; the updated 16-bit weights are then all-gathered. DeepSpeed's BF16_Optimizer
    # with pipeline parallelism: runtime/pipe/engine.py _bf16_reduce_grads ->
    # buffered_allreduce_fallback over the fp32 _hp_grad buffers. Also DeepSpeed's own ZeRO-1/2
    # reduction as hybridpar drives it with overlap_grad_reduce off: DeepSpeed 0.19's
    # zero_optimization.use_multi_rank_bucket_allreduce defaults to true, so each gradient bucket
    # is all-reduced in full and each rank keeps its partition (measured: docs/benchmarks.md,
    # comm). Not for ZeRO-0 (one all-reduce anyway). False: a reduce-scatter, or hybridpar's
    # reduce of each element to the rank that steps it (grad_sync.py; the same bytes).
    full_grad_allreduce: bool = False
    # Attention kernel efficiency (fraction of dense peak, fwd+bwd); None: the GPU's default
    # (hardware.GPU.attention_fraction, a current FlashAttention-class kernel).
    attention_fraction: float | None = None
    # The attention kernel: "flash2" (FlashAttention-2 or a kernel as fast, which attention_fraction
    # describes), "triton" (FlashAttention in Triton, flash-attn's flash_attn_triton.py, which
    # MosaicML's llm-foundry ran as attn_impl: triton) or "flash1" (FlashAttention 1.x's CUDA kernel);
    # kernels.attention_kernel_slowdown says how much slower.
    attention_kernel: str = "flash2"
    # The cross-entropy over the vocabulary on the last stage, a key of CROSS_ENTROPY_KERNELS: what it
    # reads and writes in HBM and what it holds at its peak.
    cross_entropy: str = "vocab-parallel-fp32"
    # Backward TP collectives of column-parallel linears are issued async and overlap a GEMM:
    # without SP the input-gradient all-reduce overlaps the weight-gradient GEMM; with SP the
    # re-all-gather of the input overlaps the input-gradient GEMM and the input-gradient
    # reduce-scatter the weight-gradient GEMM (megatron-core 0.16.1 tensor_parallel/layers.py,
    # LinearWithGradAccumulationAndAsyncCommunication.backward: all_gather/all_reduce/
    # reduce_scatter with async_op=True, "we rely on CUDA_DEVICE_MAX_CONNECTIONS=1 to ensure
    # that the ... is scheduled before the ... computation"). Assumed hidden up to that GEMM's
    # time, which loses the SMs NCCL holds meanwhile (links.sm_contention). Forward collectives and the row-parallel backward all-gather
    # (mappings.py, synchronous) stay exposed. False: every TP collective exposed.
    tp_bwd_overlap: bool = True
    # Context parallelism as a ring: each CP step sends the K/V chunk the next step needs (and in backward its
    # dK/dV) while the current chunk's attention runs, so only what outlasts that attention is exposed
    # (Transformer Engine's AttnFuncWithCP, "overlap current-step compute with next-step communication",
    # v1.4 on; megatron-core's default cp_comm_type "p2p"). False: K and V all-gathered before the
    # attention and dK/dV reduce-scattered after it, exposed (Llama 3 §3.3.2; hybridpar's runtime,
    # hybridpar/runtime/attention.py).
    cp_ring_overlap: bool = False
    # Without the ring, the gathered K and V of the whole sequence stay saved for backward (hybridpar's runtime:
    # SDPA keeps its inputs; measured, tests/integration/test_activation_audit.py). False: only the local K/V
    # (a ring; Llama 3 does not say what its all-gather keeps, and its CP16 run at 131,072 tokens trained, which
    # with the whole sequence's K/V kept would need 85.7 GiB).
    cp_gathered_kv_kept: bool = False
    # Pipeline messages are split over the TP ranks and all-gathered on the receiver (Megatron-LM
    # 2021 --scatter-gather-tensors-in-pipeline, Narayanan et al. 2021 §4.1). megatron-core's
    # p2p_communication.py has no such option: without sequence parallelism every TP rank sends
    # the full b s h activation.
    p2p_scatter_gather: bool = False
    # hybridpar's ZeRO-2 (hybridpar/zero/engine.py _defer_zero2_reduction): gradients accumulate in a
    # full, unsharded buffer over the micro-batches and are reduced once per step at the
    # boundary, after the last backward (not overlapped). False: classic ZeRO-2 (DeepSpeed's
    # hooks, FSDP SHARD_GRAD_OP): sharded gradients, reduce-scattered every micro-batch.
    zero2_reduce_once: bool = False
    # ZeRO stages the software runs (hybridpar's runtime refuses ZeRO-3: hybridpar/config/recipe.py).
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    # Activation recomputation modes it offers (selective recomputation came with sequence
    # parallelism in 2022, Korthikanti et al.).
    recompute_modes: tuple[str, ...] = ("none", "selective", "full")
    # Rotary position embeddings applied to Q and K in every layer (Llama, Nemotron); the 2021-2022
    # GPT models used learned absolute position embeddings, BLOOM ALiBi (inside the softmax kernel).
    rotary: bool = True
    # RoPE as one fused kernel (megatron-core apply_rope_fusion, Transformer Engine's fused RoPE,
    # which keeps only the shared frequency table). False: megatron-core's unfused
    # _apply_rotary_pos_emb_bshd (models/common/embeddings/rope_utils.py), whose cos and sin tables
    # of the positions (t.dtype, head_dim per token) are made anew for Q and for K in every layer
    # and kept by the multiplications: 4 x 2 x head_dim bytes per token and layer, not split by TP.
    rope_fusion: bool = True
    # The rotated Q and K are new tensors the core attention keeps, while V, a view of the fused QKV
    # output, keeps that whole output alive: 2h + 2kv bytes per token beyond Korthikanti's Q, K, V
    # (measured on hybridpar's layer: megatron-core's SelfAttention with SDPA). Transformer Engine's
    # attention may copy V into a layout of its own, freeing the QKV output; not measured here (no TE
    # on CPU), so the other profiles keep Korthikanti's count.
    rope_copies_kept: bool = False
    # How the stack trains in fp8 (--precision fp8): fp8.TRANSFORMER_ENGINE, Transformer Engine's delayed
    # scaling inside megatron-core's layers (topology/fp8.py); None: it has no fp8 training, and the
    # planner refuses to cost it. hybridpar's runtime builds megatron-core's local layers, without TE.
    fp8: str | None = None
    # Under fp8, the weights are kept in fp8 (Megatron-LM --fp8-param-gather, NeMo's fp8_params): no 16-bit
    # weight beside Transformer Engine's fp8 copy (topology/fp8.py fp8_weight_bytes) ...
    fp8_params: bool = False
    # ... and the distributed optimizer all-gathers the updated weights as fp8, 1 byte per parameter, not 2
    # (megatron-core's; NeMo 2's fp8 precision plugin sets both).
    fp8_param_gather: bool = False
    # Transformer Engine's scaling recipe (topology/fp8.py): fp8.DELAYED (NeMo's and megatron-core's default
    # DelayedScaling) or fp8.CURRENT (Float8CurrentScaling: each tensor's amax read before its cast).
    fp8_scaling: str = DELAYED
    # SwiGLU as one fused function (megatron-core bias_activation_fusion: fusions/fused_bias_swiglu.py
    # keeps only its input, gate and up, and recomputes in backward). False: megatron-core 0.16's
    # unfused glu (transformer/mlp.py): silu(gate) * (up + glu_linear_offset), where the silu output
    # and the offset sum are new tensors the product keeps, beside gate and up (kept by silu through
    # its view of the fc1 output) and the product (the fc2 input): 10F bytes per token, not 6F.
    swiglu_fusion: bool = True
    # Memory the framework holds beyond the model states and activations (topology/memory.py):
    # bytes per parameter of the optimizer shard that the optimizer step allocates as temporaries,
    # and whether the pipeline keeps each in-flight micro-batch's stage output in a buffer of its own.
    optimizer_temp_bytes_per_param: int = 0
    pipeline_output_buffers: bool = False
    # Bytes per parameter of one layer that the layer's weight gradient holds at once at the end of its
    # backward, beyond the gradient buffers counted with the model states: PyTorch FSDP's flat gradient
    # beside the views' gradients it concatenates (2 + 2), or, with fp32 reduction, the bf16 flat gradient
    # beside its fp32 cast (2 + 4). 0: gradients land in their buffers (megatron-core, DeepSpeed).
    layer_grad_peak_bytes_per_param: int = 0
    # PyTorch FSDP's sharded state (software.PYTORCH_FSDP): at ZeRO-3 no 16-bit copy of the weights between
    # gathers (the fp32 shard, counted with the optimizer state, is the weight), and the gradient shard in fp32.
    fp32_flat_shards: bool = False
    # The 16-bit .grad of every parameter stays allocated beside the fp32 accumulation buffer
    # (2 bytes per parameter more, not sharded): DeepSpeed's PipelineEngine with BF16_Optimizer frees
    # them only when the next backward starts (runtime/pipe/engine.py _exec_backward_pass:
    # clear_lp_grads() before, update_hp_grads(clear_lp_grads=False) after, since the optimizer's
    # first release, DeepSpeed #1801).
    keeps_16bit_grads: bool = False
    # Optimizer state per parameter of the shard: fp32 master weights, momentum and variance (12,
    # Rajbhandari et al. 2020); apex's DistributedFusedAdam keeps all three in its `dtype` (6 with
    # dtype bf16).
    optimizer_state_bytes_per_param: int = 12
    # HBM bytes per parameter of the shard that the whole optimizer step moves, counted on the stack's own
    # code (ZeRO-0 on one DP rank, ZeRO-1/2 on one DP rank, any stage over several DP ranks); None: a fused
    # Adam's reads and writes of the state (cost.optimizer_step_bytes).
    optimizer_step_bytes_counted: tuple[int, int, int] | None = None
    # Kernels one transformer layer launches per micro-batch, forward and backward (kernels.kernel_bound):
    # counted on megatron-core's layer as hybridpar builds it, every aten operation that is not a
    # view (tests/integration/test_kernel_count.py: 43 and 58 on CPU, whose RMSNorm is a
    # composition; CUDA fuses it). Stacks with Transformer Engine's fused modules launch fewer,
    # Megatron-LM 2021's unfused dropout more; not counted here, so the one count stands for all.
    kernels_per_layer: tuple[int, int] = (43, 58)
    # The run set CUDA_LAUNCH_BLOCKING=1: every kernel launch returns only when the kernel is done
    # (kernels.kernel_bound). A property of how a run was launched, not of the stack: cases.py sets it
    # for the runs that did.
    launch_blocking: bool = False
    # What PyTorch's caching allocator reserves beyond the peak it allocates, as a share of that peak,
    # where it was measured for the stack (topology/memory.py); None: memory.FRAGMENTATION's assumption.
    allocator_reserve: float | None = None
    # The CUDA of the stack loaded every kernel of its libraries into the context at start (before
    # CUDA 11.7's lazy module loading): a larger CUDA context (topology/memory.py).
    eager_module_loading: bool = False
    # Rank order: DP varies faster than PP (Megatron-LM's and DeepSpeed's layouts, see
    # links.dp_ranks_per_node), or DP outermost (hybridpar's mesh; Llama 3's [TP, CP, PP, DP]).
    dp_inside_pp: bool = False
    # Transformer Engine's userbuffers (megatron-core --tp-comm-overlap, NeMo's ub_tp_comm_overlap) overlap
    # the sequence-parallel TP collectives that megatron-core otherwise runs synchronously: the forward
    # all-gathers and the backward output-gradient all-gathers are exchanged chunk by chunk beside the
    # GEMM they feed, the forward reduce-scatters pipelined behind the GEMM that produces them
    # (cost.UB_RS_SPLITS, cost.UB_RS_SMS). False: megatron-core's default, and hybridpar's runtime, which
    # does not set userbuffers up.
    tp_comm_overlap: bool = False
    # How the layer's elementwise work is written where it is not megatron-core's (torchtitan's eager Llama,
    # TORCHTITAN_2024; kernels.py counts each chain): RMSNorm as PyTorch operations on an fp32 copy (False:
    # one fused kernel), RoPE as a complex multiplication on an fp32 copy of Q and K ("complex"; megatron's
    # rotate-half otherwise), SwiGLU as silu and a product of two separate projections' outputs, the K and V
    # heads of grouped-query attention repeated into every query head's before the attention kernel.
    norm_fusion: bool = True
    # Weights kept as fp32 parameters that the optimizer steps in place (PyTorch's autocast over an fp32 model), with
    # autocast's bf16 copy of each held from its forward to its backward: 4 + 2 bytes per parameter in place of the
    # 16-bit weight, and no master copy in the optimizer state (optimizer_state_bytes_per_param: the moments only).
    autocast_fp32_weights: bool = False
    # ... and each micro-batch casts the weights anew and keeps its copies until its backward (apex's linears save the
    # cast weight), so the 1F1B schedule's in-flight micro-batches hold one bf16 copy each; False: one copy a step
    # (autocast's own weight cache, as under PyTorch Lightning's autocast without a pipeline).
    autocast_copy_per_micro_batch: bool = False
    # The MLP's GELU in the first GEMM's epilogue (cuBLASLt's GELU_AUX, its gradient DGELU in the data-gradient
    # GEMM: flash-attn's FusedDenseGeluDense): no pass of its own, only the pre-activation it keeps, written forward
    # and read backward. False: a pass over the activation (megatron's fused bias-GELU is one).
    gelu_in_gemm_epilogue: bool = False
    rope_style: str = "rotate-half"
    swiglu_separate_projections: bool = False
    kv_heads_repeated: bool = False
    # HBM bytes per parameter of a gathered layer that every ZeRO-3 all-gather adds beyond the collective:
    # PyTorch's FSDP2 copies the gathered buffer out into each parameter's own tensor (read 2, write 2).
    # 0: the parameters are views of the gathered buffer (FSDP1's FlatParameter, DeepSpeed).
    gather_copy_out_bytes_per_param: int = 0
    # The model-parallel axes the stack can split a replica along (DP is always there): torchtitan of April 2024
    # had TP beside FSDP, no pipeline (parallelize_llama raised "PP not implemented yet") and no context parallelism.
    model_parallel_axes: tuple[str, ...] = ("tp", "cp", "pp")
    # The interleaved pipeline schedule (virtual stages, Narayanan et al. 2021): Megatron's schedules run it;
    # DeepSpeed's PipelineEngine runs 1F1B only (runtime/pipe/schedule.py TrainSchedule; "equivalent to the
    # 1F1B schedule", deepspeedai/DeepSpeed issue #1110).
    interleaved_pipeline: bool = True

    @property
    def grad_accum_hbm_efficiency(self) -> float:
        """The share of peak HBM bandwidth the accumulation runs at: kernels.MIXED_ADD_HBM for GRAD_ADD_MIXED's
        one add across dtypes, streaming rate for the others (a cast, then adds of equal dtypes)."""
        return MIXED_ADD_HBM if self.grad_accum_bytes_per_param == GRAD_ADD_MIXED else HBM_EFFICIENCY


# hybridpar's runtime: megatron-core's layers and schedules, DeepSpeed ZeRO on the DP axis. The
# gradients are reduced in buckets issued from the last backward (grad_sync.py, megatron's
# no_sync_func marks it): all-reduced at ZeRO-0; at ZeRO-1/2 each element is reduced to the DP
# rank whose DeepSpeed partition holds it (zero_partitions.py: a reduce-scatter's bytes), which
# hands DeepSpeed its partition; DeepSpeed steps, and its all-gather of the updated weights is
# replaced by per-bucket broadcasts from the owners that the next forward waits for bucket by
# bucket (param_gather.py). Gradients accumulate in fp32 (bf16 runs: engine._fp32_grad) and are
# reduced in fp32. megatron-core's gradient_accumulation_fusion is off
# (hybridpar/runtime/model.py: it needs megatron's main_grad buffers and TransformerEngine or apex), so
# every micro-batch's bf16 weight gradients are added into the fp32 ones by autograd's in-place
# accumulation, cast on the fly (engine._fp32_grad; the first micro-batch of a step is only cast,
# 6 bytes, counted like the others; a one-stage model's tied embedding still casts then adds).
# Its optimizer step (hybridpar/zero/engine.py: torch.optim.AdamW under DeepSpeed ZeRO) allocates 8 bytes
# per parameter of the shard: DeepSpeed's fp32 flat partition gradient (zero/stage_1_and_2.py step:
# flat_grad_partition.to(fp32)) and torch's foreach AdamW's sqrt of the variance, a new tensor
# (torch/optim/adam.py _multi_tensor_adam: exp_avg_sq_sqrt = torch._foreach_sqrt(...)).
# The step itself moves far more than a fused Adam's 30 bytes per parameter: counted on CPU over every aten
# operation of StageEngine.step() (hybridpar/observe/step_bytes.py, tests/integration/test_step_bytes.py) [M]:
# 142 bytes per parameter of the shard over several DP ranks, of which torch's AdamW (unfused: weight decay,
# both moments, the square root, its bias correction and epsilon, the update, one pass each) 84, DeepSpeed's
# overflow check (amax, amin) 8 and gradient norm in fp64 (a cast, then the norm) 20, the clipping 8, the
# copy into the bf16 weights 6, the hand-over of the reduced partition 16; on one DP rank DeepSpeed's own
# reduction path runs in the step instead (bucket copies, pre-division, flattening, the partition's sum):
# 174 at ZeRO-1/2, 158 at ZeRO-0 (its bf16 wrapper). On one H200 the AdamW kernels of `hybridpar bench gpu
# --profile` took 23 ms for 1.07B parameters; 84 bytes each at the planner's 0.85 of HBM bandwidth are 22.
# Its layers run megatron-core's unfused RoPE and SwiGLU (hybridpar/runtime/model.py: apply_rope_fusion and
# bias_activation_fusion off, plain PyTorch paths); what they keep was measured tensor by tensor
# (hybridpar/activation_audit.py, docs/planner.md "Memory truth").
HYBRIDPAR = Software(zero2_reduce_once=True, fp32_grads=True, zero_stages=(0, 1, 2), cp_gathered_kv_kept=True,
                     grad_accum_bytes_per_param=GRAD_ADD_MIXED, optimizer_temp_bytes_per_param=8,
                     rope_fusion=False, swiglu_fusion=False, rope_copies_kept=True,
                     optimizer_step_bytes_counted=(158, 174, 142))
# megatron-core / NeMo (and Llama 3's stack): the same layers, megatron-core's distributed
# optimizer (a reduce-scatter of the gradients, overlapped with the last backward; the weight
# all-gather with the next forward) and classic ZeRO-2. bf16 gradients accumulate and are reduced
# in fp32: Megatron-LM's arguments.py forces accumulate_allreduce_grads_in_fp32 for bf16 ("bfloat16
# requires gradient accumulation and all-reduce to be done in fp32") unless --grad-reduce-in-bf16,
# and NeMo 2's bf16_mixed() precision plugin sets grad_reduce_in_fp32=True; megatron-core's
# DistributedDataParallelConfig then keeps an fp32 main-grad buffer, which the weight-gradient
# GEMMs accumulate into (gradient_accumulation_fusion, on in Megatron-LM and NeMo's configs).
# Its distributed optimizer steps apex/Transformer Engine FusedAdam in place on views of the fp32
# buffers: no temporary.
# Its RoPE and SwiGLU are fused: Megatron-LM turns both on unless --no-rope-fusion / --no-bias-swiglu-fusion
# (megatron/training/arguments.py) [R]; NeMo 2 recipes set apply_rope_fusion and bias_activation_fusion [R].
MEGATRON_CORE = replace(HYBRIDPAR, name="megatron-core", label="megatron-core", zero2_reduce_once=False, dp_inside_pp=True,
                        zero_stages=(0, 1, 2, 3), grad_accum_bytes_per_param=0, optimizer_temp_bytes_per_param=0,
                        rope_fusion=True, swiglu_fusion=True, rope_copies_kept=False, optimizer_step_bytes_counted=None,
                        fp8=TRANSFORMER_ENGINE, cp_ring_overlap=True, cp_gathered_kv_kept=False)
# NeMo 1 (the NeMo-Framework-Launcher YAML recipes of NVIDIA's dgxc-benchmarking 24.09-24.11: the
# llama3.1_8b/70b/405b.yaml and nemotron4-15b/340b-synth.yaml files of its v24.11.1 tag [V]):
# megatron-core layers under apex's DistributedFusedAdam ("optim: name: distributed_fused_adam",
# overlap_grad_sync and overlap_param_sync true, contiguous_grad_buffer true, grad_sync_dtype bf16).
# apex/contrib/optimizers/distributed_fused_adam.py [V]: gradients live in a contiguous buffer of
# grad_sync_dtype and are reduce-scattered in it, so 2 bytes per parameter and a bf16 reduction;
# the optimizer state (a copy of the parameters, store_params, plus both moments) is sharded over DP
# in `dtype`, fp32 unless the recipe says otherwise (cases.py: optimizer_state_dtype).
NEMO_DFA = replace(MEGATRON_CORE, name="nemo-distributed-fused-adam", label="NeMo 1 with apex DistributedFusedAdam",
                   fp32_grads=False)
# megatron-core with its gradient buffers and their reduce-scatter in bf16 (Megatron-LM --grad-reduce-in-bf16;
# NeMo 2's performance recipes: pretrain_performance_optimizations sets recipe.trainer.plugins.grad_reduce_in_fp32
# = False for Llama 3/3.1 and Nemotron-4, NVIDIA/NeMo nemo/collections/llm/recipes at the commit dgxc-benchmarking
# v25.04.01 checks out, d2b21556) [V]. Its distributed optimizer keeps fp32 main weights and moments (12 bytes,
# sharded) and, at the step, casts each shard's bf16 gradient to fp32 (megatron/core/optimizer/
# distrib_optimizer.py _copy_model_grads_to_main_grads: shard_main_param.grad = shard_model_grad.float()): a 4-byte
# temporary per parameter of the shard.
MEGATRON_CORE_BF16_GRADS = replace(MEGATRON_CORE, name="megatron-core-bf16-grads",
                                   label="megatron-core with bf16 gradient reduction", fp32_grads=False,
                                   optimizer_temp_bytes_per_param=4)
