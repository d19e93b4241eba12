"""Data-parallel gradient reduction overlapped with the last backward pass.

Gradients accumulate locally over a step's micro-batches. During the backward pass of each
model chunk's last micro-batch, every parameter's gradient is final as soon as autograd has
accumulated it (``register_post_accumulate_grad_hook``); the parameters are grouped in buckets
in backward order (reverse registration order), and a bucket's all-reduce over the DP (x CP)
group is issued asynchronously the moment its last gradient lands, while the backward pass
goes on through earlier layers. The bucket's fp32 copy then replaces the parameters' gradients
(``p.grad`` is dropped), so the backward never holds two copies of a gradient; ``finish()`` waits
for the reductions and hands each parameter a view of its averaged slice (or, reduced to an
owner, hands the owner its runs).
This is megatron-core's ``overlap_grad_reduce`` and torch DDP's bucketing.

Which backward is the last is megatron's to say: its schedules call ``config.no_sync_func``
around every micro-batch but a chunk's last one (``no_sync``). Buckets are issued strictly in
order, so every rank of the group issues the same collectives in the same order whatever the
order their gradients arrive in. Reductions run in fp32: sum, then divide by the group size.

Two kinds of reduction, per parameter. Without ``owners`` (ZeRO-0) a bucket is all-reduced and
every rank gets every averaged gradient. With ``owners`` (ZeRO 1/2: which rank steps which
elements, ``zero_partitions.partition_pieces``) each bucket is cut by owner and every owner's
runs are reduced to that owner alone (one ``dist.reduce`` per owner the bucket touches: a
reduce-scatter's bytes, half an all-reduce's, and no padding where DeepSpeed's partitions cut a
bucket unevenly; a bucket that gives every rank the same share, as one bucket holding a whole
stage does, is a single reduce-scatter); afterwards the owner holds its averaged runs (``received``) and nobody holds
the full averaged gradient. Parameters left out of ``owners`` are all-reduced as before.
DeepSpeed's own reduction of the same gradients is switched off by the engine (engine.py
``_hand_dp_reduction_to_grad_sync``).
"""
from __future__ import annotations

from contextlib import contextmanager
from itertools import accumulate

import torch
import torch.distributed as dist

# The bucket the planner assumes (topology/software/profile.py): megatron-core's default, 40M elements.
from hybridpar.topology.software import GRAD_BUCKET_NUMEL as DEFAULT_BUCKET_NUMEL


def bucket_params(params: list, bucket_numel: int) -> list[list]:
    """Consecutive groups of ``params`` holding at least ``bucket_numel`` elements each (the last
    may hold fewer)."""
    buckets, current, size = [], [], 0
    for p in params:
        current.append(p)
        size += p.numel()
        if size >= bucket_numel:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


