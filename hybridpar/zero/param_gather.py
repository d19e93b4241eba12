"""ZeRO-1/2: the gather of the updated weights, overlapped with the next step's forward.

DeepSpeed's ZeRO-1/2 step ends by all-gathering each parameter group's flat 16-bit weights from
the DP (x CP) ranks that updated them, before ``engine.step()`` returns: the whole transfer is
exposed. With ``DeferredParamGather`` (megatron-core's ``overlap_param_gather``) DeepSpeed's
gather is skipped during hybridpar's step, and the same bytes move afterwards, bucket by bucket
in forward order: a bucket's parameters fill one contiguous range of each group's flat buffer,
and the part of that range rank r stepped (its DeepSpeed partition) is broadcast from r, in
place (a bucket that holds a whole group, as one bucket per stage does, is one in-place
all-gather of that group, DeepSpeed's own call; several whole groups in one bucket share one
all-gather). Nothing waits there; a forward pre-hook on every module that holds parameters waits for
that module's buckets, so the next forward runs its first layers while the later layers'
weights still travel.

Weights read anywhere but in the forward must be synced first (``wait_all``): ``Job.chunks``
does it for every reader outside the training step, and ``StageEngine.step`` before DeepSpeed
writes the next update.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

from hybridpar.compat import deepspeed as deepspeed_compat
from hybridpar.zero.grad_sync import bucket_params


class DeferredParamGather:
    def __init__(self, opt, chunks: list, params: list, group, bucket_numel: int):
        deepspeed_compat.allow_skipping_weight_gather()
        self.opt, self.group = opt, group
        self.ranks = dist.get_process_group_ranks(group)
        where = deepspeed_compat.flat_positions(opt)
        self.buckets = bucket_params(list(params), bucket_numel)  # registration order: forward order
        self._sends = [self._bucket_sends(bucket, where) for bucket in self.buckets]
        self._bucket_of = {p: b for b, bucket in enumerate(self.buckets) for p in bucket}
        self._work: list = [[] for _ in self.buckets]
        for chunk in chunks:
            for module in chunk.modules():
                own = {self._bucket_of[p] for p in module.parameters(recurse=False) if p in self._bucket_of}
                if own:
                    module.register_forward_pre_hook(self._pre_hook(sorted(own)))

    def _bucket_sends(self, bucket: list, where: dict) -> list[tuple[int, int, int, int | None]]:
        """(group, start, stop, owner) ranges of the flat buffers to broadcast for one bucket;
        owner None: the bucket holds the whole group, gathered by one all-gather as DeepSpeed does."""
        spans: dict = {}  # group -> (first index, last index, start, stop)
        for p in bucket:
            i, k, offset = where[p]
            first, last, start, stop = spans.get(i, (k, k, offset, offset + p.numel()))
            spans[i] = (min(first, k), max(last, k), min(start, offset), max(stop, offset + p.numel()))
        sends, sizes, lengths = [], deepspeed_compat.partition_sizes(self.opt), deepspeed_compat.group_lengths(self.opt)
        for i, (first, last, start, stop) in sorted(spans.items()):
            members = sum(1 for p in bucket if where[p][0] == i)
            if last - first + 1 != members:  # DeepSpeed's group order is not the parameters' order
                raise RuntimeError("a bucket's parameters are not contiguous in DeepSpeed's flat buffer")
            size = sizes[i]
            if members == lengths[i]:
                sends.append((i, 0, deepspeed_compat.flat_weights(self.opt)[i].numel(), None))
                continue
            owner = start // size
            while owner * size < stop:
                sends.append((i, max(start, owner * size), min(stop, (owner + 1) * size), owner))
                owner += 1
        return sends

    @property
    def pending(self) -> bool:
        return any(self._work)

    @contextmanager
    def deferring(self):
        """Around DeepSpeed's step: its weight all-gather is left to ``issue()``."""
        with deepspeed_compat.weight_gather_skipped(self.opt):
            yield

    def issue(self) -> None:
        """After DeepSpeed's step: every owner's updated range, broadcast in place, in forward order."""
        flats, me = deepspeed_compat.flat_weights(self.opt), dist.get_rank(self.group)
        sizes = deepspeed_compat.partition_sizes(self.opt)
        for b, sends in enumerate(self._sends):
            works = []
            whole = [i for i, _, _, owner in sends if owner is None]
            if len(whole) > 1:  # several whole groups: one all-gather for all of them
                works.append(_PackedGather([flats[i] for i in whole], [sizes[i] for i in whole],
                                           me, len(self.ranks), self.group))
            elif whole:  # in place: this rank's partition is a view of the output
                size = sizes[whole[0]]
                mine = flats[whole[0]][me * size:(me + 1) * size]
                works.append(dist.all_gather_into_tensor(flats[whole[0]], mine, group=self.group, async_op=True))
            for i, start, stop, owner in sends:
                if owner is not None:
                    works.append(dist.broadcast(flats[i][start:stop], src=self.ranks[owner], group=self.group,
                                                async_op=True))
            self._work[b] = works

    def wait(self, buckets) -> None:
        for b in buckets:
            for work in self._work[b]:
                work.wait()
            self._work[b] = []

    def wait_all(self) -> None:
        self.wait(range(len(self.buckets)))

    def _pre_hook(self, buckets: list[int]):
        def hook(module, args):
            self.wait(buckets)  # only this module's buckets: nothing to do once they arrived
        return hook


class _PackedGather:
    """One all-gather for several whole flat buffers (DeepSpeed's parameter groups, each held by one
    bucket): this rank's partitions packed side by side, gathered, and copied out into each flat
    buffer's rank-ordered partitions when waited for. Costs one copy of the bucket's weights, which
    a bucket's size bounds."""

    def __init__(self, flats: list, sizes: list[int], me: int, world: int, group):
        self.flats, self.sizes, self.world = flats, sizes, world
        packed = torch.cat([flat[me * size:(me + 1) * size] for flat, size in zip(flats, sizes)])
        self.out = packed.new_empty(world * packed.numel())
        self.work = dist.all_gather_into_tensor(self.out, packed, group=group, async_op=True)

    def wait(self) -> None:
        if self.out is None:
            return
        self.work.wait()
        rows, offset = self.out.view(self.world, -1), 0
        for flat, size in zip(self.flats, self.sizes):
            flat.view(self.world, size).copy_(rows[:, offset:offset + size])
            offset += size
        self.out = None
