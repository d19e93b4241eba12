"""Which DP rank steps which gradient element under DeepSpeed's ZeRO-1/2, and handing DeepSpeed
its averaged partition.

DeepSpeed flattens each optimizer parameter group in order (with its per-parameter alignment
padding, ``round_robin_bit16_offsets``) and cuts the flat buffer into DP (x CP) equal partitions;
rank r of the DP group steps partition r. ``partition_pieces`` maps every parameter to the runs of
its elements each rank owns (``Piece``). ``grad_sync`` reduces each run to its owner only (a
``dist.reduce`` per owner and bucket: the bytes of a reduce-scatter, half those of an all-reduce),
and ``PartitionHandOff`` writes what this rank received into one flat fp32 partition per group
and hands it to DeepSpeed's step (``compat.deepspeed.install_averaged_partition``), so
DeepSpeed's own gradient bucketing and copies are skipped. DeepSpeed's norm,
clipping, AdamW step and weight all-gather are unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from hybridpar.compat import deepspeed as deepspeed_compat


@dataclass(frozen=True, eq=False)
class Piece:
    """A run of one parameter's (flattened) gradient that one DP rank steps."""
    start: int   # first element in the parameter
    length: int
    owner: int   # rank in the DP (x CP) group
    group: int   # DeepSpeed parameter group
    offset: int  # first element in the owner's flat partition of that group


def partition_pieces(opt) -> dict:
    """{parameter: [Piece, ...]} for a DeepSpeed ZeRO-1/2 optimizer."""
    pieces, sizes = {}, deepspeed_compat.partition_sizes(opt)
    for p, (i, _, first) in deepspeed_compat.flat_positions(opt).items():
        size = sizes[i]
        runs, at, end = [], first, first + p.numel()
        while at < end:
            owner = at // size
            stop = min(end, (owner + 1) * size)
            runs.append(Piece(start=at - first, length=stop - at, owner=owner, group=i, offset=at - owner * size))
            at = stop
        pieces[p] = runs
    return pieces


class PartitionHandOff:
    """Builds this rank's flat averaged-gradient partitions and installs them in DeepSpeed."""

    def __init__(self, opt, group):
        self.opt = opt
        ranks = dist.get_process_group_ranks(group)
        for dp_group in deepspeed_compat.dp_groups(opt):
            if dist.get_process_group_ranks(dp_group) != ranks:
                raise RuntimeError("DeepSpeed's DP group differs from the gradient-reduction group")
        self.rank = dist.get_rank(group)
        self.partition_sizes = deepspeed_compat.partition_sizes(opt)
        self.pieces = partition_pieces(opt)
        self._mine = {p: [pc for pc in runs if pc.owner == self.rank] for p, runs in self.pieces.items()}

    def install(self, received, full_params) -> None:
        """``received``: (Piece, averaged tensor) pairs this rank owns; ``full_params``: parameters
        whose averaged gradient is whole in ``p.grad`` (reduced in full) — their owned runs are cut
        from it."""
        opt = self.opt
        device = deepspeed_compat.device(opt)
        flats = [torch.zeros(size, dtype=torch.float32, device=device) for size in deepspeed_compat.partition_sizes(opt)]
        for piece, data in received:
            flats[piece.group][piece.offset:piece.offset + piece.length].copy_(data)
        for p in full_params:
            if p.grad is None:
                continue
            g = p.grad.reshape(-1)
            for pc in self._mine[p]:
                flats[pc.group][pc.offset:pc.offset + pc.length].copy_(g[pc.start:pc.start + pc.length])
        for i, params in enumerate(deepspeed_compat.params_in_partition(opt)):
            slices = [flats[i][pc.offset:pc.offset + pc.length]
                      for p in params for pc in self._mine[p] if pc.group == i]
            deepspeed_compat.install_averaged_partition(opt, i, slices, flats[i])
