"""Starting ranks: locally with torch's elastic launcher (forked ones on CPU), or as one rank under a launcher.

- ``under_launcher()``: RANK and WORLD_SIZE are set (torchrun, SLURM wrappers, ...): this
  process is one rank of a job someone else started.
- ``launch_local(nproc, argv)``: start ``nproc`` ranks on this machine with torch's elastic
  agent (what ``torchrun --standalone --nproc-per-node N`` does), each running
  ``python -m hybridpar <argv>``; on CPU forked from this process instead (forked.py); returns
  the job's exit code.
- ``init_distributed()``: the world process group (NCCL on GPU, gloo on CPU); a world of one
  without a launcher gets a private local rendezvous. On GPU it first sets ``GPU_ENV``.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import uuid
from datetime import timedelta

from hybridpar.launch.launcher_death import LAUNCHER_PID


# megatron-core issues the backward TP collectives of its column-parallel linears async and
# relies on one hardware queue per device so that a collective queued before a GEMM starts
# before it and overlaps it (tensor_parallel/layers.py; the planner's cost model assumes this
# overlap). Read when the CUDA context is created, so it is set before any device is touched
# (init_distributed) and exported by the generated launch scripts (launch/scripts.py).
GPU_ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def under_launcher() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launcher_world_size() -> int | None:
    return int(os.environ["WORLD_SIZE"]) if under_launcher() else None


def launcher_env_problem() -> str | None:
    """What is wrong with a launcher's environment (RANK and WORLD_SIZE set) for torch's env://
    rendezvous, named before torch reads it (its own errors are tracebacks); None when it is whole."""
    env = os.environ
    numbers = {}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        if key in env:
            try:
                numbers[key] = int(env[key])
            except ValueError:
                return f"{key}={env[key]!r} is not an integer"
    if numbers["WORLD_SIZE"] < 1 or not 0 <= numbers["RANK"] < numbers["WORLD_SIZE"]:
        return f"RANK={numbers['RANK']} is not a rank of WORLD_SIZE={numbers['WORLD_SIZE']}"
    missing = [key for key in ("MASTER_ADDR", "MASTER_PORT") if not env.get(key)]
    if missing:
        return f"{' and '.join(missing)} not set"
    if not 1 <= numbers["MASTER_PORT"] <= 65535:
        return f"MASTER_PORT={numbers['MASTER_PORT']} is not a port"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(timeout_s: int = 600) -> None:
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if not under_launcher():
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    from hybridpar.compat.cpu import enter_strict_device_mode, import_libraries_uncompiled, name_deepspeed_accelerator

    enter_strict_device_mode()
    name_deepspeed_accelerator()
    import_libraries_uncompiled()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        for key, value in GPU_ENV.items():
            os.environ.setdefault(key, value)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    from hybridpar.reliability.replica_loss import tolerant, world

    if tolerant():  # ranks of launch/tolerant.py: the world is the launcher's current generation
        world(timeout_s).join(backend)
        return
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))


def exit_rank(code: int) -> None:
    """A rank started by ``hybridpar train --nproc`` leaves here once its run is over (checkpoints
    written, process groups shut down, its monitor closed), without the interpreter's teardown:
    freeing torch, megatron-core and DeepSpeed costs about a second of CPU per rank for nothing,
    and after a tolerant job lost or took in a replica the aborted process groups of the old world
    cannot be freed cleanly (gloo's threads may still hold a dead connection), so freeing them at
    exit could abort a rank after a good run."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def shutdown(barrier: bool = True) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()


# Signals the launcher passes on to its ranks (which stop after their step and save, stopping.py)
# instead of dying of them; SIGUSR1 is what a job script asks SLURM for ahead of a time limit.
FORWARDED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


def launch_local(nproc: int, argv: list[str], stop_grace_s: int = 600) -> int:
    """Run ``python -m hybridpar <argv>`` on ``nproc`` local ranks; 0 when every rank succeeded.
    A signal to this process goes to the ranks, which get ``stop_grace_s`` to finish their step
    and save before they are killed; then the code is 128 + the signal's number. On CPU the
    ranks are forked from this process once it has imported the libraries, where it can (forked.py).
    The launching process must have OMP_NUM_THREADS set (to 1) before it imports torch for that."""
    from hybridpar.launch.forked import can_fork, launch_forked

    if can_fork():
        return launch_forked(nproc, lambda: _cli_main(argv), stop_grace_s)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        run_id=str(uuid.uuid4()),
        max_restarts=0,
        monitor_interval=0.5,
        signals_to_handle=FORWARDED_SIGNALS,
        shutdown_timeout=stop_grace_s,
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ[LAUNCHER_PID] = str(os.getpid())  # the agent runs in this process (launcher_death.py)
    try:
        elastic_launch(config, sys.executable)("-m", "hybridpar", *argv)
    except SignalException as err:
        return 128 + int(err.sigval)
    except ChildFailedError as err:
        print(failure_summary(err.failures, nproc), file=sys.stderr, flush=True)
        first = root_cause(err.failures)[1]
        return first.exitcode if isinstance(first.exitcode, int) and first.exitcode > 0 else 1
    finally:
        del os.environ[LAUNCHER_PID]
    return 0


def _cli_main(argv: list[str]) -> int:
    from hybridpar.cli.main import main

    return main(argv)


def root_cause(failures: dict) -> tuple:
    """(rank, failure) that most likely started it: a rank killed by a signal other than the
    agent's SIGTERM (the others then fail with lost-peer errors, exit code 1), else a rank that
    exited non-zero by itself, the earliest first, then the lowest rank."""
    def order(item):
        rank, f = item
        stopped = f.exitcode == -signal.SIGTERM  # the agent's own SIGTERM to the survivors
        return (stopped, f.exitcode >= 0, f.timestamp, rank)

    return min(failures.items(), key=order)


def failure_summary(failures: dict, nproc: int) -> str:
    """One line naming the failed rank: "rank 5 (pid 123) died: signal SIGKILL (...)"."""
    rank, first = root_cause(failures)
    if first.exitcode < 0:
        what = f"died: signal {first.signal_name()}"
    else:
        what = f"failed with exit code {first.exitcode}"
    others = len(failures) - 1
    tail = f"{others} other rank(s) failed after it, the rest were stopped" if others else "the other ranks were stopped"
    return f"hybridpar: rank {rank} (pid {first.pid}) {what} ({tail}; {nproc} ranks in all); see its output above"


def is_lost_peer(err: BaseException) -> bool:
    """A collective failed because a peer died or timed out: torch's DistError, or the plain
    RuntimeError that gloo's TCP transport raises ("Connection reset by peer", "Timed out")."""
    import torch.distributed as dist

    if isinstance(err, dist.DistError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("gloo" in text or "NCCL" in text) and (
        "onnection" in text or "imed out" in text or "peer" in text)


def lost_peer(err: BaseException) -> None:
    """A collective failed because a peer died or stopped answering: say so in one line and exit
    at once (the process group is unusable; a barrier in shutdown would only wait for the timeout)."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else os.environ.get("RANK", "?")
    text = (str(err).strip().splitlines() or [type(err).__name__])[-1]
    text = text.split("] ", 1)[-1] if text.startswith("[") else text  # gloo's "[file.cc:537] " prefix
    text = text.split(". This is typically", 1)[0]
    print(f"hybridpar train: rank {rank} (pid {os.getpid()}) lost contact with a peer, stopping: {text}",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)
