"""Every use of torch's internals (torch.distributed, its elastic agent, a device helper).

Each is a function here, and ``RELIES_ON`` lists what they touch; tests/unit/test_compat.py checks
the installed torch for each. Nothing here imports torch before it is called: the node agent
loads torch under its own log settings first (hybridpar.launch.node_agent).
"""
from __future__ import annotations

from typing import Callable

from hybridpar.compat.declared import MEMBER, READ, Internal, Reliance

_AGENT = "torch.distributed.elastic.agent.server.local_elastic_agent:LocalElasticAgent"
_RENDEZVOUS = "torch.distributed.elastic.rendezvous.dynamic_rendezvous:DynamicRendezvousHandler"
_NODE_AGENT = "hybridpar.launch.node_agent names a lost head node in one line"

RELIES_ON = Reliance("torch", ("2.13.0", "2.14"), (
    Internal(_AGENT, "_monitor_workers", _NODE_AGENT, MEMBER, ("worker_group",)),
    Internal("torch.distributed.elastic.agent.server.api:SimpleElasticAgent", "_monitor_workers",
             _NODE_AGENT + " (the agent's run loop calls it)", READ),
    Internal(_AGENT, "run", _NODE_AGENT, MEMBER, ("role",)),
    Internal(_RENDEZVOUS, "shutdown", _NODE_AGENT),
    Internal(_RENDEZVOUS, "_stop_heartbeats", _NODE_AGENT),
    Internal("torch.distributed.elastic.rendezvous.utils", "parse_rendezvous_endpoint", _NODE_AGENT, MEMBER,
             ("endpoint", "default_port")),
    Internal("torch.distributed.run", "parse_args", _NODE_AGENT + " (it is torchrun)"),
    Internal("torch.distributed.run", "run", _NODE_AGENT + " (it is torchrun)", MEMBER, ("args",)),
    Internal("torch.distributed:ProcessGroup", "_get_backend",
             "hybridpar.runtime.mesh gives megatron's groups the world's timeout"),
    Internal("torch._C._distributed_c10d:Backend.Options", "_timeout",
             "hybridpar.runtime.mesh gives megatron's groups the world's timeout"),
    Internal("torch.testing._internal.distributed.fake_pg", "FakeStore",
             "hybridpar.observe.memory_audit joins a fake world (importing it registers the fake backend)"),
    Internal("torch.distributed.distributed_c10d:P2POp", "isend",
             "hybridpar.observe.comm_trace records point-to-point calls (P2POp checks its op against c10d's own)",
             READ),
    Internal("torch.distributed.distributed_c10d", "_abort_process_group",
             "hybridpar.reliability.replica_loss leaves a world with a dead member (NCCL's abort)"),
    Internal("torch.distributed.distributed_c10d", "_set_pg_timeout",
             "hybridpar.reliability.replica_loss: a left world's later gloo operations fail fast; a new world's "
             "rendezvous waits longer than its operations"),
    Internal("torch.distributed.distributed_c10d", "_world",
             "hybridpar.reliability.replica_loss lists a left world's groups (its pg_map); test workers free "
             "a finished job's groups", READ),
    Internal("torch.utils._device", "_device_constructors",
             "hybridpar.compat.cpu sends tensors created without a device to meta in strict device mode"),
    Internal("torch.utils._python_dispatch", "TorchDispatchMode",
             "hybridpar.observe.kernel_count counts the operations a layer runs", READ),
    Internal("torch.utils._pytree", "tree_flatten",
             "hybridpar.observe.step_bytes finds the tensors in an operation's nested arguments", READ),
))


