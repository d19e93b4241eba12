"""Rank layout properties, up to 16,384 ranks, no processes."""
import pytest

from hybridpar.topology.layout import LayoutError, NodeMap, RankLayout

LAYOUTS = [
    dict(tp=1, pp=1, dp=1),
    dict(tp=2, pp=2, dp=2),
    dict(tp=4, pp=2, dp=1),
    dict(tp=2, cp=2, pp=2, dp=3),
    dict(tp=8, pp=4, dp=4),
    dict(tp=8, cp=2, pp=4, dp=8),
    dict(tp=8, pp=16, dp=128),  # Llama 3 405B on 16,384 H100s
    dict(tp=8, cp=16, pp=16, dp=8),  # Llama 3 405B long context
]
ORDERS = ["tp-cp-pp-dp", "tp-cp-dp-pp"]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("sizes", LAYOUTS, ids=lambda s: "x".join(f"{k}{v}" for k, v in s.items()))
def test_groups_partition_world_and_coords_round_trip(sizes, order):
    layout = RankLayout(**sizes, order=order)
    world = layout.world_size
    all_groups = layout.all_groups()
    for kind, groups in all_groups.items():
        members = sorted(r for g in groups for r in g)
        if kind == "embedding":  # first and last stages only, each rank at most once
            ends = {0, layout.pp - 1}
            assert members == [r for r in range(world) if layout.coord(r).pp in ends]
        else:
            assert members == list(range(world)), kind
    expected = {"tp": layout.tp, "cp": layout.cp, "pp": layout.pp, "dp": layout.dp,
                "mp": layout.tp * layout.cp * layout.pp, "dp_cp": layout.dp * layout.cp}
    for kind, size in expected.items():
        assert {len(g) for g in all_groups[kind]} == {size}, kind
    for rank in range(0, world, max(1, world // 997)):
        c = layout.coord(rank)
        assert layout.rank(dp=c.dp, pp=c.pp, cp=c.cp, tp=c.tp) == rank
        for kind in ("tp", "pp", "dp", "mp", "embedding"):
            assert rank in layout.group_of(rank, kind) or kind == "embedding"
    # a group varies only its own axis
    for g in layout.groups("dp")[:50]:
        coords = [layout.coord(r) for r in g]
        assert len({(c.pp, c.cp, c.tp) for c in coords}) == 1
        assert sorted(c.dp for c in coords) == list(range(layout.dp))


@pytest.mark.parametrize("sizes", LAYOUTS, ids=lambda s: "x".join(f"{k}{v}" for k, v in s.items()))
def test_dp_outermost_replicas_are_contiguous_and_tp_stays_in_node(sizes):
    layout = RankLayout(**sizes)
    replica = layout.model_parallel_size
    for group in layout.groups("tp-cp-pp"):
        assert group == list(range(group[0], group[0] + replica))
        assert group[0] % replica == 0
    nodes = NodeMap(layout, gpus_per_node=8)
    if layout.tp <= 8:
        assert not any(nodes.crosses_nodes(g) for g in layout.groups("tp"))
    if replica % 8 == 0:  # whole nodes per replica: no node is shared by two replicas
        spans = nodes.replica_nodes()
        assert sum(len(s) for s in spans) == nodes.num_nodes


def test_embedding_group_is_first_and_last_stage():
    layout = RankLayout(tp=2, pp=4, dp=2)
    for group, pipeline in zip(layout.embedding_groups(), layout.groups("pp")):
        assert group == [pipeline[0], pipeline[-1]]
        assert layout.coord(group[0]).pp == 0 and layout.coord(group[1]).pp == 3
    assert RankLayout(tp=2, pp=1, dp=2).embedding_groups() == [[0], [1], [2], [3]]


def test_megatron_default_order_puts_pp_outermost():
    layout = RankLayout(tp=2, pp=2, dp=2, order="tp-cp-dp-pp")
    assert layout.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    dp_out = RankLayout(tp=2, pp=2, dp=2)
    assert dp_out.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert dp_out.groups("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]


@pytest.mark.parametrize("sizes", LAYOUTS[:6], ids=str)
@pytest.mark.parametrize("order", ORDERS)
def test_groups_equal_megatron_rank_generator(sizes, order):
    """Golden check against megatron-core's own pure rank generator (same order strings)."""
    rank_utils = pytest.importorskip("megatron.core.parallel_state")
    layout = RankLayout(**sizes, order=order)
    gen = rank_utils.RankGenerator(tp=layout.tp, ep=1, dp=layout.dp, pp=layout.pp, cp=layout.cp,
                                   order=order.replace("tp-cp-", "tp-cp-ep-"))
    for ours, theirs in [("tp", "tp"), ("cp", "cp"), ("pp", "pp"), ("dp", "dp"), ("cp-dp", "dp-cp"),
                         ("tp-cp-pp", "tp-cp-pp"), ("tp-pp", "tp-pp")]:
        assert sorted(map(sorted, gen.get_ranks(theirs))) == layout.groups(ours), ours


def test_bad_layouts_are_refused():
    with pytest.raises(LayoutError):
        RankLayout(tp=0)
    with pytest.raises(LayoutError):
        RankLayout(order="dp-tp")
    with pytest.raises(LayoutError):
        RankLayout(tp=2).coord(2)
    with pytest.raises(LayoutError):
        NodeMap(RankLayout(tp=3, dp=3), gpus_per_node=8)
