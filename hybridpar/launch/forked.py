"""Local ranks on CPU, forked from a launcher that imported torch, megatron-core and DeepSpeed once.

Each rank spends about 3 s of CPU importing those libraries; on a CPU machine the ranks of one
launch share a few cores, so an 8-rank launch of the tiny recipe on 2 cores spent half its wall
time importing (31 s, of which 15 s after this change). On CPU, ``hybridpar train --nproc N`` (and
the replica-loss-tolerant launcher) therefore import them here, once, and fork the ranks, which
share those pages copy-on-write. Each rank is then supervised as torch's elastic agent supervises
its subprocesses (``launch_forked``): the same environment variables, a session of its own, the
agent's signals passed on, the first failure stops the others (SIGTERM, then SIGKILL after
``FAILURE_GRACE_S``), one line names the rank that started it (``local.failure_summary``).

On GPU the ranks are spawned by torch's agent as before (``launch/local.py``): a CUDA context does
not survive a fork, and the imports are small beside a step. A forked rank uses nothing of the
launcher's but the modules it imported (it joins the launcher's store, if any, as a client), never
returns into the launcher's code and leaves with ``os._exit``, so nothing of the launcher's state is
torn down twice.

``python -m hybridpar.launch.forked --nproc N SCRIPT [ARGS]`` runs a script on N such ranks, as
``torchrun --standalone --nproc-per-node N`` would on CPU (the test suite's multi-rank workers).
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import os
import runpy
import signal
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Callable

from hybridpar.launch.launcher_death import LAUNCHER_PID, die_with
from hybridpar.launch.local import FORWARDED_SIGNALS, failure_summary, free_port, root_cause

# What every rank imports; the first three are most of a rank's start-up. torch imports
# torch._dynamo on the first optimizer a rank builds (``torch.optim.Optimizer.__init__``: 0.6 s of
# CPU per rank, 250 modules), and megatron-core its layer specs when the model is built.
RANK_MODULES = ("torch", "megatron.core", "deepspeed", "torch._dynamo", "megatron.core.models.gpt.gpt_layer_specs",
                "hybridpar.runtime.loop", "hybridpar.runtime.job", "hybridpar.runtime.attention",
                "hybridpar.reliability.replica_loss", "hybridpar.reliability.replicas", "hybridpar.observe.metrics",
                "hybridpar.checkpoint.save")
POLL_S = 0.1
FAILURE_GRACE_S = 30  # torch's agent's default: after a failure, the others get this long to stop
PR_SET_NAME = 15  # <linux/prctl.h>
FORWARDED = tuple(signal.Signals[name] for name in FORWARDED_SIGNALS.split(","))  # those torch's agent passes on


def preload() -> None:
    """Import what a rank imports, here, before the first fork (CPU only: see the module's text)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch's import: see can_fork
    from hybridpar.compat.cpu import import_libraries_uncompiled, name_deepspeed_accelerator

    name_deepspeed_accelerator()
    with warnings.catch_warnings():  # the ranks say what they have to say about missing extensions
        warnings.simplefilter("ignore")
        import_libraries_uncompiled()
        for module in RANK_MODULES:
            importlib.import_module(module)


class ForkedRank:
    """One rank: ``target()`` run in a child of this process. The subset of ``subprocess.Popen`` the
    launchers use (``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``returncode``)."""

    def __init__(self, target: Callable[[], int], env: dict, name: str, new_session: bool = True):
        launcher = os.getpid()
        _assert_one_thread()
        sys.stdout.flush()  # else the child flushes the launcher's pending output a second time
        sys.stderr.flush()
        # The launcher's ~300k objects (the imported libraries) move to the collector's permanent
        # generation: a rank's full collection then skips them (0.14 s of CPU each) and leaves their
        # shared pages unwritten (Python's gc docs: freeze right before fork).
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            _run_child(target, env, name, new_session, launcher)
        self.pid, self.returncode, self.ended = pid, None, None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode, self.ended = os.waitstatus_to_exitcode(status), time.time()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _threads() -> int:
    tasks = f"/proc/{os.getpid()}/task"
    return len(os.listdir(tasks)) if os.path.isdir(tasks) else 1


def _assert_one_thread() -> None:
    """A thread of the launcher's holding a lock when it forks leaves that lock held in the rank
    forever (a rank hung at start, seen with a TCP store's server thread): fork from one thread only."""
    if _threads() > 1:
        raise RuntimeError(f"hybridpar's CPU launcher would fork with {_threads()} threads running")


def can_fork() -> bool:
    """On CPU, import what the ranks need (``preload``), and whether this process may now fork them:
    on Linux, with no other thread running. torch imported with OMP_NUM_THREADS unset or above 1 starts OpenMP's
    workers, whose state a forked rank would inherit half-made; then the ranks are spawned instead."""
    if not hasattr(os, "fork") or not os.path.isdir("/proc/self/task"):
        return False
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch's import (on_cpu imports it)
    from hybridpar.compat.cpu import on_cpu

    if not on_cpu():
        return False
    preload()
    return _threads() == 1


def _run_child(target, env: dict, name: str, new_session: bool, launcher: int) -> None:
    code = 1
    try:
        if new_session:
            os.setsid()
        for sig in FORWARDED:  # a fresh interpreter's dispositions, not the launcher's handlers
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(env)
        die_with(launcher)
        _name_process(name)
        code = target()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, (int, type(None))):
            print(stop.code, file=sys.stderr)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 128 + signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)


