"""The optimizer and its learning-rate schedule: AdamW's settings and the schedule's shape.

``OptimizerSettings`` is written once and shared: the recipe's ``train:`` section (recipe.py
``TrainSection``) inherits its fields, and ``OptimConfig`` adds the schedule's length.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class OptimizerSettings:
    lr: float = 3e-4  # peak
    min_lr: float = 3e-5  # the cosine's floor
    warmup_steps: int = 0
    weight_decay: float = 0.1  # on matrices only (zero/engine.py param_groups)
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # global gradient-norm clipping; 0 disables it
    lr_scale_base_batch: int = 0  # > 0: linear LR scaling, lr x global_batch / this


@dataclass(frozen=True)
class OptimConfig(OptimizerSettings):
    total_steps: int = 1  # the schedule's length: the run's --steps


def lr_at(step: int, cfg: OptimConfig, global_batch: int) -> float:
    """LR for optimizer step ``step`` (1-based): linear warmup, then cosine decay to min_lr."""
    scale = global_batch / cfg.lr_scale_base_batch if cfg.lr_scale_base_batch > 0 else 1.0
    peak, floor = cfg.lr * scale, cfg.min_lr * scale
    if cfg.warmup_steps > 0 and step <= cfg.warmup_steps:
        return peak * step / cfg.warmup_steps
    decay_steps = max(1, cfg.total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / decay_steps)
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))
