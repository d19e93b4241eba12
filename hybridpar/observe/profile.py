"""``--profile-steps A-B``: a torch.profiler trace of steps A to B on the chosen ranks.

``ProfileHook`` is a ``train()`` hook (runtime/loop.py). On the profiled ranks it starts
``torch.profiler`` as step A begins (CPU activity, and CUDA where the rank has a GPU), marks every
step as a ``step N`` range, and after step B (or at an earlier stop) writes the Chrome/Perfetto
trace to ``OUT/profile/rank-RRRRR-steps-A-B.json``: written under a temporary name, then renamed.
Open it in chrome://tracing or https://ui.perfetto.dev. Rank 0 says where the traces are. Megatron-LM's
``--profile --profile-step-start --profile-step-end --profile-ranks`` and torchtitan's
``profiling.enable_profiling`` do the same; here the ranks default to 0 alone (one file, not one
per GPU of the job) and ``--profile-ranks all`` takes every rank.
"""
from __future__ import annotations

import glob
import os

from hybridpar.config.run import ProfileSettings

PROFILE_DIR = "profile"


def trace_path(out: str, rank: int, first: int, last: int) -> str:
    return os.path.join(out, PROFILE_DIR, f"rank-{rank:05d}-steps-{first}-{last}.json")


def traces_in(out: str) -> list[str]:
    """The traces a run wrote into ``out`` (what --overwrite removes with the rest of a run)."""
    return sorted(glob.glob(os.path.join(out, PROFILE_DIR, "rank-*-steps-*.json")))


class ProfileHook:
    def __init__(self, out: str, settings: ProfileSettings, print_fn=print):
        self.out, self.settings, self.print_fn = out, settings, print_fn
        self.profiler = self.step_range = None
        self.written = False

    def _rank(self) -> int:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_initialized() else 0

    def on_step_begin(self, job, step: int) -> None:
        s = self.settings
        if not s.covers(self._rank()) or not s.first_step <= step <= s.last_step:
            return
        import torch

        if self.profiler is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.__enter__()
        self.step_range = torch.profiler.record_function(f"step {step}")
        self.step_range.__enter__()

    def on_step(self, job, m) -> None:
        self._end_step()
        if m.step == self.settings.last_step:
            self._write(m.step)

    def on_stop(self, job, m) -> None:
        self._end_step()
        self._write(m.step)

    def _end_step(self) -> None:
        if self.step_range is not None:
            self.step_range.__exit__(None, None, None)
            self.step_range = None

    def _write(self, last: int) -> None:
        if self.written:
            return
        self.written = True
        rank = self._rank()
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            path = trace_path(self.out, rank, self.settings.first_step, last)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.tmp-{os.getpid()}"
            self.profiler.export_chrome_trace(tmp)
            os.replace(tmp, path)
            self.profiler = None
        if rank == 0 and self.settings.first_step <= last:
            who = "every rank" if not self.settings.ranks else "rank " + ",".join(map(str, self.settings.ranks))
            self.print_fn(f"profile of steps {self.settings.first_step}-{last} on {who}: "
                          f"{os.path.join(self.out, PROFILE_DIR, f'rank-*-steps-{self.settings.first_step}-{last}.json')} "
                          f"(chrome://tracing or ui.perfetto.dev)")
