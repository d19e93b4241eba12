"""The planner's optimizer-step bytes for hybridpar's runtime (topology/software/profile.py HYBRIDPAR
optimizer_step_bytes_counted, which cost.optimizer_step_bytes charges at HBM bandwidth) are what
``StageEngine.step()`` moves, counted on CPU over every aten operation (hybridpar/observe/step_bytes.py):
ZeRO-0, 1 and 2 on one DP rank and over several, as rank 0 of a fake world. Per parameter of the shard,
within 0.5 bytes (weight decay skips the norms' weights, so the per-parameter figures are not integers)."""
from __future__ import annotations

import pytest
from multirank import run_probe

from hybridpar.topology.cost import optimizer_step_bytes
from hybridpar.topology.software import HYBRIDPAR, MEGATRON_CORE

PROBE = """
import json, sys
from hybridpar.observe.step_bytes import optimizer_step_traffic
print(json.dumps([[zero, dp, *optimizer_step_traffic(zero, dp)] for zero, dp in json.loads(sys.argv[1])]))
"""
CASES = [(0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2), (1, 4)]


@pytest.fixture(scope="module")
def counted():
    return {(zero, dp): (total, by_op) for zero, dp, total, by_op in run_probe(PROBE, CASES)}


def test_the_planners_step_bytes_are_the_runtimes(counted):
    for (zero, dp), (total, _) in counted.items():
        assert total == pytest.approx(optimizer_step_bytes(HYBRIDPAR, zero, dp), abs=0.5), (zero, dp)


def test_adamw_itself_is_one_pass_per_term(counted):
    """torch's AdamW, unfused: weight decay, the two moments, the square root, bias correction,
    epsilon and the update move 84 bytes per fp32 parameter; the rest of the step is DeepSpeed's."""
    _, by_op = counted[(1, 2)]
    weight_decay = variance_decay = epsilon = 8  # mul_, mul_ and add_ of one fp32 tensor in place
    adamw = sum(by_op[op] for op in ("lerp_", "addcmul_", "sqrt", "div", "addcdiv_"))
    assert adamw + weight_decay + variance_decay + epsilon == pytest.approx(84, abs=0.5)
    assert by_op["mul_"] == pytest.approx(3 * 8, abs=0.5)  # weight decay, the variance's decay, clipping


def test_other_stacks_keep_a_fused_adam():
    assert optimizer_step_bytes(MEGATRON_CORE, 1, 1) == optimizer_step_bytes(MEGATRON_CORE, 0, 64) == 30
