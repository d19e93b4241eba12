"""The stacks of published runs other than megatron-core's: Megatron-LM 2021 and 2022, DeepSpeed's pipeline
engine (BigScience, MT-NLG), PyTorch FSDP (MosaicML's llm-foundry), torchtitan 2024 and FlashAttention's own GPT
training (2022), each described from the code it ran."""
from __future__ import annotations

from dataclasses import replace

from .profile import (GRAD_ADD_16BIT, GRAD_ADD_CAST_COPY, GRAD_ADD_MIXED, MEGATRON_CORE, Software)


# The caching allocator's reserve on the 2021 stacks, measured: BigScience's 3D-parallel runs on Jean Zay
# (bigscience-workshop/bigscience experiments/gpt2-meg-ds-3d, 52B GPT, TP4 PP16, micro-batch 4, Megatron's
# "memory (MB) | ... max allocated | ... max reserved" after the first iteration, 63 ranks each) [M]:
# max reserved over max allocated, median 1.153 (1.061-1.199) with DeepSpeed's PipelineEngine
# (meg_ds_3d_gpt2_perf_n16-ds-on.out, DeepSpeed 0.4) and 1.272 (1.081-1.397) with Megatron's own schedule
# (-ds-off.out). V100s and PyTorch of 2021: the closest stored measurement for these stacks.
DEEPSPEED_PIPE_RESERVE = 0.153
MEGATRON_2021_RESERVE = 0.272
# Megatron-LM 2021-2022 (Narayanan et al.'s run scripts, BLOOM's Megatron-DeepSpeed): fused
# scale-mask-softmax on materialised scores (FlashAttention appeared in May 2022), dropout 0.1,
# DP all-reduce after the pipeline flush (--DDP-impl local: allreduce_gradients() after the
# schedule), blocking pipeline sends.
# Gradient accumulation fusion came later (2022), so main grads are added by a separate kernel.
# Its linear layers all-reduce the input gradient synchronously (the async all-reduce came with
# megatron-core), and it splits pipeline messages over TP (scatter/gather, Narayanan et al. §4.1).
# No ZeRO: its distributed optimizer came in 2022.
# CUDA 11.x before 11.7 (2022): every kernel loaded into the context at start.
# No context parallelism: it came with megatron-core (2023); a replica splits along TP and PP.
MEGATRON_2021 = Software(name="megatron-lm-2021", label="Megatron-LM 2021", sequence_parallel=False, zero_stages=(0,), dp_inside_pp=True,
                         recompute_modes=("none", "full"), rotary=False,
                         flash_attention=False, dropout=True, overlap_grad_reduce=False, overlap_param_gather=False,
                         overlap_p2p=False, grad_accum_bytes_per_param=GRAD_ADD_MIXED, tp_bwd_overlap=False, p2p_scatter_gather=True,
                         eager_module_loading=True, allocator_reserve=MEGATRON_2021_RESERVE,
                         model_parallel_axes=("tp", "pp"))
# Megatron-LM 2022 (Korthikanti et al. 2022, "Reducing Activation Recomputation"): the 2021 layers
# with sequence parallelism and selective recomputation (the attention core again in backward), still
# no FlashAttention and dropout 0.1; --async-tensor-model-parallel-allreduce (the column-parallel
# input-gradient all-reduce behind the weight-gradient GEMM), --gradient-accumulation-fusion (no
# separate accumulation kernel) and --use-distributed-optimizer (ZeRO-1); the DP reduction still after
# the pipeline flush (its overlap came in 2023).
MEGATRON_2022 = replace(MEGATRON_2021, name="megatron-lm-2022", label="Megatron-LM 2022", sequence_parallel=True,
                        recompute_modes=("none", "selective", "full"), zero_stages=(0, 1), tp_bwd_overlap=True,
                        grad_accum_bytes_per_param=0)
