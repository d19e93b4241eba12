"""Data-parallel gradient reduction overlapped with the last backward pass.

Gradients accumulate locally over a step's micro-batches. During the backward pass of each
model chunk's last micro-batch, every parameter's gradient is final as soon as autograd has
accumulated it (``register_post_accumulate_grad_hook``); the parameters are grouped in buckets
in backward order (reverse registration order), and a bucket's all-reduce over the DP (x CP)
group is issued asynchronously the moment its last gradient lands, while the backward pass
goes on through earlier layers. The bucket's flat fp32 copy then replaces the parameters'
gradients (``p.grad`` is dropped), so the backward never holds two copies of a gradient;
``finish()`` waits for the reductions and hands each parameter a view of its averaged slice.
This is megatron-core's ``overlap_grad_reduce`` and torch DDP's bucketing.

Which backward is the last is megatron's to say: its schedules call ``config.no_sync_func``
around every micro-batch but a chunk's last one (``no_sync``). Buckets are issued strictly in
order, so every rank of the group issues the same collectives in the same order whatever the
order their gradients arrive in. Reductions run in fp32 (DeepSpeed's
``communication_data_type`` here): sum, then divide by the group size.

DeepSpeed's own reduction of the same gradients is switched off by the engine (engine.py
``_hand_dp_reduction_to_grad_sync``); its ZeRO partitioning, norm, clipping and step are
unchanged and read the already averaged gradients.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

# The bucket the planner assumes (topology/cost.py): megatron-core's default, 40M elements.
from topology.cost import GRAD_BUCKET_NUMEL as DEFAULT_BUCKET_NUMEL


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
    def __init__(self, params: list, group, bucket_numel: int = DEFAULT_BUCKET_NUMEL):
        self.group = group
        self.world = dist.get_world_size(group)
        self.buckets = bucket_params(list(reversed(params)), bucket_numel)
        self._bucket_of = {p: i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.enabled = True  # megatron's schedule turns it off for all but a chunk's last micro-batch
        self._reset()
        for p in params:  # the hooks live as long as the parameters
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def _reset(self) -> None:
        self._ready = [set() for _ in self.buckets]
        self._work: list = [None] * len(self.buckets)
        self._flat: list = [None] * len(self.buckets)
        self._dtypes: list = [None] * len(self.buckets)
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
        grads = []
        for p in self.buckets[i]:
            # No gradient this step on this rank: it contributes zeros.
            g = p.grad if p.grad is not None else torch.zeros_like(p, dtype=getattr(p, "grad_dtype", None) or p.dtype)
            grads.append(g)
        self._dtypes[i] = [g.dtype for g in grads]
        self._flat[i] = flat = torch.cat([g.reshape(-1).float() for g in grads])
        for p in self.buckets[i]:  # the flat copy is the gradient now: no second copy lives on
            p.grad = None          # through the rest of the backward
        self._work[i] = dist.all_reduce(flat, group=self.group, async_op=True)
        self._next = i + 1

    def finish(self) -> int:
        """Issue what the backward did not (in order), wait for every bucket, and replace each
        gradient by its average over the group. Returns how many buckets the backward issued."""
        while self._next < len(self.buckets):
            self._issue(self._next)
        for bucket, work, flat, dtypes in zip(self.buckets, self._work, self._flat, self._dtypes):
            work.wait()
            flat.div_(self.world)
            offset = 0
            for p, dtype in zip(bucket, dtypes):
                averaged = flat[offset:offset + p.numel()].view_as(p)  # a view: no copy for fp32
                p.grad = averaged if dtype == flat.dtype else averaged.to(dtype)
                offset += p.numel()
        issued_in_backward = self._issued_in_backward
        self._reset()
        return issued_in_backward
