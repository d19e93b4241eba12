"""A lost DP replica does not stop the job: the survivors rebuild a smaller world and go on.

With ``--tolerate-replica-loss`` the ranks run under launch/tolerant.py's launcher, which hosts
the store and publishes *generations* of the world (which member processes form it). A rank:

- joins the first generation that names it (``TolerantWorld.join``);
- keeps, after every step, the state of that step in host memory (``Snapshots``): its own
  fragments of the fp32 weights and AdamW moments (checkpoint/save.py's ``rank_payload``), and,
  with ZeRO 1/2, a copy of the fragments of the rank that holds the same TP/CP/PP position in
  the previous DP replica (a ring over the DP group). A replica's ZeRO partition thus also lives
  in the next replica: one extra partition per rank, in host memory;
- when a collective fails because a peer died (gloo and NCCL cannot reuse a group with a dead
  member), destroys its process groups, waits for the launcher's next generation (the lost
  replica gone), joins that world, rebuilds its Job with one replica fewer, and loads the last
  step every survivor completed from the survivors' snapshots and the copies of the lost
  replica's partitions (``recover``): the same fragment format a checkpoint uses, read from
  memory (checkpoint/in_memory.py), resharded over the new DP size;
- at a step boundary, when the launcher has started a replica again and it waits, takes it back
  in the same way (``take_in``): the newcomers receive the weights and optimizer state from their
  peers, with no checkpoint read.

The global batch stays the same (more micro-batches per replica), and the data order is a pure
function of (seed, step): every step's rows are trained exactly once in the final model.
"""
from __future__ import annotations

import functools
import gc
import io
import os
import re
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hybridpar.launch.tolerant import MEMBER_ENV, STORE_ENV, Generation, read_generation

# A survivor's operations in the old world end within the watchdog's poll (0.2 s) of a new
# generation; one that ends later waited for something the shut-down connections did not end,
# and the recovery line quotes its error.
SLOW_LEAVE_S = 5.0
LEAVE_ERROR_CHARS = 120
KEEP = 2  # snapshots kept: the last step every rank finished may be the one before this rank's last


class ReplicaLossError(RuntimeError):
    """The job cannot go on: no replica left, or a lost replica's state is lost with it."""


def tolerant() -> bool:
    return bool(os.environ.get(STORE_ENV))


