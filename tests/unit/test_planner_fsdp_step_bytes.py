"""The optimizer step the planner charges PyTorch FSDP runs (software.FSDP_COMPOSER_STEP_BYTES): llm-foundry's
Composer DecoupledAdamW at weight decay 0 and FSDP's clip_grad_norm_, replayed op by op on one fp32 shard and
counted with hybridpar's TrafficCounter (bytes read and written per aten operation)."""
from __future__ import annotations

import math

import pytest
import torch

from hybridpar.observe.step_bytes import TrafficCounter
from hybridpar.topology.cost import optimizer_step_bytes
from hybridpar.topology.software import (FSDP_COMPOSER_STEP_BYTES, MEGATRON_CORE, PYTORCH_FSDP,
                                         PYTORCH_FSDP_FP32_REDUCE)

NUMEL = 1 << 16


def _decoupled_adamw(param, grad, exp_avg, exp_avg_sq, step, lr=1e-4, betas=(0.9, 0.95), eps=1e-8):
    """Composer's DecoupledAdamW.adamw for one tensor, weight_decay 0 (its decay multiply is skipped)."""
    beta1, beta2 = betas
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2 ** step)).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1 ** step))


def _fsdp_clip_grad_norm(grads, max_norm=1.0):
    """FullyShardedDataParallel.clip_grad_norm_ on one rank's shards: fp32 norms, their norm (the all-reduce
    of its square moves no HBM worth counting), the clamped coefficient multiplied in place."""
    local = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, 2.0, dtype=torch.float32)
                                                  for g in grads]), 2.0, dtype=torch.float32)
    coef = torch.clamp(max_norm / (local + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.device, g.dtype))


def test_composer_step_bytes_are_counted_op_by_op():
    param, grad, exp_avg, exp_avg_sq = (torch.randn(NUMEL) for _ in range(4))
    exp_avg_sq.abs_()
    with TrafficCounter() as clip:
        _fsdp_clip_grad_norm([grad])
    with TrafficCounter() as adamw:
        _decoupled_adamw(param, grad, exp_avg, exp_avg_sq, step=3)
    assert adamw.total / NUMEL == pytest.approx(84, abs=0.01)
    assert clip.total / NUMEL == pytest.approx(12, abs=0.01)
    assert (adamw.total + clip.total) / NUMEL == pytest.approx(FSDP_COMPOSER_STEP_BYTES, abs=0.01)


def test_fsdp_profiles_charge_it_on_every_group_and_fused_stacks_do_not():
    for sw in (PYTORCH_FSDP, PYTORCH_FSDP_FP32_REDUCE):
        assert {optimizer_step_bytes(sw, 3, group) for group in (1, 8, 512)} == {FSDP_COMPOSER_STEP_BYTES}
    assert optimizer_step_bytes(MEGATRON_CORE, 1, 8) == 30  # a fused Adam: 2 x 12 of state, 4 in, 2 out
