"""The optimizer and its learning-rate schedule: AdamW's settings and the schedule's shape.

``OptimizerSettings`` is written once and shared: the recipe's ``train:`` section (recipe.py
``TrainSection``) inherits its fields, and ``OptimConfig`` adds the schedule's length.

The schedule: linear warm-up to ``lr``, then ``lr_decay``: ``cosine`` or ``linear`` down to
``min_lr`` at the last step, ``constant`` at ``lr``, or ``wsd`` (warmup-stable-decay: ``lr`` until
the last ``wsd_decay_steps`` steps, which decay to ``min_lr`` by ``wsd_decay``). The names and
shapes are Megatron-LM's (``--lr-decay-style``, ``--lr-wsd-decay-style``, megatron/core's
OptimizerParamScheduler); WSD lets one stable run be cooled down from any of its checkpoints (Hu et
al. 2024, "MiniCPM"; Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed
Training Durations").
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
    lr_decay: str = "cosine"  # after warm-up: cosine | linear | constant | wsd
    wsd_decay_steps: int = 0  # wsd: the last steps, which decay from lr to min_lr
    wsd_decay: str = "linear"  # wsd's decay: linear | cosine | exponential | minus_sqrt


LR_DECAYS = ("cosine", "linear", "constant", "wsd")
WSD_DECAYS = ("linear", "cosine", "exponential", "minus_sqrt")


@dataclass(frozen=True)
class OptimConfig(OptimizerSettings):
    total_steps: int = 1  # the schedule's length: the run's --steps


def lr_at(step: int, cfg: OptimConfig, global_batch: int) -> float:
    """LR for optimizer step ``step`` (1-based): linear warm-up, then the ``lr_decay`` schedule."""
    scale = global_batch / cfg.lr_scale_base_batch if cfg.lr_scale_base_batch > 0 else 1.0
    peak, floor = cfg.lr * scale, cfg.min_lr * scale
    if cfg.warmup_steps > 0 and step <= cfg.warmup_steps:
        return peak * step / cfg.warmup_steps
    if cfg.lr_decay == "constant":
        return peak
    if cfg.lr_decay == "wsd":
        stable_end = cfg.total_steps - cfg.wsd_decay_steps
        if step <= stable_end:
            return peak
        return decayed(peak, floor, min(1.0, (step - stable_end) / cfg.wsd_decay_steps), cfg.wsd_decay)
    decay_steps = max(1, cfg.total_steps - cfg.warmup_steps)
    return decayed(peak, floor, min(1.0, (step - cfg.warmup_steps) / decay_steps), cfg.lr_decay)


def decayed(peak: float, floor: float, progress: float, shape: str) -> float:
    """The LR ``progress`` (0 to 1) of the way through a decay from peak to floor."""
    if shape == "linear":
        left = 1.0 - progress
    elif shape == "cosine":
        left = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif shape == "exponential":  # 2 x 0.5^progress - 1: from 1 to 0, steepest at the start (Megatron's)
        left = 2.0 * 0.5**progress - 1.0
    elif shape == "minus_sqrt":
        left = 1.0 - math.sqrt(progress)
    else:
        raise ValueError(f"unknown decay shape {shape!r}")
    return floor + (peak - floor) * left
