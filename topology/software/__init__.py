"""What the training software does, as far as the memory and time models need to know.

The planner plans for hybridpar's own stack (megatron-core layers with FlashAttention, sequence
parallelism, no dropout; the DP gradient all-reduce issued during the last backward, DeepSpeed's
ZeRO step and weight gathering after it): `profile.py`, with the megatron-core and NeMo stacks.
The published runs the planner is validated on were made with other code too (`other_stacks.py`); each
stack is described from the code it ran, never tuned to its throughput.
"""
from .other_stacks import (AUTOCAST_GRAD_BYTES, DEEPSPEED_BF16_PIPE, DEEPSPEED_PIPE_RESERVE, DEEPSPEED_PIPE_ZERO1,
                           FLASH_ATTN_TRAINING_2022, FSDP_CAST_TO_FP32,
                           FSDP_COMPOSER_STEP_BYTES, FSDP_FLAT_GRAD_CAT, MEGATRON_2021, MEGATRON_2021_RESERVE,
                           MEGATRON_2021_TORCH_DDP, MEGATRON_2022, NEMO_MEGATRON_2022, NEMO_MEGATRON_2022_O1,
                           PYTORCH_FSDP, PYTORCH_FSDP_FP32_REDUCE, TORCH_FOREACH_STEP_BYTES, TORCHTITAN_2024)
from .profile import (CROSS_ENTROPY_KERNELS, GRAD_ADD_16BIT, GRAD_ADD_CAST_COPY, GRAD_ADD_MIXED, GRAD_BUCKET_NUMEL,
                      HYBRIDPAR, MEGATRON_CORE, MEGATRON_CORE_BF16_GRADS, NEMO_DFA, CrossEntropyKernel, Software)

# `hybridpar plan --software NAME`: plan for hybridpar's runtime (default) or evaluate a layout
# under the stack a published run used.
PROFILES = {sw.name: sw for sw in (HYBRIDPAR, MEGATRON_CORE, MEGATRON_CORE_BF16_GRADS, NEMO_DFA, MEGATRON_2021,
                                   MEGATRON_2022, NEMO_MEGATRON_2022, NEMO_MEGATRON_2022_O1, MEGATRON_2021_TORCH_DDP,
                                   DEEPSPEED_BF16_PIPE, DEEPSPEED_PIPE_ZERO1, PYTORCH_FSDP, PYTORCH_FSDP_FP32_REDUCE,
                                   TORCHTITAN_2024, FLASH_ATTN_TRAINING_2022)}

__all__ = ["AUTOCAST_GRAD_BYTES", "CROSS_ENTROPY_KERNELS", "DEEPSPEED_BF16_PIPE", "DEEPSPEED_PIPE_RESERVE", "DEEPSPEED_PIPE_ZERO1",
           "FLASH_ATTN_TRAINING_2022", "FSDP_CAST_TO_FP32", "FSDP_COMPOSER_STEP_BYTES", "FSDP_FLAT_GRAD_CAT", "GRAD_ADD_16BIT", "GRAD_ADD_CAST_COPY",
           "GRAD_ADD_MIXED", "GRAD_BUCKET_NUMEL", "HYBRIDPAR", "MEGATRON_2021", "MEGATRON_2021_RESERVE",
           "MEGATRON_2021_TORCH_DDP", "MEGATRON_2022", "MEGATRON_CORE", "MEGATRON_CORE_BF16_GRADS", "NEMO_DFA",
           "NEMO_MEGATRON_2022", "NEMO_MEGATRON_2022_O1",
           "PROFILES", "PYTORCH_FSDP", "PYTORCH_FSDP_FP32_REDUCE", "TORCH_FOREACH_STEP_BYTES", "TORCHTITAN_2024",
           "CrossEntropyKernel", "Software"]