# --- devices and process groups --------------------------------------------------------------
def dispatch_mode_base() -> type:
    """torch's base class for a mode that sees every aten operation as it is dispatched."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def tensor_leaves(value) -> list:
    """The tensors anywhere inside ``value`` (nested lists, tuples and dicts of an operation's arguments)."""
    import torch
    from torch.utils._pytree import tree_flatten

    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def device_constructors() -> frozenset:
    """The torch functions that create a tensor on the default device."""
    from torch.utils._device import _device_constructors

    return frozenset(_device_constructors())


def set_world_timeout(seconds: float) -> None:
    """The world group's timeout for the operations posted from now on (its rendezvous may have
    waited longer)."""
    from datetime import timedelta

    import torch.distributed.distributed_c10d as c10d

    c10d._set_pg_timeout(timedelta(seconds=seconds))


def world_timeout_minutes() -> float | None:
    """The world group's timeout (``hybridpar train --timeout-s``); None where torch does not say."""
    import torch
    import torch.distributed as dist

    try:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return dist.group.WORLD._get_backend(device).options._timeout.total_seconds() / 60
    except Exception:  # noqa: BLE001 - a private API: without it the groups keep megatron's default
        return None


def fake_store():
    """A store for torch's fake backend (a process group whose collectives move no data), which
    only torch's private test utilities register."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


def replace_distributed_function(name: str, fn) -> None:
    """``torch.distributed.<name> = fn``, in ``distributed_c10d`` too, whose ``P2POp`` checks its op
    against its own ``isend``/``irecv``."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    setattr(dist, name, fn)
    setattr(c10d, name, fn)


# --- the elastic agent ------------------------------------------------------------------------
def rendezvous_endpoint(endpoint: str, default_port: int) -> tuple[str, int]:
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    return parse_rendezvous_endpoint(endpoint, default_port=default_port)


def watch_elastic_agent(after_check: Callable[[bool], BaseException | None],
                        on_store_failure: Callable[[BaseException], BaseException | None],
                        can_close_rendezvous: Callable[[], bool]) -> None:
    """Hook torch's local elastic agent (torchrun's), for every agent of this process:
    - ``after_check(failed)`` after each check of the local ranks, with whether they failed (or
      are unhealthy); an exception it returns ends the agent, whose ``run()`` stops the ranks;
    - ``on_store_failure(err)`` when ``run()`` failed on the rendezvous store (after stopping the
      ranks); an exception it returns is raised in ``err``'s place;
    - ``can_close_rendezvous()`` before the rendezvous shuts down; False: only its heartbeats
      stop (closing it needs the store)."""
    import torch.distributed as dist
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.rendezvous import RendezvousConnectionError
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    monitor, run = LocalElasticAgent._monitor_workers, LocalElasticAgent.run
    shutdown = DynamicRendezvousHandler.shutdown

    def _monitor_workers(self, worker_group):
        result = monitor(self, worker_group)
        replacement = after_check(result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY))
        if replacement is not None:
            raise replacement
        return result

    def _run(self, *args, **kwargs):  # its finally stops the ranks before this sees the error
        try:
            return run(self, *args, **kwargs)
        except (RendezvousConnectionError, dist.DistNetworkError, dist.DistStoreError) as err:
            replacement = on_store_failure(err)
            if replacement is None:
                raise
            raise replacement from err

    def _shutdown(self):
        if can_close_rendezvous():
            return shutdown(self)
        self._stop_heartbeats()
        return False

    LocalElasticAgent._monitor_workers = _monitor_workers
    LocalElasticAgent.run = _run
    DynamicRendezvousHandler.shutdown = _shutdown


# --- leaving a world with a dead member ------------------------------------------------------
def process_groups() -> set:
    """Every process group this process holds now, the world's included."""
    import torch.distributed.distributed_c10d as c10d

    return set(c10d._world.pg_map)


def connected_tcp_sockets() -> set[int]:
    """The file descriptors of this process's connected TCP sockets (listening ones left out)."""
    import os
    import socket

    found = set()
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            with socket.socket(fileno=os.dup(fd)) as s:
                if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM \
                        and not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    s.getpeername()
                    found.add(fd)
        except OSError:  # closed meanwhile, not a socket, or not connected
            continue
    return found


LEFT_WORLD_TIMEOUT_S = 1


def abort_world(world_sockets: set[int]) -> None:
    """End every collective of this process's process groups in an error, from any thread.

    NCCL's communicators abort (``_abort_process_group``). ProcessGroupGloo's ``abort`` does not
    end an operation already waiting on a peer, and stops the group's worker threads, so an
    operation the training thread posts afterwards is never run and waits forever; its TCP pairs
    stay open until the group is freed. So gloo's groups are not aborted: the connections the
    world opened (``world_sockets``, measured against the sockets that existed before it) are
    shut down, which ends every wait on them, here and, by the closed connection, on every peer,
    and makes every later operation fail at once. The listening sockets stay: gloo's listener
    thread treats their loss as fatal."""
    import os
    import socket
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if dist.is_initialized() and dist.get_backend() == "gloo":
        # An operation posted from now on, on a pair that is still being torn down, could wait for
        # the full process-group timeout (seen under load): give it one second.
        for group in process_groups():
            try:
                c10d._set_pg_timeout(timedelta(seconds=LEFT_WORLD_TIMEOUT_S), group)
            except Exception:  # noqa: BLE001 - a group torch already dropped
                continue
    for fd in world_sockets & connected_tcp_sockets():
        try:
            with socket.socket(fileno=os.dup(fd)) as s:
                s.shutdown(socket.SHUT_RDWR)
        except OSError:
            continue
    if dist.is_initialized() and torch.cuda.is_available() and dist.get_backend() == "nccl":
        try:
            c10d._abort_process_group()
        except Exception:  # noqa: BLE001 - a group torch already dropped: nothing left to abort
            pass