class OverlappedGradReduction:
    """``owners`` (ZeRO 1/2: ``zero_partitions.partition_pieces``): parameter -> the runs of its
    gradient each rank of the group steps; those runs are reduced to their owner only, and after
    ``finish()`` the owner finds them in ``received`` (its averaged runs) and the parameter has no
    ``p.grad``. Parameters not in ``owners`` (or every one, without it) are all-reduced in full and
    get their averaged ``p.grad``."""

    def __init__(self, params: list, group, bucket_numel: int = DEFAULT_BUCKET_NUMEL, owners: dict | None = None,
                 partition_sizes: list[int] | None = None):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.ranks = dist.get_process_group_ranks(group)
        self.owners = owners or {}
        self.buckets = bucket_params(list(reversed(params)), bucket_numel)
        self._bucket_of = {p: i for i, bucket in enumerate(self.buckets) for p in bucket}
        # Per bucket: the parameters reduced in full, and each owner's runs [(param, Piece)].
        self._full = [[p for p in bucket if p not in self.owners] for bucket in self.buckets]
        self._runs = []
        for bucket in self.buckets:
            by_owner: dict = {}
            for p in bucket:
                for pc in self.owners.get(p, ()):
                    by_owner.setdefault(pc.owner, []).append((p, pc))
            self._runs.append(sorted(by_owner.items()))
        # With ``partition_sizes`` (every partitioned parameter in ``owners``), a bucket holding
        # every owned parameter (a whole stage in one bucket) covers every rank's partitions: laid
        # out as [rank 0's partitions of each group, rank 1's, ...] (alignment padding as zeros) it
        # is one reduce-scatter instead of one reduce per owner.
        self.partition_sizes = list(partition_sizes or [])
        self._group_start = [sum(self.partition_sizes[:g]) for g in range(len(self.partition_sizes))]
        owned = set(map(id, self.owners))
        self._scatter = [bool(owned) and bool(self.partition_sizes) and owned <= {id(p) for p in bucket}
                         for bucket in self.buckets]
        self.enabled = True  # megatron's schedule turns it off for all but a chunk's last micro-batch
        self.received: list = []
        self._reset()
        # torch keeps a post-accumulate-grad hook out of the garbage collector's sight: the cycle
        # parameter -> hook -> self -> parameter is never collected, so the hooks go in ``remove_hooks``.
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in params]

    def remove_hooks(self) -> None:
        """Unhook the parameters: the last step of a model that is being dropped (it frees them)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def _reset(self) -> None:
        self._ready = [set() for _ in self.buckets]
        self._work: list = [[] for _ in self.buckets]
        self._flat: list = [None] * len(self.buckets)
        self._dtypes: list = [None] * len(self.buckets)
        self._mine: list = [None] * len(self.buckets)  # (buffer, [(Piece, start in buffer)]) this rank owns
        self._next = 0  # the next bucket to issue
        self._issued_in_backward = 0

    @property
    def pending(self) -> bool:
        """Some bucket was issued (or has gradients marked final) and ``finish()`` has not run."""
        return self._next > 0 or any(self._ready)

    @contextmanager
    def no_sync(self):
        """megatron's ``config.no_sync_func``: gradients stay local inside this context."""
        previous, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = previous

    def _grad_ready(self, p: torch.Tensor) -> None:
        if not self.enabled:
            return
        i = self._bucket_of[p]
        self._ready[i].add(p)
        while self._next < len(self.buckets) and len(self._ready[self._next]) == len(self.buckets[self._next]):
            self._issue(self._next)
            self._issued_in_backward += 1

    def _issue(self, i: int) -> None:
        bucket = self.buckets[i]
        # No gradient this step on this rank: it contributes zeros.
        grads = {p: p.grad if p.grad is not None else torch.zeros_like(p, dtype=getattr(p, "accum_dtype", None) or p.dtype)
                 for p in bucket}
        self._dtypes[i] = [grads[p].dtype for p in self._full[i]]
        if self._full[i]:
            self._flat[i] = torch.cat([grads[p].reshape(-1).float() for p in self._full[i]])
            self._work[i].append((dist.all_reduce(self._flat[i], group=self.group, async_op=True), self._flat[i]))
        if self._scatter[i]:
            total = sum(self.partition_sizes)
            whole = torch.zeros(self.world * total, dtype=torch.float32, device=bucket[0].device)
            mine = []
            for owner, runs in self._runs[i]:
                for p, pc in runs:
                    at = self._group_start[pc.group] + pc.offset
                    whole[owner * total + at:owner * total + at + pc.length].copy_(
                        grads[p].reshape(-1)[pc.start:pc.start + pc.length])
                    if owner == self.rank:
                        mine.append((pc, at))
            buffer = whole.new_empty(total)
            self._work[i].append((dist.reduce_scatter_tensor(buffer, whole, group=self.group, async_op=True), whole))
            self._mine[i] = (buffer, mine)
        for owner, runs in ([] if self._scatter[i] else self._runs[i]):
            buffer = torch.cat([grads[p].reshape(-1)[pc.start:pc.start + pc.length].float() for p, pc in runs])
            # the buffer is kept alive with its work until finish(); only the owner's is read
            self._work[i].append((dist.reduce(buffer, dst=self.ranks[owner], group=self.group, async_op=True), buffer))
            if owner == self.rank:
                starts = accumulate((pc.length for _, pc in runs), initial=0)
                self._mine[i] = (buffer, [(pc, at) for (_, pc), at in zip(runs, starts)])
        for p in bucket:  # the reduced copies are the gradient now: no second copy lives on
            p.grad = None  # through the rest of the backward
        self._next = i + 1

    def finish(self) -> int:
        """Issue what the backward did not (in order), wait for every bucket, and replace each fully
        reduced gradient by its average over the group (owned runs: ``received``). Returns how
        many buckets the backward issued."""
        while self._next < len(self.buckets):
            self._issue(self._next)
        self.received = []
        for i in range(len(self.buckets)):
            for work, _ in self._work[i]:
                work.wait()
            flat = self._flat[i]
            if flat is not None:
                flat.div_(self.world)
                offset = 0
                for p, dtype in zip(self._full[i], self._dtypes[i]):
                    averaged = flat[offset:offset + p.numel()].view_as(p)  # a view: no copy for fp32
                    p.grad = averaged if dtype == flat.dtype else averaged.to(dtype)
                    offset += p.numel()
            if self._mine[i] is not None:
                buffer, pieces = self._mine[i]
                buffer.div_(self.world)
                self.received.extend((pc, buffer[at:at + pc.length]) for pc, at in pieces)
        issued_in_backward = self._issued_in_backward
        self._reset()
        return issued_in_backward
