"""The planner's kernels per layer (topology/software/profile.py kernels_per_layer, which kernels.kernel_bound
charges) are the operations megatron-core's layer as hybridpar builds it runs, counted on CPU
(hybridpar/observe/kernel_count.py): exactly, at two hidden sizes and two sequence lengths (the
count is the code's, not the shape's). With TP the layer adds its collectives, one call each."""
from __future__ import annotations

import pytest
from multirank import run_probe

from hybridpar.topology.software import HYBRIDPAR

PROBE = """
import json, sys
from dataclasses import replace
from hybridpar.observe.kernel_count import layer_operations
from hybridpar.topology.models import PRESETS
rows = []
for hidden, ffn, heads, kv, tp, seq in json.loads(sys.argv[1]):
    spec = replace(PRESETS["llama3-8b"], hidden=hidden, ffn_hidden=ffn, heads=heads, kv_heads=kv)
    rows.append([hidden, tp, seq, *layer_operations(spec, tp, seq)])
print(json.dumps(rows))
"""
CASES = [(512, 1792, 8, 2, 1, 64), (1024, 3584, 16, 4, 1, 128), (512, 1792, 8, 2, 2, 64)]


@pytest.fixture(scope="module")
def counted():
    return run_probe(PROBE, CASES)


def test_the_planners_count_is_the_layers(counted):
    tp1 = [(fwd, bwd) for hidden, tp, seq, fwd, bwd in counted if tp == 1]
    assert set(tp1) == {HYBRIDPAR.kernels_per_layer}


def test_tensor_parallel_adds_its_collectives(counted):
    (fwd, bwd), = [(f, b) for hidden, tp, seq, f, b in counted if tp == 2]
    base_fwd, base_bwd = HYBRIDPAR.kernels_per_layer
    # sequence parallelism: forward 2 all-gathers and 2 reduce-scatters, one copy fewer (without TP
    # the layer clones a tensor that SP's all-gather already gives it new); backward 4 all-gathers
    # (2 of them the column-parallel inputs gathered again) and 2 reduce-scatters (topology/cost.py)
    assert (fwd - base_fwd, bwd - base_bwd) == (4 - 1, 4 + 2)
