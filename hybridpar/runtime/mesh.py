"""The mesh: every process group of a job, created once, in one order, on every rank.

``Mesh.build(layout)`` is the only place in hybridpar that creates communicators. It calls
megatron-core's ``initialize_model_parallel`` exactly once with the layout's order
(``tp-cp-pp-dp`` -> megatron's ``tp-cp-ep-pp-dp``: DP outermost), so megatron's module
globals (read by its vocab-parallel cross-entropy, attention buffers and schedules) hold the
very groups the rest of hybridpar uses. megatron creates its groups in one deterministic order
on every rank (``torch.distributed.new_group`` is collective over the world); the mesh then
checks that each group's members equal what topology's ``RankLayout`` says, and refuses to run
otherwise. Everything else asks the mesh: ``mesh.group("dp")``, ``mesh.rank_in("tp")``, and
DeepSpeed gets ``mesh.deepspeed_mpu()``.

Group kinds (this rank's group of each): tp, cp, pp, dp, dp_cp (data parallel with the CP ranks,
over which ZeRO partitions and gradients are averaged), mp (megatron's model-parallel group,
tp x pp: the replica's distinct weight shards), embedding (first and last stage of this rank's
pipeline; none on middle stages).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hybridpar.compat import torch as torch_compat
from hybridpar.topology.layout import Coord, RankLayout

KINDS = ("tp", "cp", "pp", "dp", "dp_cp", "mp", "embedding")
# megatron's "model parallel" group is tp x pp (CP ranks hold the same weights, so megatron and
# DeepSpeed count them as data parallel): the layout calls that tp_pp, and its own "mp" (a whole
# replica, tp x cp x pp) is the same group only when cp = 1.
_LAYOUT_KIND = {"mp": "tp_pp"}
_MEGATRON_ORDER = {"tp-cp-pp-dp": "tp-cp-ep-pp-dp", "tp-cp-dp-pp": "tp-cp-ep-dp-pp"}


class MeshError(RuntimeError):
    """The process groups do not match the rank layout."""


def _megatron_groups(ps) -> dict:
    return {
        "tp": ps.get_tensor_model_parallel_group(),
        "cp": ps.get_context_parallel_group(),
        "pp": ps.get_pipeline_model_parallel_group(),
        "dp": ps.get_data_parallel_group(),
        "dp_cp": ps.get_data_parallel_group(with_context_parallel=True),
        "mp": ps.get_model_parallel_group(),
        "embedding": ps.get_embedding_group(check_initialized=False),
    }


@dataclass
class Mesh:
    layout: RankLayout
    rank: int
    vpp: int = 1
    groups: dict = field(default_factory=dict)  # kind -> this rank's ProcessGroup
    members: dict = field(default_factory=dict)  # kind -> this rank's group members (global ranks)

    # --- construction -------------------------------------------------------------
    @classmethod
    def build(cls, layout: RankLayout, vpp: int = 1) -> "Mesh":
        from megatron.core import parallel_state as ps

        from hybridpar.compat import megatron as megatron_compat

        if not dist.is_initialized():
            raise MeshError("torch.distributed is not initialized; call hybridpar.launch.init_distributed() first")
        if dist.get_world_size() != layout.world_size:
            raise MeshError(
                f"world size {dist.get_world_size()} != tp x cp x pp x dp = {layout.world_size}"
            )
        if ps.model_parallel_is_initialized():
            megatron_compat.destroy_model_parallel()
        kwargs = dict(
            tensor_model_parallel_size=layout.tp,
            pipeline_model_parallel_size=layout.pp,
            virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
            context_parallel_size=layout.cp,
            order=_MEGATRON_ORDER[layout.order],
        )
        if layout.cp > 1:
            # megatron also lays out (unused) expert groups and requires their data-parallel size
            # to equal the attention's under PP; folding CP into the expert TP size does that.
            kwargs["expert_tensor_parallel_size"] = layout.tp * layout.cp
        minutes = torch_compat.world_timeout_minutes()
        if minutes is not None:  # megatron's groups default to 30 minutes, whatever the world's timeout
            kwargs["distributed_timeout_minutes"] = minutes
        try:
            ps.initialize_model_parallel(**kwargs, create_gloo_process_groups=False)
        except TypeError:  # older megatron-core without the gloo flag
            ps.initialize_model_parallel(**kwargs)
        mesh = cls(layout=layout, rank=dist.get_rank(), vpp=vpp)
        for kind, group in _megatron_groups(ps).items():
            want = layout.group_of(mesh.rank, _LAYOUT_KIND.get(kind, kind))
            if kind == "embedding" and mesh.rank not in want:  # a middle pipeline stage
                want = []
            got = sorted(dist.get_process_group_ranks(group)) if group is not None else []
            if got != want:
                raise MeshError(f"rank {mesh.rank}: megatron's {kind} group {got} != layout's {want}")
            mesh.groups[kind] = group
            mesh.members[kind] = want
        return mesh

    def destroy(self) -> None:
        """Forget megatron's globals and this mesh's groups: a group nobody holds is freed, and
        with it its communicator's threads and buffers (a tolerant job makes a world per loss)."""
        from hybridpar.compat import megatron as megatron_compat

        megatron_compat.destroy_model_parallel()
        self.groups.clear()

    # --- queries ------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where this rank's tensors and communication buffers live (NCCL needs CUDA tensors)."""
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    @property
    def coord(self) -> Coord:
        return self.layout.coord(self.rank)

    def group(self, kind: str):
        return self.groups[kind]

    def size(self, kind: str) -> int:
        return len(self.members[kind])

    def rank_in(self, kind: str) -> int:
        return self.members[kind].index(self.rank)

    @property
    def dp_rank(self) -> int:
        return self.coord.dp

    @property
    def pp_rank(self) -> int:
        return self.coord.pp

    @property
    def tp_rank(self) -> int:
        return self.coord.tp

    @property
    def is_first_stage(self) -> bool:
        return self.coord.pp == 0

    @property
    def is_last_stage(self) -> bool:
        return self.coord.pp == self.layout.pp - 1

    def deepspeed_mpu(self) -> "DeepSpeedMPU":
        return DeepSpeedMPU(self)


