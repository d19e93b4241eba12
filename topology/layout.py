"""Rank layout: global rank <-> (dp, pp, cp, tp) coordinates, and the process groups of each axis.

The order is named innermost axis first, as in Megatron-Core and the Llama 3 paper:

* ``tp-cp-pp-dp`` (default, "DP outermost", Llama 3's [TP, CP, PP, DP]): TP on consecutive ranks
  inside a node, and each DP replica (a whole TP x CP x PP model) on a contiguous block of
  ranks, hence of nodes. A replica's pipeline traffic stays inside its own nodes; only the
  once-per-step gradient reduction of the DP axis crosses replicas.
* ``tp-cp-dp-pp`` (Megatron-Core's default, "PP outermost"): each pipeline stage is a
  contiguous block holding that stage for every replica. DP gradient traffic stays inside
  the stage's block (often inside a node for small DP), but every replica spans every block,
  so the per-micro-batch pipeline sends cross the wide network.

Pure arithmetic, no processes: a rank is ``sum(coord[axis] * stride[axis])`` where an axis'
stride is the product of the sizes of the axes inside it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import product

AXES = ("tp", "cp", "pp", "dp")
ORDERS = {
    "tp-cp-pp-dp": "DP outermost (Llama 3): each replica is a contiguous block of nodes",
    "tp-cp-dp-pp": "PP outermost (Megatron-Core default): each stage is a contiguous block",
}
DEFAULT_ORDER = "tp-cp-pp-dp"


class LayoutError(ValueError):
    """An impossible layout (sizes, order or rank out of range)."""


@dataclass(frozen=True)
class Coord:
    dp: int
    pp: int
    cp: int
    tp: int


@dataclass(frozen=True)
class RankLayout:
    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 1
    order: str = DEFAULT_ORDER

    def __post_init__(self):
        for axis in AXES:
            size = getattr(self, axis)
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise LayoutError(f"{axis} must be a positive integer, got {size!r}")
        if self.order not in ORDERS:
            raise LayoutError(f"unknown rank order {self.order!r}; choose one of {', '.join(ORDERS)}")

    # --- sizes and strides -------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.cp * self.pp

    def size(self, axis: str) -> int:
        return getattr(self, axis)

    @cached_property
    def _strides(self) -> dict[str, int]:
        strides, stride = {}, 1
        for axis in self.order.split("-"):
            strides[axis] = stride
            stride *= self.size(axis)
        return strides

    def stride(self, axis: str) -> int:
        if axis not in self._strides:
            raise LayoutError(f"unknown axis {axis!r}")
        return self._strides[axis]

    # --- rank <-> coordinates ----------------------------------------------------------
    def coord(self, rank: int) -> Coord:
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} outside world of size {self.world_size}")
        return Coord(**{axis: (rank // self.stride(axis)) % self.size(axis) for axis in AXES})

    def rank(self, dp: int = 0, pp: int = 0, cp: int = 0, tp: int = 0) -> int:
        coord = {"dp": dp, "pp": pp, "cp": cp, "tp": tp}
        for axis, value in coord.items():
            if not 0 <= value < self.size(axis):
                raise LayoutError(f"{axis} coordinate {value} outside 0..{self.size(axis) - 1}")
        strides = self._strides
        return dp * strides["dp"] + pp * strides["pp"] + cp * strides["cp"] + tp * strides["tp"]

    # --- groups ----------------------------------------------------------------------
    def groups(self, axes: str) -> list[list[int]]:
        """Groups whose members differ only along ``axes`` (e.g. "dp", "tp-cp-pp").

        Each group lists its ranks in increasing order of the varying coordinates (innermost
        axis fastest); groups are sorted by their first rank. Every rank is in exactly one group.
        """
        varying = [a for a in self.order.split("-") if a in axes.split("-")]
        if not varying or len(varying) != len(axes.split("-")):
            raise LayoutError(f"unknown axes {axes!r}; use names from {AXES}")
        fixed = [a for a in AXES if a not in varying]
        result = []
        for fixed_values in product(*(range(self.size(a)) for a in fixed)):
            base = dict(zip(fixed, fixed_values))
            members = []
            # Iterate the outermost varying axis slowest so ranks come out ascending.
            for values in product(*(range(self.size(a)) for a in reversed(varying))):
                coord = dict(base, **dict(zip(reversed(varying), values)))
                members.append(self.rank(**coord))
            result.append(members)
        result.sort(key=lambda g: g[0])
        return result

    def embedding_groups(self) -> list[list[int]]:
        """First and last pipeline stage of every pipeline (one rank when pp == 1)."""
        return [sorted({g[0], g[-1]}) for g in self.pp_groups_by_stage()]

    def pp_groups_by_stage(self) -> list[list[int]]:
        """Pipeline groups with members in stage order (stage 0 first)."""
        return self.groups("pp")

    def all_groups(self) -> dict[str, list[list[int]]]:
        """Every communicator the runtime creates, in the one order all ranks create them."""
        return {
            "tp": self.groups("tp"),
            "cp": self.groups("cp"),
            "pp": self.groups("pp"),
            "dp": self.groups("dp"),
            "dp_cp": self.groups("cp-dp"),
            "mp": self.groups("tp-cp-pp"),
            "tp_pp": self.groups("tp-pp"),
            "embedding": self.embedding_groups(),
        }

    def group_of(self, rank: int, kind: str) -> list[int]:
        coord = self.coord(rank)
        if kind == "embedding":
            pipeline = self.group_of(rank, "pp")
            return sorted({pipeline[0], pipeline[-1]})
        axes = {"dp_cp": "cp-dp", "mp": "tp-cp-pp", "tp_pp": "tp-pp"}.get(kind, kind)
        varying = axes.split("-")
        fixed = {a: getattr(coord, a) for a in AXES if a not in varying}
        members = []
        for values in product(*(range(self.size(a)) for a in varying)):
            members.append(self.rank(**fixed, **dict(zip(varying, values))))
        return sorted(members)


@dataclass(frozen=True)
class NodeMap:
    """Where ranks sit on nodes: rank r is on node r // gpus_per_node (torchrun's convention)."""

    layout: RankLayout
    gpus_per_node: int = 8

    def __post_init__(self):
        if self.gpus_per_node < 1:
            raise LayoutError(f"gpus-per-node must be positive, got {self.gpus_per_node}")
        if self.layout.world_size % self.gpus_per_node and self.layout.world_size > self.gpus_per_node:
            raise LayoutError(
                f"world size {self.layout.world_size} is not a multiple of {self.gpus_per_node} GPUs per node"
            )

    @property
    def num_nodes(self) -> int:
        return max(1, -(-self.layout.world_size // self.gpus_per_node))

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def nodes_of(self, ranks) -> list[int]:
        return sorted({self.node(r) for r in ranks})

    def crosses_nodes(self, ranks) -> bool:
        return len(self.nodes_of(ranks)) > 1

    def replica_nodes(self) -> list[list[int]]:
        """Nodes spanned by each DP replica (the replica's model-parallel group)."""
        replicas = {}
        for group in self.layout.groups("tp-cp-pp"):
            replicas[self.layout.coord(group[0]).dp] = self.nodes_of(group)
        return [replicas[d] for d in range(self.layout.dp)]