class TolerantWorld:
    """This process's view of the job: the launcher's store, its member id, its generation."""

    def __init__(self, timeout_s: float):
        from torch.distributed import TCPStore

        host, port = os.environ[STORE_ENV].rsplit(":", 1)
        self.store = TCPStore(host, int(port), is_master=False, timeout=_timedelta(rendezvous_timeout_s(timeout_s)))
        self.member = int(os.environ[MEMBER_ENV])
        self.timeout_s = timeout_s
        self.generation: Generation | None = None
        self.first: Generation | None = None  # the generation this process started in
        self._sockets_before: set[int] = set()  # the TCP connections open before this world's
        self._left = threading.Event()  # set once this world is aborted (by the loop or the watchdog)
        self._lock = threading.Lock()
        self._watchdog: threading.Thread | None = None

    def join(self, backend: str) -> Generation:
        """Join the newest generation that names this member (a restarted replica waits for it)."""
        number = int(self.store.get("generation/latest").decode())
        gen = read_generation(self.store, number)
        if self.member not in gen.members:  # a restarted replica's rank: ready, waiting to be taken in
            self.store.set(f"join/ready/{self.member}", "1")
        while self.member not in gen.members:
            # however long the survivors take to reach a step boundary: the launcher ends this
            # process when the job ends without it
            gen = self._wait_after(gen.number, forever=True)
        self.first = gen
        self._init(gen, backend)
        return gen

    def _wait_after(self, number: int, forever: bool = False) -> Generation:
        deadline = time.monotonic() + self.timeout_s
        while forever or time.monotonic() < deadline:
            latest = int(self.store.get("generation/latest").decode())
            if latest > number:
                return read_generation(self.store, latest)
            time.sleep(0.05)
        raise ReplicaLossError(f"no new world within {self.timeout_s:.0f} s of generation {number}")

    def _init(self, gen: Generation, backend: str) -> None:
        from hybridpar.compat.torch import connected_tcp_sockets, set_world_timeout

        self._sockets_before = connected_tcp_sockets()
        store = dist.PrefixStore(f"gen{gen.number}/", self.store)
        dist.init_process_group(backend, store=store, rank=gen.members.index(self.member),
                                world_size=len(gen.members), timeout=_timedelta(rendezvous_timeout_s(self.timeout_s)))
        set_world_timeout(self.timeout_s)
        self.generation = gen
        self._left.clear()
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="hybridpar-generation-watch", daemon=True)
            self._watchdog.start()

    @property
    def left(self) -> bool:
        """This world was aborted: whatever a collective raised since, the world is gone."""
        return self._left.is_set()

    def leave(self) -> None:
        """Abort this world (once): every collective still waiting, here or on a peer, ends in an error."""
        from hybridpar.compat.torch import abort_world, connected_tcp_sockets

        with self._lock:
            if self._left.is_set():
                return
            abort_world(connected_tcp_sockets() - self._sockets_before)
            self._left.set()

    def next(self, backend: str) -> Generation:
        """Leave the current world (its groups cannot be reused) and join the next generation."""
        self.leave()
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - aborted groups may already be gone
            pass
        # The abandoned job's engine and model hold its groups in reference cycles: collect them
        # now, or every world left keeps its gloo threads and sockets (3 threads per group). One
        # pass can free what holds the next cycle (rank 0's was freed by the second).
        while gc.collect():
            pass
        gen = self._wait_after(self.generation.number)
        if self.member not in gen.members:
            raise ReplicaLossError(f"member {self.member} is not in generation {gen.number}")
        self._init(gen, backend)
        return gen

    def _watch(self) -> None:
        """A rank can wait in a collective on live peers that wait on the dead one: when the
        launcher publishes a new generation, leave this world so that every such wait ends in an
        error (the training loop then recovers)."""
        while True:
            time.sleep(0.2)
            if self.generation is None or self._left.is_set():
                continue
            try:
                latest = int(self.store.get("generation/latest").decode())
            except Exception:  # noqa: BLE001 - the launcher's store is gone: the job is ending
                return
            if latest > self.generation.number:
                self.leave()

    def someone_waits(self) -> bool:
        return self.store.check(["join/waiting"])

    def request_join(self) -> None:
        self.store.set("join/requested", "1")


def refuse_calls_in_a_left_world(tolerant_world: TolerantWorld) -> None:
    """Every torch.distributed collective and point-to-point call raises at once, instead of being
    posted, while this rank has left its world and not yet joined the next. On gloo an operation
    posted on a connection ``abort_world`` shut down is not ended by it: it waits for its group's
    timeout, which ``_set_pg_timeout`` does not shorten for operations that take the gloo context's
    (the recovery line named such sends, posted 0.1 s after a loss, ending 60 s later with
    ``--timeout-s 60``). A send already posted when the world is left can wait as long: gloo's
    TCP pair fails no unbound-buffer send left in its transmit queue when the connection fails
    (docs/training.md, "Limits"); this does not cover it."""
    from hybridpar.compat import torch as torch_compat
    from hybridpar.observe.comm_trace import COLLECTIVES, P2P

    for name in COLLECTIVES + P2P:
        current = getattr(dist, name, None)
        if current is not None and not getattr(current, "refuses_a_left_world", False):
            torch_compat.replace_distributed_function(name, _refusing(current, tolerant_world))


def _refusing(call, tolerant_world: TolerantWorld):
    @functools.wraps(call)
    def refusing(*args, **kwargs):
        if tolerant_world.left:
            raise RuntimeError(f"torch.distributed.{call.__name__} in a world this rank has left (a replica was lost)")
        return call(*args, **kwargs)

    refusing.refuses_a_left_world = True
    return refusing


