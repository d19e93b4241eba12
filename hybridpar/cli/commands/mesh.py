"""`hybridpar mesh`: print a rank layout, which groups stay inside a node, and one rank's groups."""
from __future__ import annotations

from hybridpar.topology.layout import DEFAULT_ORDER, ORDERS, NodeMap, RankLayout

from hybridpar.errors import UsageError

HELP = "print the rank layout: nodes per DP replica, groups per axis, one rank's groups"

GROUP_KINDS = ("tp", "cp", "pp", "dp", "mp", "embedding")
# Every group of every axis is listed to find which cross nodes: about 30 s at this size on one core,
# and no cluster is larger. A world beyond it is a typo in the sizes, not a layout to print.
MAX_WORLD = 2**20


def add_arguments(p):
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size")
    p.add_argument("--cp", type=int, default=1, help="context-parallel size")
    p.add_argument("--dp", type=int, default=1, help="data-parallel size (number of replicas)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8): how ranks fill nodes")
    p.add_argument("--order", default=DEFAULT_ORDER, choices=list(ORDERS), help="axes, innermost first")
    p.add_argument("--rank", type=int, help="also print the groups of this global rank")
    p.add_argument("--max-replicas", type=int, default=8, help="replicas listed before eliding")


def _span(nodes: list[int]) -> str:
    if len(nodes) == 1:
        return f"node {nodes[0]}"
    if nodes == list(range(nodes[0], nodes[-1] + 1)):
        return f"nodes {nodes[0]}-{nodes[-1]}"
    if len(nodes) <= 6:
        return "nodes " + ",".join(map(str, nodes))
    return f"{len(nodes)} nodes ({nodes[0]}, {nodes[1]}, ..., {nodes[-1]})"


def run(args) -> int:
    for key in ("tp", "pp", "cp", "dp", "gpus_per_node", "max_replicas"):
        if getattr(args, key) < 1:
            raise UsageError(f"--{key.replace('_', '-')} must be a positive integer, got {getattr(args, key)}")
    layout = RankLayout(tp=args.tp, cp=args.cp, pp=args.pp, dp=args.dp, order=args.order)
    world = layout.world_size
    if world > MAX_WORLD:
        raise UsageError(f"world size {world:,} (tp x cp x pp x dp) is above the {MAX_WORLD:,} ranks mesh lays out; "
                         f"check --tp, --cp, --pp and --dp")
    if world > args.gpus_per_node and world % args.gpus_per_node:
        raise UsageError(
            f"world size {world} (tp x cp x pp x dp) is not a multiple of --gpus-per-node {args.gpus_per_node}"
        )
    if args.rank is not None and not 0 <= args.rank < world:
        raise UsageError(f"--rank {args.rank} outside the world of {world} ranks (0..{world - 1})")
    nodes = NodeMap(layout, args.gpus_per_node)
    print(
        f"world {world} = tp {args.tp} x cp {args.cp} x pp {args.pp} x dp {args.dp} on {nodes.num_nodes} "
        f"node(s) of {args.gpus_per_node} GPUs; order {args.order} (innermost first): {ORDERS[args.order]}"
    )
    print("\nDP replicas (each a full model of tp x cp x pp ranks):")
    spans = nodes.replica_nodes()
    mp_groups = layout.groups("tp-cp-pp")
    shown = spans if len(spans) <= args.max_replicas else spans[: args.max_replicas - 1]
    for d, span in enumerate(shown):
        group = next(g for g in mp_groups if layout.coord(g[0]).dp == d)
        contiguous = group == list(range(group[0], group[0] + len(group)))
        ranks = f"ranks {group[0]}-{group[-1]}" if contiguous else f"ranks {group[0]},{group[1]},..."
        print(f"  replica {d:>5}: {ranks:<22} {_span(span)}")
    if len(spans) > len(shown):
        print(f"  ... {len(spans) - len(shown) - 1} more ...")
        last = len(spans) - 1
        print(f"  replica {last:>5}: {_span(spans[last])}")
    print("\nGroups per axis:")
    all_groups = layout.all_groups()
    for kind in GROUP_KINDS:
        groups = all_groups[kind]
        crossing = sum(nodes.crosses_nodes(g) for g in groups)
        where = "all inside a node" if crossing == 0 else (
            "all cross nodes" if crossing == len(groups) else f"{crossing} cross nodes"
        )
        print(f"  {kind:<10} {len(groups):>6} groups of {len(groups[0]):>5}  {where:<20} e.g. {_preview(groups[0])}")
    if args.rank is not None:
        c = layout.coord(args.rank)
        print(f"\nRank {args.rank}: dp={c.dp} pp={c.pp} cp={c.cp} tp={c.tp} on node {nodes.node(args.rank)}")
        for kind in GROUP_KINDS:
            group = layout.group_of(args.rank, kind)
            print(f"  {kind:<10} {_preview(group, 16)}  ({_span(nodes.nodes_of(group))})")
    return 0


def _preview(ranks: list[int], limit: int = 8) -> str:
    if len(ranks) <= limit:
        return "[" + ", ".join(map(str, ranks)) + "]"
    head = ", ".join(map(str, ranks[: limit - 2]))
    return f"[{head}, ..., {ranks[-1]}]"
