"""hybridpar/zero/grad_sync.py on its own (one process, gloo): buckets in backward order, nothing issued
inside megatron's no_sync, buckets issued strictly in order from the backward's gradient hooks
whatever order the gradients arrive in, no gradient held twice while its bucket is in flight,
and finish() leaves the averaged sums as views of the reduced buffer. Multi-rank
training through it: tests/integration/test_runtime.py (DeepSpeed's partition layout:
tests/unit/test_zero_partitions.py)."""
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
    # torch hides the hooks from the garbage collector: a model dropped with its hooks on is
    # never freed (a tolerant job rebuilds it at every loss and rejoin); unhooked, it is.
    assert r["params_freed"] == {"hooked": False, "unhooked": True}