def rendezvous_timeout_s(timeout_s: float) -> float:
    """How long a new world's members wait for each other. Longer than an operation's timeout: a
    survivor can stay in an operation of the world it left until that operation times out (seen
    on gloo under load, docs/training.md), and the others wait for it instead of giving up."""
    return 2 * timeout_s + 30


def speaks() -> bool:
    """Whether this rank says what ends a tolerant job: the lowest member of its generation."""
    w = _WORLD
    return w is None or w.generation is None or w.member == min(w.generation.members)


def _timedelta(seconds: float):
    from datetime import timedelta

    return timedelta(seconds=seconds)


_WORLD: TolerantWorld | None = None


def world(timeout_s: float = 600) -> TolerantWorld:
    """This process's TolerantWorld (made on the first call, with the run's collective timeout)."""
    global _WORLD
    if _WORLD is None:
        _WORLD = TolerantWorld(timeout_s)
    return _WORLD


# --- snapshots -----------------------------------------------------------------------------
@dataclass
class Snapshot:
    step: int
    member: int  # whose state
    payload: dict
    index: list
    metas: dict


def _to_bytes(obj) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _from_bytes(data: torch.Tensor):
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)


def _ring_exchange(obj, group, to_rank: int, from_rank: int, device) -> object:
    """Send ``obj`` to global rank ``to_rank`` and receive one from ``from_rank`` (a DP ring)."""
    data = _to_bytes(obj)
    size_out = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    size_in = torch.zeros(1, dtype=torch.int64, device=device)
    for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, size_out, to_rank, group),
                                       dist.P2POp(dist.irecv, size_in, from_rank, group)]):
        req.wait()
    data_in = torch.empty(int(size_in.item()), dtype=torch.uint8, device=device)
    for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, data.to(device), to_rank, group),
                                       dist.P2POp(dist.irecv, data_in, from_rank, group)]):
        req.wait()
    return _from_bytes(data_in.cpu())


class Snapshots:
    """A ``train()`` hook, first of all: after every step, this rank's state and its DP
    predecessor's, in host memory (the last ``KEEP`` steps)."""

    def __init__(self, world: TolerantWorld):
        self.world = world
        self.own: list[Snapshot] = []
        self.copies: list[Snapshot] = []  # the previous DP replica's partition at this position

    def after_step(self, job, metrics) -> None:
        self.take(job, metrics.step)

    def take(self, job, step: int) -> None:
        from hybridpar.checkpoint.save import rank_payload

        mesh = job.mesh
        replicated = job.plan.zero_stage == 0  # every replica holds the whole optimizer state
        payload, index, metas = rank_payload(job, step, "memory", as_dp_rank=0 if replicated else None,
                                             every_tp_rank=True)
        members = self.world.generation.members
        me = Snapshot(step, members[dist.get_rank()], payload, index, metas)
        if replicated or mesh.size("dp") == 1:
            self.own = (self.own + [me])[-KEEP:]
            return
        dp_group = mesh.members["dp"]
        i = dp_group.index(mesh.rank)
        nxt, prev = dp_group[(i + 1) % len(dp_group)], dp_group[(i - 1) % len(dp_group)]
        got = _ring_exchange({"step": step, "member": me.member, "payload": payload, "index": index},
                             mesh.group("dp"), nxt, prev, mesh.device)
        copy = Snapshot(got["step"], got["member"], got["payload"], got["index"], metas)
        # both or neither: a step counts as kept once its copy has arrived as well
        self.own, self.copies = (self.own + [me])[-KEEP:], (self.copies + [copy])[-KEEP:]

    def forget(self) -> None:
        self.own, self.copies = [], []

    def own_at(self, step: int) -> Snapshot | None:
        return next((s for s in self.own if s.step == step), None)

    def copy_at(self, step: int, member: int) -> Snapshot | None:
        return next((s for s in self.copies if s.step == step and s.member == member), None)


