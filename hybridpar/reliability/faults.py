"""Fault injection for the reliability tests and the soak benchmark: real signals, real bit flips.

Test-only: nothing happens unless the environment variable ``HYBRIDPAR_FAULT`` is set, and then
only through the ``train()`` hooks returned by ``hooks_from_env()`` (no branch anywhere else).
The variable holds faults separated by ``;``, each ``KIND:key=value:key=value``:

- ``kill-in-step:rank=R:step=K[:micro=M][:signal=SIGSTOP]``: global rank R sends itself SIGKILL
  (or the named signal: SIGSTOP makes a hung rank) during step K, right after the forward pass
  of its M-th micro-batch (default 1) on its first model chunk;
- ``stall-in-step:rank=R:step=K:seconds=S[:micro=M]``: rank R sleeps S seconds where
  ``kill-in-step`` would die, as a rank held by its host would, then goes on (once);
- ``kill-after-step:rank=R:step=K``: rank R sends itself SIGKILL once step K is over (its
  metrics logged, the hooks before this one run: with ``--tolerate-replica-loss`` the in-memory
  state of step K is kept), before step K+1 begins;
- ``hold-for-rejoin:rank=R:step=K``: with ``--tolerate-replica-loss``, a restarted replica joins
  after step K exactly, whatever its start-up takes: no rank takes one in before, and after step
  K every rank waits until one is ready (at most 10 minutes; every rank reads the same fault, so
  they agree without a collective; R only names the rank that says so);
- ``kill-in-save:rank=R:step=K``: rank R sends itself SIGKILL while the checkpoint of step K is
  being written, right after its own shard file is written and fsync'd (other ranks may still
  be writing theirs: the save is never committed);
- ``fail-in-save:rank=R:step=K``: rank R's write of its checkpoint file for step K fails with an
  OSError ("injected: no space left on device"), as a full disk would;
- ``nan-in-step:rank=R:step=K[:micro=M]``: rank R's first model chunk puts out NaN in place of its
  output for micro-batch M (default 1) of step K, as an overflow would: the NaN flows through the
  pipeline and the TP collectives into the loss and the gradients (reliability/nonfinite.py);
- ``flip:rank=R:step=K[:tensor=NAME][:byte=B][:bit=b]``: after step K, rank R flips one bit of
  one parameter in place (default: the first parameter, byte 0, bit 0), as silent data
  corruption would. Put the hook before the replica check so that step K's check sees it.

Under ``--tolerate-replica-loss`` rank R means the process that started as rank R (its member id):
the ranks of a smaller world are numbered anew, the processes are not.

Every fault prints one line to stderr on the rank it fires on, so a run's log says what was done.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field

from hybridpar.errors import UsageError

ENV = "HYBRIDPAR_FAULT"
KINDS = ("kill-in-step", "stall-in-step", "kill-after-step", "hold-for-rejoin", "kill-in-save", "fail-in-save",
         "nan-in-step", "flip")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int
    options: dict = field(default_factory=dict)

    def int_option(self, key: str, default: int) -> int:
        return int(self.options.get(key, default))


def parse(text: str) -> list[Fault]:
    faults = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        kind, *pairs = item.split(":")
        if kind not in KINDS:
            raise UsageError(f"{ENV}: unknown fault {kind!r}; known: {', '.join(KINDS)}")
        values = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep:
                raise UsageError(f"{ENV}: expected key=value in {item!r}, got {pair!r}")
            values[key] = value
        try:
            rank, step = int(values.pop("rank")), int(values.pop("step"))
        except (KeyError, ValueError):
            raise UsageError(f"{ENV}: {item!r} needs integer rank= and step=") from None
        if kind == "stall-in-step":
            try:
                float(values["seconds"])
            except (KeyError, ValueError):
                raise UsageError(f"{ENV}: {item!r} needs seconds=S (how long the rank sleeps)") from None
        faults.append(Fault(kind, rank, step, values))
    return faults


def _announce(what: str) -> None:
    print(f"hybridpar fault injection: rank {_rank()}: {what} (at unix time {time.time():.3f})", file=sys.stderr, flush=True)


def _rank() -> int:
    """The rank the fault names: the global rank, or the member id of a rank that tolerates
    replica loss (the rank it started as)."""
    import torch.distributed as dist

    from hybridpar.launch.tolerant import MEMBER_ENV

    return int(os.environ[MEMBER_ENV]) if MEMBER_ENV in os.environ else dist.get_rank()


def _die(what: str, sig: str = "SIGKILL") -> None:
    _announce(f"{what}: {sig} to pid {os.getpid()}")
    os.kill(os.getpid(), getattr(signal, sig))


class KillInStep:
    """Dies after the forward of micro-batch M of step K (a forward hook on the first chunk)."""

    def __init__(self, fault: Fault):
        self.fault, self.step, self.forwards = fault, None, 0

    def on_start(self, job, first_step):
        if _rank() == self.fault.rank:
            job.chunks[0].register_forward_hook(self._after_forward)
        return first_step

    def on_world_change(self, job):  # the job was rebuilt: its model too
        self.on_start(job, 0)

    def on_step_begin(self, job, step):
        self.step, self.forwards = step, 0

    def _after_forward(self, module, inputs, output):
        self.forwards += 1
        micro = self.fault.int_option("micro", 1)
        if self.step == self.fault.step and self.forwards == micro:
            self._act(f"step {self.step}, after the forward of micro-batch {micro}")

    def _act(self, where: str) -> None:
        _die(where, self.fault.options.get("signal", "SIGKILL"))


class StallInStep(KillInStep):
    """Sleeps S seconds after the forward of micro-batch M of step K, then goes on; once (a world
    rebuilt after a loss runs step K again)."""

    fired = False

    def _act(self, where: str) -> None:
        if self.fired:
            return
        self.fired = True
        seconds = float(self.fault.options["seconds"])
        _announce(f"{where}: sleeping {seconds:g} s")
        time.sleep(seconds)


class NanInStep(KillInStep):
    """Turns the first chunk's output for micro-batch M of step K into NaN (once)."""

    def _after_forward(self, module, inputs, output):
        self.forwards += 1
        micro = self.fault.int_option("micro", 1)
        if self.step == self.fault.step and self.forwards == micro:
            _announce(f"step {self.step}, micro-batch {micro}: NaN in place of the first chunk's output")
            return output * float("nan")
        return None


