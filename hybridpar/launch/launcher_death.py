"""Ranks die with their launcher, however it dies (SIGKILL, the OOM killer, a lost terminal).

torch's elastic agent (torchrun, node_agent.py, ``hybridpar train --nproc`` on GPU) starts each rank
in a session of its own (``start_new_session``), and so does the CPU launcher that forks its ranks
(forked.py), so nothing that kills the agent abruptly reaches the ranks: they would train on,
unsupervised, until killed by hand. A rank one of them started (torch's sets TORCHELASTIC_RUN_ID,
forked.py calls ``die_with`` itself) therefore asks the kernel for SIGKILL when its parent, the
agent, exits (Linux ``prctl(PR_SET_PDEATHSIG)``); elsewhere, or under a wrapper between agent and
rank, a thread polls the agent's pid.

SIGKILL, not a signal to catch: the agent also hosts the ranks' TCP store, so a graceful stop
could wait on a dead store or on a peer that died first; checkpoints are written
temp-then-rename, so a rank killed during a save leaves the previous checkpoint loadable.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

LAUNCHER_PID = "HYBRIDPAR_LAUNCHER_PID"  # the agent's pid, set by the agents hybridpar runs
# Set (to its store's address) by launch/tolerant.py's launcher, the one agent that is not torch's
TOLERANT_STORE = "HYBRIDPAR_TOLERANT_STORE"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_launcher() -> None:
    if "TORCHELASTIC_RUN_ID" not in os.environ and TOLERANT_STORE not in os.environ:
        return  # not started by an agent of torch's or hybridpar's: SLURM's srun or a user's shell supervises it
    # Without LAUNCHER_PID (plain torchrun) the parent now is taken as the agent.
    die_with(int(os.environ.get(LAUNCHER_PID) or os.getppid()))


def die_with(launcher: int) -> None:
    """SIGKILL this process when ``launcher`` exits (launch/forked.py's ranks call it directly)."""
    if os.getppid() == launcher and sys.platform.startswith("linux") and _parent_death_signal(signal.SIGKILL):
        if os.getppid() != launcher:  # the agent died before the kernel was asked to tell
            os.kill(os.getpid(), signal.SIGKILL)
        return
    # Off Linux, or a wrapper (a shell) between the agent and this rank: watch the agent's pid.
    if not _alive(launcher):
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=_watch, args=(launcher,), name="hybridpar-launcher-watch", daemon=True).start()


def _parent_death_signal(sig: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _watch(launcher: int) -> None:
    while _alive(launcher):
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)