# --- rebuilding the job in a new world --------------------------------------------------------
def plan_for(plan, gen: Generation):
    """The layout of ``plan`` with the generation's number of replicas."""
    return plan.with_(dp=len(gen.members) // plan.layout.model_parallel_size)


def transfer_state(job, snapshots: Snapshots | None, lost: list[int], step: int | None) -> int:
    """Collective over the new world: load into ``job`` the state of the last step every member
    kept (``step``: a rank joining without state passes None), from the members' own snapshots and
    the copies of ``lost`` members' partitions. Returns that step."""
    from hybridpar.checkpoint.in_memory import MemoryCheckpoint
    from hybridpar.checkpoint.load import load_into
    from hybridpar.compat import deepspeed as deepspeed_compat

    mesh = job.mesh
    steps = [None] * dist.get_world_size()
    dist.all_gather_object(steps, step)
    known = [s for s in steps if s is not None]
    if not known:
        raise ReplicaLossError("no member kept any step's state")
    step = min(known)
    contributions = []
    if snapshots is not None:
        replicated = job.plan.zero_stage == 0
        own = snapshots.own_at(step)
        if own is None:
            raise ReplicaLossError(f"rank {dist.get_rank()} kept no state of step {step}")
        if not replicated or mesh.rank_in("dp_cp") == 0:
            contributions.append(own)
        for member in lost:
            copy = snapshots.copy_at(step, member)
            if copy is not None and not replicated:
                contributions.append(copy)
    gathered = [None] * mesh.size("dp_cp")
    dist.all_gather_object(gathered, [(c.payload, c.index, c.metas) for c in contributions], group=mesh.group("dp_cp"))
    parts = [c for per_rank in gathered for c in per_rank]
    if not parts:
        raise ReplicaLossError(f"no state of step {step} at this position: a lost replica's partitions went with it")
    metas = {k: v for _, _, m in parts for k, v in m.items()}
    old_tp = mesh.size("tp")
    reader = MemoryCheckpoint(step, old_tp, [p for p, _, _ in parts], metas, [i for _, i, _ in parts])
    load_into(job, reader)
    deepspeed_compat.set_step_counters(job.engine.engine, step, step * job.plan.global_batch)
    return step


def describe_loss(gen: Generation, replica_size: int, in_flight: int, restored: int | None = None) -> str:
    """'replica R (ranks A-B) lost in step N: why' ('after step N' when step N was complete)."""
    lost = gen.lost
    replica = lost[0] // replica_size if lost else "?"
    ranks = f"{lost[0]}-{lost[-1]}" if len(lost) > 1 else str(lost[0]) if lost else "?"
    when = f"after step {in_flight}" if restored == in_flight else f"in step {in_flight}"
    return f"replica {replica} (ranks {ranks}) lost {when}: {gen.reason}"


class Tolerance:
    """What the training loop needs: the snapshot hook, recovery after a loss, taking a replica in."""

    def __init__(self, plan, backend: str, rejoins: bool):
        self.world, self.backend, self.rejoins = world(), backend, rejoins
        refuse_calls_in_a_left_world(self.world)
        self.replica_size = plan.layout.model_parallel_size
        self.snapshots = Snapshots(self.world)
        self.failure: tuple[float, int, str] | None = None  # set by failed(): (unix time, old rank, error)

    def joining(self) -> bool:
        """This process is a restarted replica's: it takes its state from its peers."""
        return self.world.member in self.world.first.joined

    def recover(self, job, build, run_plan, step_in_flight: int):
        """After a lost peer: (the job rebuilt in the next world, the next step, one line)."""
        start = time.monotonic()
        job.abandon()
        gen = self.world.next(self.backend)
        layout = plan_for(run_plan, gen)
        problems = layout.violations()
        if problems:
            raise ReplicaLossError(f"{describe_loss(gen, self.replica_size, step_in_flight)}; the {layout.dp} "
                                   f"replica(s) left cannot go on: {problems[0]}; resume from the last checkpoint "
                                   f"(--resume auto) on a layout that fits")
        job = build(layout)
        last = self.snapshots.own[-1].step if self.snapshots.own else None
        step = transfer_state(job, self.snapshots, gen.lost, last)
        self.snapshots.forget()
        self.snapshots.take(job, step)  # the restored state, in the new layout: a second loss can start here
        line = (f"{describe_loss(gen, self.replica_size, step_in_flight, step)}; continuing on {layout.dp} replicas "
                f"from the state after step {step}; recovered in {time.monotonic() - start:.1f} s "
                f"({self._last_to_leave(gen)})")
        return job, step + 1, line

    def failed(self, err: BaseException) -> None:
        """What ended this rank's step in the world it leaves: when, its rank there, and the
        error's first line (text only: the exception's traceback would keep the old job alive)."""
        text = str(err).strip()
        first = re.sub(r"^\[[^\]]*\]\s*", "", text.splitlines()[0]) if text else type(err).__name__  # gloo's source location
        self.failure = (time.time(), dist.get_rank(), first[:LEAVE_ERROR_CHARS])

    def _last_to_leave(self, gen: Generation) -> str:
        """Agreed over the new world: which survivor's operation in the old world ended last, how
        long after the launcher published the loss, and, when that took longer than the watchdog
        should (``SLOW_LEAVE_S``), the error that finally ended it."""
        at, rank, error = self.failure  # failed() runs before every recover()
        everyone = [None] * dist.get_world_size()
        # A survivor that talked to the dead rank errs before the launcher notices the death: 0 s.
        dist.all_gather_object(everyone, (max(0.0, at - gen.published), rank, error))
        late, rank, error = max(everyone)
        text = f"the last survivor left the old world {late:.1f} s after the launcher saw the loss: rank {rank}"
        return f"{text}, {error}" if late > SLOW_LEAVE_S else text

    def someone_waits(self, job) -> bool:
        """Agreed over the world at a step boundary: a restarted replica waits to come in."""
        if not self.rejoins:
            return False
        flag = torch.tensor([1.0 if dist.get_rank() == 0 and self.world.someone_waits() else 0.0], device=job.mesh.device)
        dist.all_reduce(flag)
        return flag.item() > 0

    def take_in(self, job, build, run_plan, step: int):
        """Every member (the newcomers too) moves to the world with the waiting replica; the
        newcomers receive the state of ``step``. Returns (job, one line)."""
        start = time.monotonic()
        if dist.get_rank() == 0:
            self.world.request_join()
        job.abandon()
        gen = self.world.next(self.backend)
        job = build(plan_for(run_plan, gen))
        transfer_state(job, self.snapshots, [], step)
        self.snapshots.forget()
        self.snapshots.take(job, step)
        replicas = len(gen.members) // self.replica_size
        if not gen.joined:
            return job, f"after step {step}: {gen.reason}; training on {replicas} replicas"
        return job, self._rejoined(job, gen, step, time.monotonic() - start)

    def _rejoined(self, job, gen: Generation, step: int, seconds: float) -> str:
        """The one line, the same on every rank (rank 0 of the new world may be a newcomer's):
        collective, the slowest rank's time."""
        slowest = torch.tensor([seconds], dtype=torch.float64, device=job.mesh.device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return (f"replica rejoined after step {step}: ranks {', '.join(map(str, gen.joined))} received the weights "
                f"and optimizer state from their peers; training on {len(gen.members) // self.replica_size} "
                f"replicas ({slowest.item():.1f} s)")

    def join(self, build, run_plan):
        """A restarted replica's first job, built in the world that takes it in, its state from
        its peers: (job, the first step, one line)."""
        start = time.monotonic()
        gen = self.world.generation
        job = build(plan_for(run_plan, gen))
        step = transfer_state(job, None, [], None)
        self.snapshots.take(job, step)
        return job, step + 1, self._rejoined(job, gen, step, time.monotonic() - start)
