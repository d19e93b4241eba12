"""Freeing the process groups of one job before a worker builds the next (workers that run many
layouts in one launch: runtime_worker.py, checkpoint_worker.py).

Job.close() (Mesh.destroy) only forgets megatron-core's globals; torch keeps every group until the
world goes. On gloo each group holds a TCP device loop and two worker threads per rank, and
megatron creates 17 groups per rank per layout, so runtime_worker's 22 layouts left 600-1100
threads per rank: the later layouts ran 2-7x slower than alone and the final
destroy_process_group took about a minute.
"""
from __future__ import annotations

import gc
import os

import torch.distributed as dist

from hybridpar.compat.torch import process_groups


def groups_now() -> set:
    """Every process group this rank holds now (pass to destroy_groups_created_since)."""
    return process_groups()


def destroy_groups_created_since(before: set) -> int:
    """Destroy the groups created since ``groups_now()`` returned ``before``; returns how many.
    Collective over the world: a barrier first, so that no rank is still in a collective on one."""
    dist.barrier()
    created = [pg for pg in groups_now() - before if pg is not dist.GroupMember.WORLD]
    count = len(created)
    while created:
        dist.destroy_process_group(created.pop())
    while gc.collect():  # the threads end with the group object, which the job's objects hold in cycles
        pass
    return count


def thread_count() -> int:
    """This process's threads (Linux), -1 where /proc is missing."""
    path = f"/proc/{os.getpid()}/task"
    return len(os.listdir(path)) if os.path.isdir(path) else -1
