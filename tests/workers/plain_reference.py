"""An independent one-process reference for tests/integration/test_runtime.py: plain PyTorch, no megatron-core,
no DeepSpeed, no hybridpar runtime code on the training path.

The forward is hybridpar/llama_ref.py's plain-torch Llama (itself checked against megatron's
model in tests/integration/test_generate.py) run with autograd on leaf tensors; the loss is the mean
cross-entropy over every token of the global batch; the optimizer is ``torch.optim.AdamW`` with
weight decay on matrices only; clipping is ``torch.nn.utils.clip_grad_norm_`` over all
parameters; the learning-rate schedule is written out below (linear warm-up, then cosine to the
minimum). If a bug were common to every hybridpar layout (and so to hybridpar's own one-process
run), the layouts would still agree with each other, but not with this.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from hybridpar.runtime.llama_ref import LlamaReference, RefOptions


def schedule(step: int, peak: float, floor: float, warmup: int, total: int) -> float:
    if warmup and step <= warmup:
        return peak * step / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (peak - floor) * (1 + math.cos(math.pi * progress)) / 2


def train_plain(spec, weights: dict, source, steps: int, *, lr: float, min_lr: float, warmup: int, total: int,
                weight_decay: float, betas: tuple, eps: float, grad_clip: float, tied: bool) -> dict:
    """Train from ``weights`` (canonical names, fp32) for ``steps`` steps; losses, pre-clip grad
    norms and the final weights."""
    model = LlamaReference(spec, weights, RefOptions(rope_base=spec.rope_theta), tied=tied)
    params = {name: t.clone().requires_grad_(True) for name, t in model.w.items()}
    model.w = params
    forward = LlamaReference.logits.__wrapped__  # the same math, with autograd
    decay = [p for p in params.values() if p.dim() >= 2]
    flat = [p for p in params.values() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": flat, "weight_decay": 0.0}],
                            lr=lr, betas=betas, eps=eps)
    losses, norms = [], []
    for step in range(1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = schedule(step, lr, min_lr, warmup, total)
        batch = source.global_batch(step)
        logits = forward(model, batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), grad_clip if grad_clip > 0 else float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
        norms.append(float(norm))
    return {"losses": losses, "grad_norms": norms, "weights": {k: v.detach().clone() for k, v in params.items()}}
