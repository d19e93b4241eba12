"""hybridpar/zero/grad_sync.py on its own (one process, gloo): buckets in backward order, nothing issued
inside megatron's no_sync, buckets issued strictly in order from the backward's gradient hooks
whatever order the gradients arrive in, no gradient held twice while its bucket is in flight,
and finish() leaves the averaged sums as views of the reduced buffer. Multi-rank
training through it: tests/test_runtime.py."""
from __future__ import annotations

from multirank import run_single_process_worker


def test_buckets_are_issued_in_order_from_the_last_backward(tmp_path):
    r = run_single_process_worker("grad_sync_worker.py", tmp_path / "grad_sync.json")
    assert r["buckets"] == [[4], [3], [2]]  # reverse registration order: the backward's order
    assert r["issued_inside_no_sync"] == []
    assert r["issued_after_a"] == []  # a's bucket is complete, but c's (first in order) is not
    assert r["issued_after_b"] == []
    assert r["issued_after_c"] == [4, 3, 2]  # c's completes the prefix: all three, in order
    assert r["grads_held_while_in_flight"] == [False] * 3  # the flat copy replaced them
    assert r["pending_before_finish"] is True and r["pending_after_finish"] is False
    assert r["issued_in_backward"] == 3
    # Two micro-batches accumulated: 1+1, 2+2, 3+3; the average over a world of one.
    assert r["grads"] == [[2.0] * 2, [4.0] * 3, [6.0] * 4]
    assert r["grads_are_views_of_the_reduced_buffer"] == [True] * 3  # fp32: no copy back


def test_partition_pieces_follow_deepspeeds_flat_layout():
    """Which DP rank steps which elements (hybridpar/zero/partitions.py), read from DeepSpeed's
    layout: parameters flattened in order with alignment padding after each, cut into equal
    partitions. Here 3 parameters of 5, 2 and 6 elements, each padded to a multiple of 4 but the
    last (offsets 0, 8, 12), 18 elements cut into 2 partitions of 9 (the last 0-padded)."""
    from types import SimpleNamespace

    import torch

    from hybridpar.zero.partitions import partition_pieces

    a, b, c = torch.zeros(5), torch.zeros(2), torch.zeros(2, 3)
    opt = SimpleNamespace(round_robin_bit16_groups=[[a, b, c]], round_robin_bit16_offsets=[[0, 8, 12]],
                          partition_size=[9])
    pieces = partition_pieces(opt)
    runs = {name: [(pc.start, pc.length, pc.owner, pc.offset) for pc in pieces[p]] for name, p in zip("abc", (a, b, c))}
    assert runs["a"] == [(0, 5, 0, 0)]                   # flat [0, 5): rank 0
    assert runs["b"] == [(0, 1, 0, 8), (1, 1, 1, 0)]     # flat [8, 10): cut by the partition edge at 9
    assert runs["c"] == [(0, 6, 1, 3)]                   # flat [12, 18): rank 1 at 3
    covered = sorted((pc.owner, pc.offset, pc.length) for runs_ in pieces.values() for pc in runs_)
    assert sum(length for _, _, length in covered) == 5 + 2 + 6  # every element exactly once
