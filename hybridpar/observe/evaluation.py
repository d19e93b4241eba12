"""Loss on held-out data while training (recipe section ``eval``, ``--eval-every``).

``EvalHook`` is a ``train()`` hook (runtime/loop.py). After every ``every`` steps and after the
last step, before the step is logged, it runs ``Job.evaluate`` over global batches 1..``batches``
of the source's held-out rows: megatron's schedule in forward-only mode, every replica on its
rows, so the loss is the mean over the same held-out tokens at every evaluation and in every
layout. The value goes into the step's metrics.jsonl record (``eval_loss``, and ``eval_time_s``, which
``step_time_s`` leaves out), its line and TensorBoard. A step after which the ranks agreed to stop early is not evaluated: the save that a
signal asks for comes first.
"""
from __future__ import annotations

import time


class EvalHook:
    def __init__(self, every: int, batches: int, total_steps: int):
        self.every, self.batches, self.total = every, batches, total_steps
        self.source = None

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.total

    def on_start(self, job, first_step: int) -> int:
        self.source = job.source.held_out_source()
        if self.source is None:
            raise ValueError("eval.every needs a source with held-out rows (data.held_out)")
        return first_step

    def after_step(self, job, m) -> None:
        if self.due(m.step) and not m.stop:
            start = time.perf_counter()
            m.eval_loss = job.evaluate(self.source, self.batches)
            m.eval_time_s = time.perf_counter() - start