# NeMo Megatron 2022 (NVIDIA's BigNLP containers 22.06-22.08, NeMo 1.11, NeMo-Framework-Launcher's GPT-3 recipes of
# August 2022): the same Megatron layers through apex.transformer, bf16 with megatron_amp_O2 (fp32 master weights
# and an fp32 main_grad that gradient_accumulation_fusion accumulates into, all-reduced in fp32 over DP), apex
# FusedAdam without ZeRO, no interleaved schedule (forward_backward_pipelining_without_interleaving). Without
# pipeline parallelism the main grads are all-reduced during the last micro-batch's backward (the optimizer
# wrapper's no_sync), with it or with sequence parallelism after the flush (MegatronGPTModel.training_step, NeMo
# v1.11.0: Software.grad_reduce_after_flush_with_pp). Its weights and fp32 main grads live in buffers allocated once
# (gradient_as_bucket_view, O2's contiguous main_grad), not the per-tensor gradients of the 2021 code whose
# reserve was measured (MEGATRON_2021_RESERVE): the caching allocator's reserve is the planner's default
# assumption (memory.FRAGMENTATION of what each micro-batch allocates and frees).
NEMO_MEGATRON_2022 = replace(MEGATRON_2022, name="nemo-megatron-2022", label="NeMo Megatron 2022 (apex O2, FusedAdam)",
                             fp32_grads=True, interleaved_pipeline=False, allocator_reserve=None,
                             overlap_grad_reduce=True, grad_reduce_after_flush_with_pp=True)
# The same code with --DDP-impl torch (examples/sc21/run_table_1.sh for the 1.7B-18B rows of
# Narayanan et al.'s Table 1): torch's DistributedDataParallel all-reduces the fp16 gradients in
# buckets as the last micro-batch's backward produces them (megatron's schedules run the others
# under model.no_sync()), and autograd accumulates them in the fp16 .grad; no fp32 main grad.
MEGATRON_2021_TORCH_DDP = replace(MEGATRON_2021, name="megatron-lm-2021-torch-ddp",
                                  label="Megatron-LM 2021 with torch DDP", overlap_grad_reduce=True,
                                  grad_accum_bytes_per_param=GRAD_ADD_16BIT)
# BLOOM's Megatron-DeepSpeed (bigscience tr11-176B-ml): the 2021 Megatron layers driven by
# DeepSpeed's PipelineEngine and BF16_Optimizer, which "accumulates grads in fp32. It doesn't shard
# the static fp32 buffer" (formulas.md §3) and all-reduces those fp32 gradients.
# PipelineEngine also splits activations and gradients over the model-parallel ranks
# (runtime/pipe/engine.py is_pipe_partitioned / is_grad_partitioned, on by default), so
# p2p_scatter_gather stays True.
# PipelineEngine refuses ZeRO-2 and 3; BF16_Optimizer shards the fp32 optimizer state over DP (ZeRO-1).
# Memory: the PipelineEngine keeps each in-flight micro-batch's stage output in
# pipe_buffers['outputs'] until its backward (runtime/pipe/engine.py _exec_forward_pass;
# TrainSchedule.num_pipe_buffers = stages - stage_id); DeepSpeed's FusedAdam steps in place; the
# bf16 .grad copies stay beside the fp32 buffer (keeps_16bit_grads).
_DEEPSPEED_PIPE = replace(MEGATRON_2021, zero_stages=(0, 1), blocking_p2p=True, pipeline_output_buffers=True,
                          allocator_reserve=DEEPSPEED_PIPE_RESERVE, interleaved_pipeline=False)
DEEPSPEED_BF16_PIPE = replace(_DEEPSPEED_PIPE, name="deepspeed-pipe-bf16",
                              label="DeepSpeed's pipeline engine with BF16_Optimizer", fp32_grads=True,
                              full_grad_allreduce=True, grad_accum_bytes_per_param=GRAD_ADD_CAST_COPY,
                              keeps_16bit_grads=True)
