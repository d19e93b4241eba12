"""The training-loop hook: resume at start, save every N steps, after the last step, and at an early stop."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from .load import load_checkpoint
from .save import save_checkpoint


@dataclass(frozen=True)
class CheckpointConfig:
    save_dir: Optional[str] = None
    save_every: int = 0  # 0: only after the last step (when save_dir is set)
    resume: Optional[str] = None  # a save dir (its latest checkpoint) or one step-NNNNNN dir
    keep_last: int = 0  # 0: keep every checkpoint


class Checkpointer:
    """``train(..., hooks=[Checkpointer(config, last_step, recipe)])``."""

    def __init__(self, config: CheckpointConfig, last_step: int, recipe=None, print_fn=print, stop=None):
        self.config, self.last_step, self.recipe, self.print_fn = config, last_step, recipe, print_fn
        self.stop = stop  # stopping.StopConditions: learns how long a save takes (--exit-after)
        self.saved: list[str] = []
        self.saved_step: int | None = None
        self.resumed_step: int | None = None

    def on_start(self, job, first_step: int) -> int:
        if not self.config.resume:
            return first_step
        self.resumed_step = load_checkpoint(job, self.config.resume, print_fn=self.print_fn)
        return self.resumed_step + 1

    def due(self, step: int) -> bool:
        every = self.config.save_every
        return bool(self.config.save_dir) and (step == self.last_step or (every > 0 and step % every == 0))

    def on_step(self, job, metrics) -> None:
        if self.due(metrics.step):
            self.save(job, metrics.step)

    def on_stop(self, job, metrics) -> None:
        """The run stops early after this step: save it, unless that was just done."""
        if self.config.save_dir and self.saved_step != metrics.step:
            self.save(job, metrics.step)

    def save(self, job, step: int) -> str:
        start = time.monotonic()
        path = save_checkpoint(job, self.config.save_dir, step, recipe=self.recipe, keep_last=self.config.keep_last)
        if self.stop is not None:
            self.stop.observe(save_s=time.monotonic() - start)
        self.saved.append(path)
        self.saved_step = step
        import torch.distributed as dist

        if dist.get_rank() == 0 and self.print_fn:
            self.print_fn(f"saved checkpoint {path}")
        return path
