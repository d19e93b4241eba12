"""Replica drift check: every N steps, do all ranks that should hold the same weights still hold
bit-identical ones?

The ranks holding the same weights are this rank's ``dp_cp`` group: its DP replicas and, with
context parallelism, the CP ranks of each replica (they hold the same shard of every weight and
step it with the same averaged gradient); without CP that is the DP group. Each rank hashes each
of its parameters (8 bytes of sha256 per tensor) and gathers the hash vectors of that group (one
all-gather of 8 bytes x parameters). Where a tensor's hashes disagree, the ranks holding the
minority hash are reported (with two holders, which one is wrong cannot be told: the one after
the group's first rank is named). One scalar all-reduce over the world tells every rank whether
any group found drift; only then are the findings gathered, so a clean check costs one small
all-gather and one scalar all-reduce.

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
    replica: int  # the DP index of the copy that disagrees with the majority
    rank: int  # the global rank holding that copy
    replica_ranks: tuple[int, ...]  # every global rank of that DP replica
    agreeing: tuple[int, ...]  # the DP indices of the ranks holding the majority hash
    cp_rank: int | None = None  # with CP: the CP index of the disagreeing copy
    agreeing_ranks: tuple[int, ...] = ()  # the global ranks holding the majority hash

    def line(self) -> str:
        if self.cp_rank is None:
            return (
                f"replica drift at step {self.step}: DP replica {self.replica} (ranks {_span(self.replica_ranks)}) "
                f"differs from replica(s) {','.join(map(str, self.agreeing))} in {self.tensor} (held by rank {self.rank})"
            )
        return (
            f"replica drift at step {self.step}: rank {self.rank} (DP replica {self.replica}, CP rank {self.cp_rank}) "
            f"differs from rank(s) {','.join(map(str, self.agreeing_ranks))}, which hold the same weights, in {self.tensor}"
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


def gather_digests(named_params, mesh) -> tuple[list[str], list[list[bytes]], list[int]]:
    """(names, digests, ranks): this rank's parameter names, and the digests of every rank that
    holds the same weights (the ``dp_cp`` group), ``digests[k]`` those of global rank ``ranks[k]``."""
    import torch
    import torch.distributed as dist

    names, digests = tensor_digests(named_params)
    group = mesh.group("dp_cp")
    ranks = dist.get_process_group_ranks(group)
    if len(ranks) == 1:
        return names, [digests], ranks
    mine = torch.tensor(list(b"".join(digests)), dtype=torch.uint8, device=mesh.device)
    parts = [torch.empty_like(mine) for _ in ranks]
    dist.all_gather(parts, mine, group=group)
    return names, [_split(bytes(t.cpu().tolist())) for t in parts], ranks


def find_drift(step: int, names: list[str], gathered: list[list[bytes]], ranks: list[int], layout) -> list[Drift]:
    """``gathered[k][i]``: global rank ``ranks[k]``'s digest of tensor i, for ranks that should hold
    the same weights; ``layout``: the job's RankLayout, which names each rank's replica."""
    found = []
    for i, name in enumerate(names):
        groups: dict[bytes, list[int]] = {}
        for k, digests in enumerate(gathered):
            groups.setdefault(digests[i], []).append(k)
        if len(groups) == 1:
            continue
        # Majority wins; a tie goes to the group holding the group's first rank.
        majority = max(groups.values(), key=lambda ks: (len(ks), -ks[0]))
        agreeing = tuple(ranks[k] for k in majority)
        for members in groups.values():
            if members is not majority:
                found += [_drift(step, name, ranks[k], agreeing, layout) for k in members]
    return found


def _drift(step: int, tensor: str, rank: int, agreeing: tuple[int, ...], layout) -> Drift:
    coord = layout.coord(rank)
    return Drift(step, tensor, coord.dp, rank, tuple(layout.group_of(rank, "mp")),
                 tuple(sorted({layout.coord(r).dp for r in agreeing})),
                 coord.cp if layout.cp > 1 else None, agreeing)


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
        names, gathered, ranks = gather_digests(canonical_params(job.chunks), mesh)
        local = find_drift(step, names, gathered, ranks, job.plan.layout)
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
