"""``python -m hybridpar.launch.node_agent <torchrun arguments>``: one node's agent in a multi-node job.

The launch scripts ((launch/scripts.py)) run this instead of ``torchrun``. It is torchrun: torch's
own entry (``torch.distributed.run``: ``parse_args`` + ``run`` under ``@record``), the same
arguments, the same output and exit codes, with one exception. With the c10d rendezvous the
head node's agent hosts the TCP store every agent talks to; when the head node dies (or the
network to it goes), torchrun on the other nodes ends with a long traceback
(``RendezvousConnectionError``), or, when its ranks noticed first (their gloo/NCCL peers on the
head node are gone too), with the ``ChildFailedError`` report of ranks that merely lost a peer.
Here, once the store's address no longer accepts a connection, the node's ranks are stopped as
torchrun stops them and the agent prints one line instead and exits 1::

    hybridpar: lost the rendezvous store at 10.0.0.1:29500 on the head node: ...

The store is checked (a TCP connect, ``PROBE_TIMEOUT_S``) only when torch's agent already failed
on it or found its ranks failed, so a job whose head node is alive behaves exactly as under
torchrun. An agent that never reached the store (wrong HEAD_NODE, head node not started within
the rendezvous read timeout) gets one line too. Unlike torchrun, the agent's own C++ warnings
(c10 logging, mostly the store client's) are off unless TORCH_CPP_LOG_LEVEL is set; the ranks'
are not touched.

Why this replaces methods of torch's agent (``compat.torch.watch_elastic_agent``: ``run`` and
``_monitor_workers`` of LocalElasticAgent, ``shutdown`` of the rendezvous handler) rather than
wrapping torchrun's public ``run`` and probing the store after it fails: by the time ``run``
raises, torch's launcher has already closed the rendezvous through the dead store (its
``finally``; against a host that is gone rather than refusing connections, each store call
waits out its timeout), logged its own errors about the store, and lost what says whether ranks
were ever started (the difference between "lost the head node" and "never reached it"). One
clear line for the one failure every multi-node user meets is worth three hooks, given that
they act only after torch's agent has failed (a job whose head node lives runs exactly as under
torchrun) and that tests/unit/test_compat.py names any torch that changes what they rely on.
"""
from __future__ import annotations

import logging
import os
import socket
import sys

from hybridpar.launch.launcher_death import LAUNCHER_PID

PROBE_TIMEOUT_S = 3.0
EXIT_CODE = 1


class HeadNodeLost(Exception):
    """The rendezvous store stopped answering: the head node is gone or unreachable."""


class _Watch:
    """What this agent knows about the store: where it is and whether ranks were started."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.started = False
        self.gone = False

    def answers(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=PROBE_TIMEOUT_S):
                return True
        except OSError:
            return False

    def lost(self) -> HeadNodeLost:
        self.gone = True
        logging.disable(logging.ERROR)  # torch's own warnings about the dead store, from here on
        return HeadNodeLost(
            f"hybridpar: lost the rendezvous store at {self.host}:{self.port} on the head node: the head node "
            "is gone or unreachable, so this node's ranks were stopped; restart the job on all nodes "
            "(from its last checkpoint: hybridpar train --resume SAVE_DIR)")

    def unreachable(self) -> HeadNodeLost:
        return HeadNodeLost(
            f"hybridpar: cannot reach the rendezvous store at {self.host}:{self.port}: nothing answers there; "
            "set HEAD_NODE to the address of a node that runs this command too (the head node hosts the "
            "store) and check that the port is open; no ranks were started")


def _install(watch: _Watch) -> None:
    """Hook torch's local agent: note when ranks run; after a failure, check the store first."""
    from hybridpar.compat import torch as torch_compat

    def after_check(failed: bool):
        watch.started = True
        # Ranks that lost their peers on the head node fail as the store goes: name the cause.
        return watch.lost() if failed and not watch.answers() else None

    def on_store_failure(err):
        if watch.answers():
            return None
        return watch.lost() if watch.started else watch.unreachable()

    torch_compat.watch_elastic_agent(after_check, on_store_failure, can_close_rendezvous=lambda: not watch.gone)


def _import_torch() -> None:
    """Load torch with its C++ warnings off in this process only, unless the user set
    TORCH_CPP_LOG_LEVEL: c10 reads it once, when torch loads, and the agent's store client prints
    a C++ stack trace with each failed store call. The ranks get the user's environment."""
    if "TORCH_CPP_LOG_LEVEL" in os.environ:
        import torch  # noqa: F401
        return
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    try:
        import torch  # noqa: F401
    finally:
        del os.environ["TORCH_CPP_LOG_LEVEL"]


def main(argv: list[str] | None = None) -> int:
    _import_torch()
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import record
    from torch.distributed.elastic.rendezvous import RendezvousConnectionError

    from hybridpar.compat import torch as torch_compat

    args = torchrun.parse_args(sys.argv[1:] if argv is None else argv)
    os.environ[LAUNCHER_PID] = str(os.getpid())  # the ranks' parent (launcher_death.py)
    watch = None
    if args.rdzv_backend == "c10d" and args.rdzv_endpoint and not args.standalone:
        watch = _Watch(*torch_compat.rendezvous_endpoint(args.rdzv_endpoint, default_port=29400))
        _install(watch)
    try:
        record(torchrun.run)(args)
    except HeadNodeLost as err:
        print(err, file=sys.stderr, flush=True)
        return EXIT_CODE
    except RendezvousConnectionError:  # creating the store's client, before the agent runs
        if watch is None or watch.answers():
            raise
        print(watch.unreachable(), file=sys.stderr, flush=True)
        return EXIT_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main())