# The same engine with DeepSpeed's own ZeRO-1 optimizer on 16-bit weights, as BigScience ran its
# layout sweep before BF16_Optimizer existed (chronicles-prequel.md: the runs after the 02-25
# tables are "with BF16 optimizer that was just written to accumulate gradients in fp32 ...
# compared to fp16 which grad accumulates in fp16. The additional memory usage is 4bytes x
# params"; their slurm scripts then ran ZERO_STAGE=1 on DeepSpeed master). DeepSpeed 0.5
# (zero/stage_1_and_2.py, defaults reduce_scatter and contiguous_gradients on, overlap_comm off):
# autograd accumulates the 16-bit .grad; after the flush each bucket's slices are reduced to the
# ranks that own them (average_tensor: dist.reduce per owner, a reduce-scatter's bytes) in 16 bits;
# the step flattens the owned slice and casts it to fp32 (2 + 4 bytes per parameter of the shard,
# in memory the activations have freed), and the updated 16-bit weights are all-gathered.
DEEPSPEED_PIPE_ZERO1 = replace(_DEEPSPEED_PIPE, name="deepspeed-pipe-zero1",
                               label="DeepSpeed's pipeline engine with its ZeRO-1 optimizer (16-bit gradients)",
                               grad_accum_bytes_per_param=GRAD_ADD_16BIT, optimizer_temp_bytes_per_param=6)

# PyTorch FSDP with flat parameters (torch 1.13-2.x FullyShardedDataParallel, FULL_SHARD; MosaicML's
# llm-foundry through Composer): ZeRO-3 over the DP group, each wrapped block's parameters one FlatParameter,
# gathered for its forward and again for its backward, its gradient reduce-scattered after every
# micro-batch's backward (Composer accumulates without no_sync), both overlapped with compute. What a
# micro-batch's backward does to every parameter's gradient beyond the GEMMs, in HBM bytes per parameter
# of the gathered block [V]:
# * the block's parameters are views of the gathered flat parameter (flat_param.py _get_unflat_views:
#   tensor.split(flat_param._numels) then .view(shape)), so autograd's backward of that split concatenates
#   every weight gradient into one flat gradient (split_with_sizes_backward: at::cat): read 2, write 2;
# * _runtime_utils.py _post_backward_hook casts it to the reduce dtype when that differs from the compute
#   dtype (flat_param.grad.to(handle._reduce_dtype)): read 2, write 4 with fp32 reduction;
# * the default communication hook (algorithms/_comm_hooks/default_hooks.py reduce_scatter_hook) divides the
#   unsharded gradient in place by the pre-divide factor before the reduce-scatter (grad.div_, a factor > 1
#   for every group of 2 or more ranks): read and write it in the reduce dtype.
# The cast and division run on FSDP's post-backward stream, beside the next block's backward; they are
# charged as if on the compute stream (MosaicML's micro-batch sweep measures more than their sum per step
# beyond the compute: docs/planner.md). The sharded gradient's post-divide, fp32 cast and accumulation
# touch 1/dp of the bytes and are left out.
FSDP_FLAT_GRAD_CAT = 4
FSDP_CAST_TO_FP32 = 6
# Its state between gathers: each parameter's fp32 shard is the weight the optimizer steps (counted with the
# optimizer state as its master copy) and is cast to 16 bits for each gather, so no 16-bit copy is kept at
# ZeRO-3 (the gathered layers are counted with the framework buffers); the reduced gradient shard is cast to
# the parameter's dtype, fp32, whatever the reduction's (_runtime_utils.py _cast_grad_to_param_dtype), and
# Composer's DecoupledAdamW steps one flat shard at a time, so its temporaries are one block's shard, not
# counted (fp32_flat_shards).
# Only FULL_SHARD is modelled: without no_sync, NO_SHARD all-reduces and SHARD_GRAD_OP gathers again every
# micro-batch, which the ZeRO-0/2 step costs do not describe.
# Its optimizer step, per fp32 parameter of the shard [M]: llm-foundry's pretraining YAMLs (mpt-*.yaml, which its
# benchmarking/submit_benchmarks.py keeps but for the batch, precision and FSDP fields) run Composer's
# DecoupledAdamW at weight_decay 0 and its GradientClipping at norm 1.0. DecoupledAdamW.adamw
# (composer/optim/decoupled_weight_decay.py) is one unfused op per term: mul_ and add_ for the momentum, mul_
# and addcmul_ for the variance, sqrt, a division and add_ for the denominator, addcdiv_ for the update: 84
# bytes; FullyShardedDataParallel.clip_grad_norm_ reads the shard for its fp32 norm and multiplies it in place
# by the clamped coefficient: 12. tests/unit/test_planner_fsdp_step_bytes.py counts the sequence with
# hybridpar's TrafficCounter.
FSDP_COMPOSER_STEP_BYTES = 84 + 12
_PYTORCH_FSDP = replace(MEGATRON_CORE, zero_stages=(3,), optimizer_temp_bytes_per_param=0, fp32_flat_shards=True, fp8=None,
                        optimizer_step_bytes_counted=(FSDP_COMPOSER_STEP_BYTES,) * 3)
