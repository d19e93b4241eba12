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


def test_slurm_time_limits_in_seconds():
    """sbatch(1)'s --time forms; the launch refuses a limit inside the stop signal's lead."""
    from hybridpar.launch.scripts import SLURM_TIME, slurm_seconds

    forms = {"90": 5400, "5:30": 330, "48:00:00": 172800, "2-00:00:00": 172800, "1-12": 129600, "1-12:30": 131400,
             "0-0:5:1": 301, "UNLIMITED": None, "infinite": None}
    for text, seconds in forms.items():
        assert SLURM_TIME.fullmatch(text) and slurm_seconds(text) == seconds, text
    for bad in ("two days", "1:2:3:4", "-5", "1-", "48h"):
        assert not SLURM_TIME.fullmatch(bad), bad
