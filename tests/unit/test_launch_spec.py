"""The launch spec places whole DP replicas on nodes, DP outermost (hybridpar/launch/scripts.py; the
`hybridpar launch` command: tests/integration/test_launch.py)."""
from hybridpar.launch.scripts import LaunchSpec
from hybridpar.topology.layout import RankLayout


def test_nodes_hold_whole_replicas_with_dp_outermost():
    layout = RankLayout(tp=8, pp=2, dp=4)  # a replica spans 2 nodes of 8
    spec = LaunchSpec(recipe="r.yaml", nodes=8, gpus_per_node=8, layout=layout)
    assert [spec.replicas_on_node(n) for n in range(8)] == [[0], [0], [1], [1], [2], [2], [3], [3]]
    small = LaunchSpec(recipe="r.yaml", nodes=2, gpus_per_node=8, layout=RankLayout(tp=2, pp=2, dp=4))
    assert [small.replicas_on_node(n) for n in range(2)] == [[0, 1], [2, 3]]