# Reduction in bf16: Composer's PURE mode (param, reduce and buffer dtypes bf16), and its DEFAULT mode up to
# Composer 0.16.3, which set param_dtype and buffer_dtype only, so that FSDP infers reduce_dtype = param_dtype
# (flat_param.py _init_param_reduce_dtypes, "infer gradient reduction mixed precision"): the flat gradient
# is not cast, and the division touches 2 + 2 bytes.
PYTORCH_FSDP = replace(_PYTORCH_FSDP, name="pytorch-fsdp", label="PyTorch FSDP (flat parameters, bf16 reduction)",
                       fp32_grads=False, grad_accum_bytes_per_param=FSDP_FLAT_GRAD_CAT + 2 * 2,
                       layer_grad_peak_bytes_per_param=2 + 2)
# Reduction in fp32 (MixedPrecision reduce_dtype float32; Composer's DEFAULT mode from 0.16.4, composer #2628):
# the cast, then the division reads and writes 4 + 4.
PYTORCH_FSDP_FP32_REDUCE = replace(_PYTORCH_FSDP, name="pytorch-fsdp-fp32-reduce",
                                   label="PyTorch FSDP (flat parameters, fp32 reduction)", fp32_grads=True,
                                   grad_accum_bytes_per_param=FSDP_FLAT_GRAD_CAT + FSDP_CAST_TO_FP32 + 2 * 4,
                                   layer_grad_peak_bytes_per_param=2 + 4)

# torchtitan as it ran its first published benchmarks (pytorch/torchtitan 1ea476e9f, April 2024; docs/performance.md:
# Llama 2 and 3 on 64 A100s, FSDP2 only) [V]: eager PyTorch (compile = false in every train_configs/*.toml), a
# Meta-reference Llama (torchtitan/models/llama/model.py) under FSDP2, fully_shard per block, reshard_after_forward
# but for the last block (parallelisms/parallelize_llama.py), MixedPrecisionPolicy(param_dtype=bf16,
# reduce_dtype=fp32), one micro-batch per step (train.py: no gradient accumulation).
# * FSDP2's reduction (torch 2.4 _fsdp_collectives.py foreach_reduce): each parameter's bf16 gradient is copied
#   into one fp32 reduce-scatter input (read 2, write 4 per parameter of the block); fp32 is reduced with NCCL's
#   average, so no division kernels (_get_gradient_divide_factors returns None for fp32 and bf16). At the end
#   of a block's backward its bf16 gradients and that fp32 input both exist: 2 + 4.
# * Its gather: the all-gather output is copied out into each parameter's unsharded tensor
#   (foreach_all_gather_copy_out: split_with_sizes_copy), read 2 and write 2 per parameter, forward and backward.
# * Layers: F.scaled_dot_product_attention(is_causal=True), FlashAttention-2 inside PyTorch on A100; RMSNorm the
#   toml's norm_type: fused_rmsnorm (a Triton kernel, one read and write as the fused profiles) for the 8B and
#   13B configs, rmsnorm (PyTorch operations) for the 70B ones (cases.py: norm_fusion per run); RoPE by complex
#   multiplication; SwiGLU w2(silu(w1 x) * w3 x); repeat_kv before the attention (kernels.py counts each chain;
#   its .transpose(1, 2).contiguous() of the attention output copies nothing: PyTorch's FlashAttention-2 writes
#   the output token-major and returns the transposed view). The loss: the output layer's logits cast to fp32
#   (model.py: self.output(h).float()), then F.cross_entropy (CROSS_ENTROPY_KERNELS["torch-fp32"]).
# * Its step (train.py): clip_grad_norm_(foreach=True) at max_norm 1.0, then torch.optim.AdamW(foreach=True,
#   weight_decay=0.1) on the fp32 shards: TORCH_FOREACH_STEP_BYTES, counted; its square root of the variance is
#   a new tensor the size of the shard (4 bytes per parameter).
# Activation checkpointing (parallelize_llama.py checkpoint_wrapper): "full" (every block's forward again in
# backward), "every-other-block" (selective_ac_option "2": every second block checkpointed whole) and "op-selective"
# (option "op": every block under a policy that keeps the outputs of its matmuls but every second one, of the
# attention kernel and of reduce-scatters, and recomputes the rest), and none.
TORCH_FOREACH_STEP_BYTES = 84 + 12
TORCHTITAN_2024 = replace(_PYTORCH_FSDP, name="torchtitan-2024", label="torchtitan 2024 (FSDP2, eager)",
                          fp32_grads=True, grad_accum_bytes_per_param=FSDP_CAST_TO_FP32,
                          layer_grad_peak_bytes_per_param=2 + 4, gather_copy_out_bytes_per_param=2 + 2,
                          recompute_modes=("none", "every-other-block", "op-selective", "full"), rope_fusion=False, rope_style="complex",
                          swiglu_fusion=False, swiglu_separate_projections=True, kv_heads_repeated=True,
                          cross_entropy="torch-fp32", model_parallel_axes=("tp",), optimizer_temp_bytes_per_param=4,
                          optimizer_step_bytes_counted=(TORCH_FOREACH_STEP_BYTES,) * 3)