class DeepSpeedMPU:
    """The ``mpu`` object DeepSpeed reads, over the mesh's groups.

    - data parallel: the DP x CP group (ZeRO partitions and gradient averaging run only there;
      CP ranks hold the same weights and see different tokens, so they average like replicas);
    - model parallel group: tp x pp, the replica's distinct shards, over which DeepSpeed sums
      the squared gradient norm;
    - model parallel *rank*: the TP rank. DeepSpeed uses it to decide which rank counts a
      parameter that is replicated across TP (norm weights) in the gradient norm: rank 0 of
      each TP group, on every pipeline stage. (Old Megatron-LM's mpu had the same meaning.)
    """

    def __init__(self, mesh: Mesh):
        self.mesh = mesh

    def get_data_parallel_group(self):
        return self.mesh.group("dp_cp")

    def get_data_parallel_rank(self):
        return self.mesh.rank_in("dp_cp")

    def get_data_parallel_world_size(self):
        return self.mesh.size("dp_cp")

    def get_data_parallel_group_ranks(self):
        return list(self.mesh.members["dp_cp"])

    def get_model_parallel_group(self):
        return self.mesh.group("mp")

    def get_model_parallel_rank(self):
        return self.mesh.rank_in("tp")

    def get_model_parallel_world_size(self):
        return self.mesh.size("tp")

    def get_tensor_model_parallel_group(self):
        return self.mesh.group("tp")

    def get_tensor_model_parallel_rank(self):
        return self.mesh.rank_in("tp")

    def get_tensor_model_parallel_world_size(self):
        return self.mesh.size("tp")

    def get_tensor_model_parallel_src_rank(self):
        return self.mesh.members["tp"][0]

    def get_pipeline_model_parallel_group(self):
        return self.mesh.group("pp")

    def get_pipeline_model_parallel_rank(self):
        return self.mesh.rank_in("pp")

    def get_pipeline_model_parallel_world_size(self):
        return self.mesh.size("pp")


