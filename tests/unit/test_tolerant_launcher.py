"""The launcher's bookkeeping under --tolerate-replica-loss (launch/tolerant.py), on a real TCP
store with stand-in processes: which ranks a death takes with it, which exits are not a loss,
when a restarted replica is taken in, and that a join request never leaves the ranks without a
next world. The same launcher runs 8 real ranks in tests/integration/test_replica_loss.py."""
from __future__ import annotations

import pytest

from hybridpar.launch import tolerant
from hybridpar.launch.tolerant import TolerantLauncher, read_generation


class FakeProc:
    def __init__(self, member: int):
        self.pid, self.returncode = 1000 + member, None

    def poll(self):
        return self.returncode

    def kill(self):
        if self.returncode is None:
            self.returncode = -9

    def wait(self):
        return self.returncode


@pytest.fixture
def launcher(monkeypatch):
    """4 ranks in replicas of 2 (TP2 x DP2), restarted 0 s after a loss."""
    started = []

    def start(self, member):
        started.append(member)
        self.procs[member] = FakeProc(member)

    monkeypatch.setattr(TolerantLauncher, "_start", start)
    launch = TolerantLauncher(4, ["train"], replica_size=2, rejoin_after_s=0.0)
    tolerant.publish(launch.store, launch.generation)
    for m in range(4):
        launch._start(m)
    launch.started = started
    return launch


def _step(launch):
    """One pass of the monitor loop without its sleep."""
    for member, proc in list(launch.procs.items()):
        code = proc.poll()
        if code is not None and member in launch.generation.members and code not in tolerant.JOB_DECISIONS:
            launch._lose(member, code)
    for replica in list(launch.pending_rejoin):
        launch._rejoin(replica)
    launch._take_joined()


def test_a_death_drops_its_whole_replica_and_publishes_the_survivors(launcher):
    peer = launcher.procs[2]
    launcher.procs[3].returncode = -9
    _step(launcher)
    assert launcher.store.get("generation/latest") == b"1"
    gen = read_generation(launcher.store, 1)
    assert gen.members == [0, 1] and gen.lost == [2, 3]
    assert gen.reason == "rank 3 (pid 1003) died: signal SIGKILL"
    assert peer.returncode == -9  # its replica peer was killed too
    assert launcher.started == [0, 1, 2, 3, 2, 3]  # and the replica started again
    assert launcher.procs[2] is not peer


def test_an_exit_every_rank_takes_on_purpose_is_not_a_loss(launcher):
    for code in tolerant.JOB_DECISIONS:
        launcher.procs[1].returncode = code
        _step(launcher)
        assert launcher.generation.number == 0


def test_a_restarted_replica_is_taken_in_once_every_rank_is_ready_and_the_job_asks(launcher):
    launcher.procs[2].returncode = -9
    _step(launcher)  # generation 1 without replica 1; its ranks started again
    store = launcher.store
    store.set("join/ready/2", "1")
    _step(launcher)
    assert not store.check(["join/waiting"])  # one of its two ranks is not ready yet
    store.set("join/ready/3", "1")
    _step(launcher)
    assert store.check(["join/waiting"]) and launcher.generation.number == 1  # the ranks decide when
    store.set("join/requested", "1")
    _step(launcher)
    assert store.get("generation/latest") == b"2"
    gen = read_generation(store, 2)
    assert gen.members == [0, 1, 2, 3] and gen.joined == [2, 3] and gen.reason == "replica rejoined"
    assert not store.check(["join/waiting"]) and not store.check(["join/requested"])


def test_a_join_request_whose_replica_died_meanwhile_still_gives_the_ranks_a_world(launcher):
    launcher.procs[2].returncode = -9
    _step(launcher)
    for m in (2, 3):
        launcher.store.set(f"join/ready/{m}", "1")
    _step(launcher)
    assert launcher.store.check(["join/waiting"])
    launcher.procs[3].returncode = 1  # the waiting replica dies before the ranks ask
    launcher.store.set("join/requested", "1")
    _step(launcher)
    assert launcher.store.get("generation/latest") == b"2"
    gen = read_generation(launcher.store, 2)
    assert gen.members == [0, 1] and gen.joined == [] and "gone" in gen.reason