# FlashAttention's GPT training as it ran the throughputs of its training README (Dao-AILab/flash-attention
# training/ at 4a6eaa9f, November 2022: GPT-3 125M to 2.7B on one node of 8 A100 80GB) [V]: PyTorch Lightning's
# DDP (DDPStrategyZero1 with torch's ZeroRedundancyOptimizer over AdamW from 760M up, apex's FusedAdam below:
# configs/experiment/pile/gpt3*-flash.yaml), precision bf16 (autocast over fp32 weights), flash_attn/models/gpt.py
# with FlashAttention 1.x (attention dropout inside its kernel, not costed), fused bias GEMMs and
# FusedDenseGeluDense (gelu_in_gemm_epilogue), dropout_add_layer_norm (dropout, residual add and LayerNorm in one
# kernel), GPT-2's learned positions and dropouts (GPT2Config: 0.1), apex's cross-entropy on the 16-bit logits with
# in-place backward (CrossEntropyLossApex: "fused-16bit"), no activation checkpointing.
# * Gradients: autocast casts each fp32 weight to bf16 in every micro-batch's forward (read 4, write 2); the bf16
#   weight gradient is cast back (read 2, write 4) and added into the fp32 .grad (read 4 + 4, write 4): 24 bytes
#   per parameter and micro-batch (AUTOCAST_GRAD_BYTES). DDP all-reduces the fp32 gradients bucket by bucket
#   behind the last micro-batch's backward (Lightning skips the sync on the others).
# * ZeroRedundancyOptimizer: each rank steps its eighth, then broadcasts its updated fp32 parameters, after the
#   step and not overlapped: costed as the planner's 16-bit gather so placed (the fp32 broadcast moves twice its
#   bytes: under 0.2% of these steps). The step as a fused Adam on fp32 weights: read the weight, gradient and both
#   moments, write the weight and moments, 28 bytes per parameter (torch's AdamW and the clipping move more: under
#   0.5% of these steps).
# * Memory: the fp32 weights with autocast's bf16 copies (autocast_fp32_weights), fp32 gradients, the two moments
#   (sharded over DP under ZeRO-1).
AUTOCAST_GRAD_BYTES = 6 + 6 + 12
FP32_ADAM_STEP_BYTES = 4 * 4 + 3 * 4
FLASH_ATTN_TRAINING_2022 = replace(MEGATRON_CORE, name="flash-attn-training-2022",
                                   label="FlashAttention's GPT training 2022 (Lightning DDP, FlashAttention 1.x)",
                                   sequence_parallel=False, zero_stages=(0, 1), recompute_modes=("none",),
                                   model_parallel_axes=(), attention_kernel="flash1", dropout=True, rotary=False,
                                   fp32_grads=True, grad_accum_bytes_per_param=AUTOCAST_GRAD_BYTES,
                                   full_grad_allreduce=True, overlap_param_gather=False, gelu_in_gemm_epilogue=True,
                                   cross_entropy="fused-16bit", fp8=None, autocast_fp32_weights=True,
                                   optimizer_state_bytes_per_param=8,
                                   optimizer_step_bytes_counted=(FP32_ADAM_STEP_BYTES,) * 3)