class KillAfterStep:
    """Dies once step K is over, before step K+1 begins."""

    def __init__(self, fault: Fault):
        self.fault = fault

    def on_step(self, job, metrics):
        if metrics.step == self.fault.step and _rank() == self.fault.rank:
            _die(f"after step {metrics.step}")


class HoldForRejoin:
    """A restarted replica joins after step K: none before, and every rank waits for one after K."""

    def __init__(self, fault: Fault):
        self.fault = fault

    def defers_join(self, step: int) -> bool:
        return step < self.fault.step

    def on_step(self, job, metrics):
        if metrics.step != self.fault.step:
            return
        from hybridpar.reliability.replica_loss import world

        if _rank() == self.fault.rank:
            _announce(f"after step {metrics.step}: every rank holds until a restarted replica is ready to join")
        deadline = time.monotonic() + 600
        while not world().someone_waits() and time.monotonic() < deadline:
            time.sleep(0.05)


class KillInSave:
    """Dies right after writing its own shard of the checkpoint of step K."""

    def __init__(self, fault: Fault):
        self.fault, self.step = fault, None

    def on_start(self, job, first_step):
        if _rank() == self.fault.rank:
            from hybridpar.checkpoint import save

            original = save.write_tensors

            def write_then_die(path, obj):
                record = original(path, obj)
                if obj.get("header", {}).get("step") == self.fault.step:
                    _die(f"checkpoint of step {self.fault.step}, after writing {path}")
                return record

            save.write_tensors = write_then_die
        return first_step


class FailInSave:
    """Its write of the checkpoint file of step K fails (a full disk)."""

    def __init__(self, fault: Fault):
        self.fault = fault

    def on_start(self, job, first_step):
        if _rank() == self.fault.rank:
            from hybridpar.checkpoint import save

            original = save.write_tensors

            def fail(path, obj):
                if obj.get("header", {}).get("step") == self.fault.step:
                    _announce(f"checkpoint of step {self.fault.step}: failing the write of {path}")
                    raise OSError(28, "injected: no space left on device")
                return original(path, obj)

            save.write_tensors = fail
        return first_step


class FlipBit:
    """Flips one bit of one parameter after step K (silent corruption of one replica)."""

    def __init__(self, fault: Fault):
        self.fault = fault

    def on_step(self, job, metrics):
        if metrics.step != self.fault.step or _rank() != self.fault.rank:
            return
        import torch

        from hybridpar.runtime.model import canonical_params

        wanted = self.fault.options.get("tensor")
        params = dict(canonical_params(job.chunks))
        name = wanted or next(iter(params))
        if name not in params:
            raise UsageError(f"{ENV}: rank {_rank()} holds no parameter {name!r}")
        byte, bit = self.fault.int_option("byte", 0), self.fault.int_option("bit", 0)
        with torch.no_grad():
            params[name].data.view(-1).view(torch.uint8)[byte] ^= 1 << bit
        _announce(f"flipped bit {bit} of byte {byte} of {name} after step {metrics.step}")


_HOOKS = {"kill-in-step": KillInStep, "stall-in-step": StallInStep, "kill-after-step": KillAfterStep, "hold-for-rejoin": HoldForRejoin, "kill-in-save": KillInSave, "fail-in-save": FailInSave, "nan-in-step": NanInStep, "flip": FlipBit}


def hooks_from_env(environ=os.environ) -> list:
    """The fault hooks that ``HYBRIDPAR_FAULT`` asks for (none when it is unset)."""
    return [_HOOKS[f.kind](f) for f in parse(environ.get(ENV, ""))]
