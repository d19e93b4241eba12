"""The training-loop hook: resume at start, save every N steps, after the last step, and at an early stop."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from hybridpar.checkpoint.load import load_checkpoint
from hybridpar.checkpoint.save import begin_save, finish_save


@dataclass(frozen=True)
class CheckpointConfig:
    save_dir: Optional[str] = None
    save_every: int = 0  # 0: only after the last step (when save_dir is set)
    resume: Optional[str] = None  # a save dir (its latest checkpoint) or one step-NNNNNN dir
    keep_last: int = 0  # 0: keep every checkpoint
    background: bool = False  # periodic saves written on a thread while training goes on


class Checkpointer:
    """``train(..., hooks=[Checkpointer(config, last_step, run)])``.

    With ``background``, a periodic save copies the state to host memory at its step and writes
    the files on a thread; it is committed (manifest, rename, ``latest``) after the first step
    whose all-reduce shows every rank's file written (``save_written``), or before the next save,
    an early stop or the last step's save, whichever comes first: at most one save in flight.
    The last step's save and a stop's save are written before the run goes on."""

    def __init__(self, config: CheckpointConfig, last_step: int, run=None, print_fn=print, stop=None):
        self.config, self.last_step, self.run, self.print_fn = config, last_step, run, print_fn
        self.stop = stop  # stopping.StopConditions: learns how long a save keeps training waiting (--exit-after)
        self.saved: list[str] = []
        self.saved_step: int | None = None
        self.resumed_step: int | None = None
        self.pending = None  # save.PendingSave in flight

    def on_start(self, job, first_step: int) -> int:
        if not self.config.resume:
            return first_step
        self.resumed_step = load_checkpoint(job, self.config.resume, print_fn=self.print_fn)
        return self.resumed_step + 1

    def due(self, step: int) -> bool:
        every = self.config.save_every
        return bool(self.config.save_dir) and (step == self.last_step or (every > 0 and step % every == 0))

    def save_written(self) -> bool | None:
        """This rank's vote in the step's all-reduce: None when no save is in flight."""
        return None if self.pending is None else self.pending.written()

    def on_step(self, job, metrics) -> None:
        if self.pending is not None and metrics.saves_written:
            self._commit(job)
        if self.due(metrics.step):
            self.save(job, metrics.step, background=self.config.background and metrics.step != self.last_step)

    def on_stop(self, job, metrics) -> None:
        """The run stops early after this step: save it, unless that was just done."""
        if self.pending is not None:
            self._commit(job)
        if self.config.save_dir and self.saved_step != metrics.step:
            self.save(job, metrics.step)

    def on_world_change(self, job) -> None:
        """A DP replica was lost or taken back in (reliability/replica_loss.py): a save still in
        flight had writers in the old world and can never be committed; its temporary directory
        is removed by the next save."""
        if self.pending is not None:
            if self.pending.thread is not None:
                self.pending.thread.join()
            self.pending = None
            self.saved_step = None

    def save(self, job, step: int, background: bool = False) -> str | None:
        """Save after ``step``; returns the checkpoint directory, or None while it is written in
        the background."""
        if self.pending is not None:
            self._commit(job)
        start = time.monotonic()
        self.pending = begin_save(job, self.config.save_dir, step, background=background)
        self.saved_step = step
        if background:
            self._observe(start)
            return None
        return self._commit(job, start)

    def flush(self, job) -> str | None:
        """Collective: wait for the save in flight, if any, and commit it."""
        return self._commit(job) if self.pending is not None else None

    def _commit(self, job, start: float | None = None) -> str:
        begun = time.monotonic()
        path = finish_save(job, self.pending, run=self.run, keep_last=self.config.keep_last)
        self._observe(start if start is not None else begun)
        self.pending = None
        self.saved.append(path)
        import torch.distributed as dist

        if dist.get_rank() == 0 and self.print_fn:
            self.print_fn(f"saved checkpoint {path}")
        return path

    def _observe(self, start: float) -> None:
        if self.stop is not None:
            self.stop.observe(save_s=time.monotonic() - start)


def run_checkpoint_hooks(run, print_fn=print, stop=None) -> list:
    """The hooks a RunPlan's checkpoint settings call for: the Hugging Face start of a fresh run,
    the checkpointer (resume, periodic and final saves); none when the run does neither."""
    c = run.checkpoint
    hooks = []
    if c.init_from_hf and not c.resume:  # a resumed run takes its weights from the checkpoint
        from hybridpar.checkpoint.hf_import import HFInit

        hooks.append(HFInit(c.init_from_hf, print_fn=print_fn))
    if c.save_dir or c.resume:
        config = CheckpointConfig(save_dir=c.save_dir, save_every=c.save_every, resume=c.resume, keep_last=c.keep_last,
                                  background=c.background)
        hooks.append(Checkpointer(config, last_step=run.steps, run=run, print_fn=print_fn, stop=stop))
    return hooks