# NeMo Megatron 2022 with megatron_amp_O2=False ("O1"; NeMo-Framework-Launcher's release-performance CI, train_gpt3_model.sh
# AMP_STYLE=O1: also gradient_accumulation_fusion=False): the same layers over fp32 parameters, each transformer layer's
# forward under torch.autocast (NeMo v1.11.0 transformer.py ParallelTransformerLayer), counted from NeMo v1.11.0 and
# apex's tensor_parallel/layers.py and layer norms (contrib/layer_norm, fused_layer_norm.py) of 2022 [V]:
# * Every linear and LayerNorm casts its fp32 arguments with apex's _cast_if_autocast_enabled (a .to(), not autocast's
#   weight cache) and runs with autocast off: each micro-batch casts every weight to bf16 (read 4, write 2), its bf16
#   weight gradient is cast back by autograd (read 2, write 4) and added into the fp32 .grad (read 4 + 4, write 4):
#   AUTOCAST_GRAD_BYTES per parameter and micro-batch.
# * NeMo's fused bias-dropout-add and bias-GELU (fused_bias_dropout_add.py, fused_bias_gelu.py) cast their arguments the
#   same way, the fp32 biases and the embeddings' fp32 output included, so every activation after the first layer's
#   first residual add is bf16: the layer moves the 16-bit layer's bytes per token.
# * Kernels per layer beyond the 16-bit layer's: forward 12 casts (each norm's weight and bias, the four GEMM weights,
#   the QKV bias, the three biases the fused functions take); backward their 12 casts back and the 4 weights' gradient
#   additions that gradient_accumulation_fusion made part of the GEMM.
# * MegatronGPTModel.training_step: "async grad allreduce is not currently implemented for O1/autocasting mixed
#   precision training so we all-reduce gradients after the pipeline" (allreduce_gradients: the fp32 .grad flattened
#   into one buffer, read 4 and write 4, divided by DP in place, 8, all-reduced, and copied back, 8), then apex's
#   FusedAdam on the fp32 parameters (FP32_ADAM_STEP_BYTES): 52 bytes per parameter of the step, no master copy.
#   No ZeRO: "Distributed optimizers require O2" (MegatronGPTModel.__init__).
# * Memory: fp32 weights and a bf16 copy of each for every micro-batch in flight (autocast_fp32_weights,
#   autocast_copy_per_micro_batch: the linears save the cast weight for their backward).
O1_ALLREDUCE_COPY_BYTES = 8 + 8 + 8
NEMO_MEGATRON_2022_O1 = replace(NEMO_MEGATRON_2022, name="nemo-megatron-2022-o1",
                                label="NeMo Megatron 2022 (autocast O1, FusedAdam on fp32 weights)",
                                zero_stages=(0,), overlap_grad_reduce=False, grad_accum_bytes_per_param=AUTOCAST_GRAD_BYTES,
                                autocast_fp32_weights=True, autocast_copy_per_micro_batch=True,
                                optimizer_state_bytes_per_param=8,
                                optimizer_step_bytes_counted=(FP32_ADAM_STEP_BYTES + O1_ALLREDUCE_COPY_BYTES,) * 3,
                                kernels_per_layer=(NEMO_MEGATRON_2022.kernels_per_layer[0] + 12,
                                                   NEMO_MEGATRON_2022.kernels_per_layer[1] + 16))
