"""Stopping a run early and cleanly: on a signal, at a chosen step, or before a time limit.

Each rank keeps its own reason to stop (``StopConditions.local_code``): a signal it received
(SIGTERM from SLURM at a time limit or on preemption, from Kubernetes on eviction; SIGUSR1 that a
job script asked for ahead of the limit; SIGINT from Ctrl-C), ``--stop-at-step N``, or
``--exit-after MINUTES`` when the next step and a save would no longer fit. The ranks agree on one
code per step through the step's own loss all-reduce (``Job.train_step``: the maximum over the
world), so every rank stops after the same step, saves it, and exits with the same code:

  0    every step trained
  4    stopped early on request (--stop-at-step, --exit-after); resume with --resume auto
  128+N  stopped by signal N after finishing its step (143 SIGTERM, 130 SIGINT, 138 SIGUSR1)

Signals only set a flag: the step in flight finishes, nothing is interrupted mid-collective.
"""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
AT_STEP, TIME_LIMIT = 1000, 1001  # agreed codes of the two requested stops (above any signal number)
# When ranks disagree (one got a signal, another hit the time limit), the first of these wins.
STOP_REASONS = (int(signal.SIGTERM), int(signal.SIGUSR1), int(signal.SIGINT), TIME_LIMIT, AT_STEP)
EXIT_STOPPED_ON_REQUEST = 4


@dataclass(frozen=True)
class StopReason:
    code: int  # a signal number, AT_STEP or TIME_LIMIT
    step: int

    @property
    def exit_code(self) -> int:
        return EXIT_STOPPED_ON_REQUEST if self.code in (AT_STEP, TIME_LIMIT) else 128 + self.code

    def describe(self) -> str:
        if self.code == AT_STEP:
            return "--stop-at-step"
        if self.code == TIME_LIMIT:
            return "--exit-after"
        return signal.Signals(self.code).name


class StopConditions:
    def __init__(self, stop_at_step: int | None = None, exit_after_s: float | None = None, clock=time.monotonic):
        self.stop_at_step, self.exit_after_s, self.clock = stop_at_step, exit_after_s, clock
        self.started = clock()
        self.signal: int | None = None
        self.longest_step_s = 0.0
        self.longest_save_s = 0.0

    def install(self) -> None:
        """Catch the stop signals in this (main) thread: they only set a flag."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        if self.signal is None:
            self.signal = signum

    def observe(self, step_s: float = 0.0, save_s: float = 0.0) -> None:
        self.longest_step_s = max(self.longest_step_s, step_s)
        self.longest_save_s = max(self.longest_save_s, save_s)

    def local_code(self, step: int) -> int:
        """This rank's reason to stop after ``step`` (0: none); called as the step ends."""
        if self.signal is not None:
            return int(self.signal)
        if self.stop_at_step is not None and step >= self.stop_at_step:
            return AT_STEP
        if self.exit_after_s is not None:
            # The next step and its save must end before the limit: stop now if they might not.
            needed = self.longest_step_s + self.longest_save_s
            if self.clock() - self.started + needed >= self.exit_after_s:
                return TIME_LIMIT
        return 0
