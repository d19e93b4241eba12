"""Replica drift check: every N steps, are all DP replicas still bit-identical?

Each rank hashes each of its parameters (8 bytes of sha256 per tensor) and gathers the hash
vectors of its DP group (one all-gather of 8 bytes x parameters). Where a tensor's hashes
disagree, the replicas holding the minority hash are reported (with two replicas, which one
is wrong cannot be told: the one without DP rank 0 is named). One scalar all-reduce over the
world tells every rank whether any group found drift; only then are the findings gathered, so
a clean check costs one small all-gather and one scalar all-reduce.

``train(..., hooks=[ReplicaCheck(every, on_drift)])``: ``on_drift="stop"`` raises
``ReplicaDriftError`` on every rank (``hybridpar train`` exits 3), ``"warn"`` prints and goes on.
Put it before the checkpoint hook, so a drifted state is never saved under ``stop``.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

ON_DRIFT = ("stop", "warn")
DIGEST_BYTES = 8


class ReplicaDriftError(RuntimeError):
    """DP replicas that should be identical are not; the message names step, replica, ranks, tensor."""


@dataclass(frozen=True)
class Drift:
    step: int
    tensor: str
    replica: int  # the DP index whose copy disagrees with the majority
    rank: int  # the global rank holding that copy
    replica_ranks: tuple[int, ...]  # every global rank of that replica
    agreeing: tuple[int, ...]  # the DP indices holding the majority hash

    def line(self) -> str:
        ranks = _span(self.replica_ranks)
        return (
            f"replica drift at step {self.step}: DP replica {self.replica} (ranks {ranks}) differs from replica(s) "
            f"{','.join(map(str, self.agreeing))} in {self.tensor} (held by rank {self.rank})"
        )


def _span(ranks) -> str:
    ranks = sorted(ranks)
    contiguous = ranks == list(range(ranks[0], ranks[-1] + 1))
    return f"{ranks[0]}-{ranks[-1]}" if contiguous and len(ranks) > 1 else ",".join(map(str, ranks))


def tensor_digests(named_params) -> tuple[list[str], list[bytes]]:
    import torch

    names, digests = [], []
    for name, p in named_params:
        data = p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        names.append(name)
        digests.append(hashlib.sha256(data).digest()[:DIGEST_BYTES])
    return names, digests


def find_drift(step: int, names: list[str], gathered: list[list[bytes]], dp_ranks: list[int], replica_ranks) -> list[Drift]:
    """``gathered[d][i]``: DP rank d's digest of tensor i. ``dp_ranks[d]``: its global rank;
    ``replica_ranks(d)``: all global ranks of replica d."""
    found = []
    for i, name in enumerate(names):
        groups: dict[bytes, list[int]] = {}
        for d, digests in enumerate(gathered):
            groups.setdefault(digests[i], []).append(d)
        if len(groups) == 1:
            continue
        # Majority wins; a tie goes to the group holding the lowest DP rank.
        majority = max(groups.values(), key=lambda ds: (len(ds), -ds[0]))
        for members in groups.values():
            if members is majority:
                continue
            for d in members:
                found.append(Drift(step, name, d, dp_ranks[d], tuple(replica_ranks(d)), tuple(majority)))
    return found


class ReplicaCheck:
    """A ``train()`` hook: check replica identity after every ``every``-th step."""

    def __init__(self, every: int, on_drift: str = "stop", print_fn=print):
        if on_drift not in ON_DRIFT:
            raise ValueError(f"on_drift must be one of {ON_DRIFT}, got {on_drift!r}")
        self.every, self.on_drift, self.print_fn = every, on_drift, print_fn
        self.found: list[Drift] = []

    def on_step(self, job, metrics) -> None:
        if self.every > 0 and metrics.step % self.every == 0:
            self.check(job, metrics.step)

    def check(self, job, step: int) -> list[Drift]:
        import torch
        import torch.distributed as dist

        from hybridpar.runtime.model import canonical_params

        mesh = job.mesh
        names, digests = tensor_digests(canonical_params(job.chunks))
        mine = torch.tensor(list(b"".join(digests)), dtype=torch.uint8, device=mesh.device)
        dp = mesh.size("dp")
        local: list[Drift] = []
        if dp > 1:
            parts = [torch.empty_like(mine) for _ in range(dp)]
            dist.all_gather(parts, mine, group=mesh.group("dp"))
            gathered = [_split(bytes(t.cpu().tolist())) for t in parts]
            dp_ranks = dist.get_process_group_ranks(mesh.group("dp"))
            layout = job.plan.layout
            ranks_of = lambda d: [r for r in range(layout.world_size) if layout.coord(r).dp == d]  # noqa: E731
            local = find_drift(step, names, gathered, dp_ranks, ranks_of)
        flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=mesh.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if not int(flag):
            return []
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, local)
        found = sorted({d for part in everyone for d in part}, key=lambda d: (d.replica, d.rank, d.tensor))
        self.found.extend(found)
        if self.on_drift == "warn":
            if dist.get_rank() == 0 and self.print_fn:
                for d in found:
                    self.print_fn("warning: " + d.line())
        else:
            more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
            raise ReplicaDriftError(found[0].line() + more)
        return found


def _split(blob: bytes) -> list[bytes]:
    return [blob[i : i + DIGEST_BYTES] for i in range(0, len(blob), DIGEST_BYTES)]