def _name_process(name: str) -> None:
    """``ps``/``top`` show the rank (the command line is the launcher's: nothing was executed)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def rank_name(rank: int) -> str:
    return f"hybridpar r{rank}"


def rank_env(rank: int, nproc: int, port: int) -> dict:
    """What torch's agent gives a rank of a standalone launch (rank 0 hosts the store here)."""
    return dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                GROUP_RANK="0", ROLE_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                **{LAUNCHER_PID: str(os.getpid())})


@dataclass
class RankExit:
    """A rank that ended non-zero, as ``local.failure_summary`` reads torch's ProcessFailure."""
    pid: int
    exitcode: int
    timestamp: float

    def signal_name(self) -> str:
        return signal.Signals(-self.exitcode).name if self.exitcode < 0 else ""


def launch_forked(nproc: int, target: Callable[[], int], stop_grace_s: int = 600) -> int:
    """Run ``target()`` on ``nproc`` forked ranks; 0 when every rank succeeded. A signal to this
    process goes to the ranks, which get ``stop_grace_s`` to finish their step and save before they
    are killed; then the code is 128 + the signal's number. A rank that fails stops the others
    (SIGTERM) and one line names it; the code is its exit code (1 for a signal)."""
    preload()
    port = free_port()
    ranks = {rank: ForkedRank(target, rank_env(rank, nproc, port), rank_name(rank)) for rank in range(nproc)}
    signalled: list[int] = []

    def forward(signum, frame):
        signalled.append(signum)
        for proc in ranks.values():
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        while True:
            codes = {rank: proc.poll() for rank, proc in ranks.items()}
            if signalled:
                _stop(ranks.values(), None, stop_grace_s)
                return 128 + signalled[0]
            failures = {r: RankExit(ranks[r].pid, c, ranks[r].ended) for r, c in codes.items() if c}
            if failures:
                _stop(ranks.values(), signal.SIGTERM, FAILURE_GRACE_S)
                failures.update({r: RankExit(p.pid, p.returncode, p.ended) for r, p in ranks.items()
                                 if p.returncode and r not in failures})
                print(failure_summary(failures, nproc), file=sys.stderr, flush=True)
                first = root_cause(failures)[1]
                return first.exitcode if first.exitcode > 0 else 1
            if all(code == 0 for code in codes.values()):
                return 0
            time.sleep(POLL_S)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for proc in ranks.values():
            proc.kill()
            proc.wait()


def _stop(ranks, sig: int | None, grace_s: float) -> None:
    """Send ``sig`` (None: it was sent already) to the ranks still running; SIGKILL any left after ``grace_s``."""
    if sig is not None:
        for proc in ranks:
            proc.send_signal(sig)
    deadline = time.monotonic() + grace_s
    while any(proc.poll() is None for proc in ranks) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for proc in ranks:
        proc.kill()
        proc.wait()


def run_script(script: str, args: list[str]) -> int:
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as ``python SCRIPT`` has it
    runpy.run_path(script, run_name="__main__")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybridpar.launch.forked", description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, required=True, help="ranks to fork")
    parser.add_argument("script", help="the Python script each rank runs, as its __main__")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: see can_fork
    from hybridpar.compat.cpu import on_cpu

    if args.nproc < 1 or not os.path.isfile(args.script) or not on_cpu():
        print(f"{parser.prog}: error: needs --nproc >= 1, an existing script and a machine without CUDA "
              "(on GPUs use torchrun)", file=sys.stderr)
        return 2
    return launch_forked(args.nproc, lambda: run_script(args.script, args.args))


if __name__ == "__main__":
    sys.exit(main())
