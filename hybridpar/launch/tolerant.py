"""The launcher of a run that tolerates the loss of a DP replica (``--tolerate-replica-loss``).

torch's elastic agent stops every rank when one fails. Here the launching process starts the
ranks itself, hosts the TCP store they rendezvous through, and is the one authority on which
ranks form the job (TorchFT's lighthouse, for one machine's ranks):

- every rank has a permanent *member id* (its first global rank) and joins *generation* 0 of
  the world through the store prefix ``gen0/``;
- when a rank dies, the launcher kills the other ranks of its DP replica (a replica is a fault
  domain: DP is the outermost axis, so a replica is a contiguous block of tp x cp x pp ranks),
  and publishes the next generation: the surviving members, in order, and the lost replica.
  The survivors (reliability/replica_loss.py) rebuild their world from it;
- with ``rejoin_after_s``, a lost replica is started again that many seconds later, as new
  processes. Each says it is ready (``join/ready/<member>``) once it has imported and waits for a
  generation that names it; when every rank of the replica is ready the launcher sets
  ``join/waiting``, the ranks see it at their next step boundary and ask to be joined
  (``join/requested``), and the next generation has every member again.

A generation record is JSON under ``generation/<g>``; ``generation/latest`` holds g.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from hybridpar.cli.main import main as cli_main
from hybridpar.launch.forked import FORWARDED, ForkedRank, can_fork, rank_name
from hybridpar.launch.launcher_death import LAUNCHER_PID, TOLERANT_STORE
from hybridpar.launch.local import free_port
from hybridpar.reliability.nonfinite import EXIT_CODE as NONFINITE_EXIT

STORE_ENV = TOLERANT_STORE  # host:port of the launcher's store, for the ranks
MEMBER_ENV = "HYBRIDPAR_MEMBER"  # a rank's permanent member id
POLL_S = 0.1
# Exit codes by which every rank ends the job on purpose (bad input, replica drift, an early stop,
# no way to go on after a loss, a non-finite loss): not a lost rank.
CANNOT_GO_ON = 5
JOB_DECISIONS = (0, 2, 3, 4, CANNOT_GO_ON, NONFINITE_EXIT)


@dataclass
class Generation:
    number: int
    members: list  # member ids, in rank order
    lost: list = field(default_factory=list)  # member ids dropped from the previous generation
    joined: list = field(default_factory=list)  # member ids taken back in
    reason: str = ""
    published: float = 0.0  # unix time the launcher published it (ranks share the launcher's clock)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)


def _host_store(port: int) -> int:
    """The launcher's store, served from a process of its own until the launcher ends it (or dies).
    It ignores the signals a terminal sends the job: the ranks stopping on them still need it."""
    from torch.distributed import TCPStore

    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_IGN)

    _store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    while True:
        time.sleep(3600)


def replica_of(member: int, replica_size: int) -> int:
    return member // replica_size


def publish(store, gen: Generation) -> None:
    gen.published = time.time()
    store.set(f"generation/{gen.number}", gen.to_json())
    store.set("generation/latest", str(gen.number))


def read_generation(store, number: int) -> Generation:
    return Generation(**json.loads(store.get(f"generation/{number}").decode()))


class TolerantLauncher:
    def __init__(self, nproc: int, argv: list[str], replica_size: int, rejoin_after_s: float | None = None,
                 stop_grace_s: int = 600):
        from torch.distributed import TCPStore

        self.nproc, self.argv, self.replica_size = nproc, argv, replica_size
        self.rejoin_after_s, self.stop_grace_s = rejoin_after_s, stop_grace_s
        self.port = free_port()
        self.fork = can_fork()  # CPU: the ranks are forked from here (launch/forked.py)
        self.store_host = None
        if self.fork:
            # The store's server thread must not be in this process when it forks a rank: a lock
            # it held at that moment would stay held in the rank forever (seen: a rank hung at start).
            self.store_host = ForkedRank(lambda: _host_store(self.port), dict(os.environ), "hybridpar store",
                                         new_session=False)
        self.store = TCPStore("127.0.0.1", self.port, is_master=not self.fork, wait_for_workers=False)
        self.procs: dict[int, subprocess.Popen | ForkedRank] = {}
        self.generation = Generation(0, list(range(nproc)))
        self.pending_rejoin: dict[int, float] = {}  # replica -> when to start it again
        self.signalled: int | None = None
        self.failures: list[tuple[int, int]] = []  # (member, exit code)

    def _env(self, member: int) -> dict:
        env = dict(os.environ, RANK=str(member), WORLD_SIZE=str(self.nproc), LOCAL_RANK=str(member),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.port), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        env[STORE_ENV] = f"127.0.0.1:{self.port}"
        env[MEMBER_ENV] = str(member)
        env[LAUNCHER_PID] = str(os.getpid())
        return env

    def _start(self, member: int) -> None:
        if self.fork:  # CPU: see launch/forked.py
            self.procs[member] = ForkedRank(lambda: cli_main(self.argv), self._env(member), rank_name(member),
                                            new_session=False)
        else:
            self.procs[member] = subprocess.Popen([sys.executable, "-m", "hybridpar", *self.argv], env=self._env(member))

    def run(self) -> int:
        publish(self.store, self.generation)
        for member in range(self.nproc):
            self._start(member)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
        try:
            return self._monitor()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.kill()
            if self.store_host is not None:
                self.store_host.kill()
                self.store_host.wait()

    def _on_signal(self, signum, frame) -> None:
        """Passed on to the ranks, which finish their step, save and stop (reliability/stopping.py)."""
        self.signalled = signum
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    def _monitor(self) -> int:
        deadline = None
        while True:
            now = time.monotonic()
            for member, proc in list(self.procs.items()):
                code = proc.poll()
                if code is None or member not in self.generation.members:
                    continue
                if code not in JOB_DECISIONS and self.signalled is None:
                    self._lose(member, code)
            for replica, when in list(self.pending_rejoin.items()):
                if now >= when:
                    self._rejoin(replica)
            if all(self.procs[m].poll() is not None for m in self.generation.members):
                return self._outcome()  # the job is over: a replica still starting up is not waited for
            if self.signalled is not None:
                deadline = deadline or now + self.stop_grace_s
                if now > deadline:
                    return 128 + self.signalled
            self._take_joined()
            time.sleep(POLL_S)

    def _lose(self, member: int, code: int) -> None:
        replica = replica_of(member, self.replica_size)
        lost = [m for m in self.generation.members if replica_of(m, self.replica_size) == replica]
        for m in lost:
            if self.procs[m].poll() is None:
                self.procs[m].kill()
        for m in lost:
            self.procs[m].wait()
        self.failures.append((member, code))
        members = [m for m in self.generation.members if m not in lost]
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        self.generation = Generation(self.generation.number + 1, members, lost=lost,
                                     reason=f"rank {member} (pid {self.procs[member].pid}) died: {how}")
        publish(self.store, self.generation)
        if members and self.rejoin_after_s is not None:
            self.pending_rejoin[replica] = time.monotonic() + self.rejoin_after_s

    def _rejoin(self, replica: int) -> None:
        """Start a lost replica's ranks again; they are taken in at a step boundary once ready."""
        del self.pending_rejoin[replica]
        for m in range(replica * self.replica_size, (replica + 1) * self.replica_size):
            self._start(m)

    def _ready_replicas(self) -> list[int]:
        """The members of every restarted replica whose ranks all wait to join."""
        out = []
        outside = [m for m, p in self.procs.items() if m not in self.generation.members and p.poll() is None]
        for replica in sorted({replica_of(m, self.replica_size) for m in outside}):
            ranks = list(range(replica * self.replica_size, (replica + 1) * self.replica_size))
            if all(m in outside for m in ranks) and self.store.check([f"join/ready/{m}" for m in ranks]):
                out += ranks
        return out

    def _take_joined(self) -> None:
        """Tell the ranks that a replica waits; once they ask (``join/requested``), a generation
        with it back in."""
        ready = self._ready_replicas()
        if ready and not self.store.check(["join/waiting"]):
            self.store.set("join/waiting", "1")
        if not self.store.check(["join/requested"]):
            return
        self.store.delete_key("join/requested")
        self.store.delete_key("join/waiting")
        if not ready:  # the replica that waited died since: the ranks wait for a world all the same
            self.generation = Generation(self.generation.number + 1, list(self.generation.members),
                                         reason="the replica that waited to join is gone")
            publish(self.store, self.generation)
            return
        for m in ready:
            self.store.delete_key(f"join/ready/{m}")
        waiting = ready
        members = sorted(self.generation.members + waiting)
        self.generation = Generation(self.generation.number + 1, members, joined=waiting, reason="replica rejoined")
        publish(self.store, self.generation)

    def _outcome(self) -> int:
        codes = [p.returncode for m, p in self.procs.items() if m in self.generation.members]
        if self.signalled is not None:
            return 128 + self.signalled
        if codes and all(c == 0 for c in codes):
            return 0
        failed = [c for c in codes if c]
        return failed[0] if failed and failed[0] > 0 else 1
