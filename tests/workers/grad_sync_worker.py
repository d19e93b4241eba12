"""One-process worker for tests/integration/test_grad_sync.py: OverlappedGradReduction's bookkeeping on a
world of one (gloo), with real autograd hooks.

Usage: python tests/workers/grad_sync_worker.py OUT.json
Three parameters in three buckets; backward passes whose gradients arrive in a chosen order. The
all-reduces are recorded (which bucket, in which order, from the backward or from finish());
values are checked against the local sums (the average over a world of one).
"""
from __future__ import annotations

import gc
import os
import sys
import weakref

import torch
import torch.distributed as dist

sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # an installed hybridpar first

from hybridpar.zero import grad_sync  # noqa: E402
from results_io import run_alone  # noqa: E402


def compute() -> dict:
    issued = []
    real_all_reduce = dist.all_reduce

    def recording_all_reduce(tensor, group=None, async_op=False):
        issued.append(int(tensor.numel()))
        return real_all_reduce(tensor, group=group, async_op=async_op)

    grad_sync.dist.all_reduce = recording_all_reduce
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    a, b, c = (torch.nn.Parameter(torch.full((n,), 1.0, device=device)) for n in (2, 3, 4))
    sync = grad_sync.OverlappedGradReduction([a, b, c], dist.group.WORLD, bucket_numel=1)
    out = {"buckets": [[int(p.numel()) for p in bucket] for bucket in sync.buckets]}

    # Two micro-batches: the first inside no_sync (nothing issued), the second issues every bucket.
    with sync.no_sync():
        (a.sum() + 2 * b.sum() + 3 * c.sum()).backward()
    out["issued_inside_no_sync"] = list(issued)
    # Gradients arrive a first, then b, then c (reverse of the bucket order c, b, a): the first two
    # buckets to be complete are a's and b's, but nothing may be issued before c's bucket.
    loss = a.sum() + 2 * b.sum() + 3 * c.sum()
    torch.autograd.backward([loss], inputs=[a])
    out["issued_after_a"] = list(issued)
    torch.autograd.backward([a.sum() * 0 + 2 * b.sum()], inputs=[b])
    out["issued_after_b"] = list(issued)
    torch.autograd.backward([3 * c.sum()], inputs=[c])
    out["issued_after_c"] = list(issued)
    out["grads_held_while_in_flight"] = [p.grad is not None for p in (a, b, c)]
    out["pending_before_finish"] = sync.pending
    out["issued_in_backward"] = sync.finish()
    out["pending_after_finish"] = sync.pending
    out["grads"] = [p.grad.tolist() for p in (a, b, c)]
    out["grads_are_views_of_the_reduced_buffer"] = [p.grad._base is not None for p in (a, b, c)]
    grad_sync.dist.all_reduce = real_all_reduce
    out["params_freed"] = {"hooked": _freed_after_drop(remove_hooks=False), "unhooked": _freed_after_drop(remove_hooks=True)}
    return out


def _freed_after_drop(remove_hooks: bool) -> bool:
    """Whether a parameter under OverlappedGradReduction is freed once nothing of the model is held."""
    p = torch.nn.Parameter(torch.ones(2))
    sync = grad_sync.OverlappedGradReduction([p], dist.group.WORLD)
    if remove_hooks:
        sync.remove_hooks()
    alive = weakref.ref(p)
    del p, sync
    gc.collect()
    return alive() is None


if __name__ == "__main__":
    run_alone(compute)
