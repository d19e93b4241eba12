"""Memory truth at full scale without GPUs: each distinct pipeline stage of a plan built exactly as
the runtime builds it, on the ``meta`` device, beside the planner's weights, gradients and
optimizer bytes (`hybridpar memory`).

For every pipeline rank the planner sizes (topology.stages: first, one middle, last), this process
joins a fake process group of the plan's full world size as that rank (TP, CP and DP rank 0),
builds the mesh (megatron's ``initialize_model_parallel``, every group checked against the layout)
and that rank's model chunks with ``hybridpar.model.build_model`` inside ``cpu.meta_build()``: the
TP slice, the virtual-stage chunks, the lighter end stages, embedding and output layer are
megatron-core's own, and no weight is allocated. What the runtime then holds per GPU follows from
those tensors:

- weights: 16-bit (or fp32) parameters. Under ZeRO-1/2 DeepSpeed flattens each optimizer parameter
  group into one buffer padded to a multiple of 2 x DP (``zero_partition``) and the parameters
  become views of it; plus registered buffers and plain tensor attributes (RoPE's ``inv_freq``).
- gradients: one fp32 ``.grad`` per parameter (``engine._fp32_grad``: bf16 runs accumulate in
  fp32), whole at ZeRO-0/1/2 (hybridpar's ZeRO-2 reduces once per step, engine.py).
- optimizer: DeepSpeed's fp32 master partition plus AdamW's two fp32 moments, 12 bytes per element
  of this rank's padded partition of each group (ZeRO-0: of every parameter; with fp32 weights
  DeepSpeed still clones its master partition, ZeRO-0 steps the weights themselves).
"""
from __future__ import annotations

import contextlib
import resource
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from hybridpar.topology.memory import stage_memory
from hybridpar.topology.plan import Plan
from hybridpar.topology.software import HYBRIDPAR
from hybridpar.topology.stages import Stage, stages

TOLERANCE = 0.005  # |built - planner| / built, per part and stage
PARTS = ("weights", "grads", "optimizer")
ADAM_STATE_BYTES = 8  # AdamW's exp_avg and exp_avg_sq, fp32, per element of the master partition
MASTER_BYTES = 4  # DeepSpeed's fp32 master partition (single_partition_of_fp32_groups)
GRAD_BYTES = 4  # fp32 .grad per parameter (engine._fp32_grad / FP32_GRAD_ACCUM; fp32 runs too)


def zero_partition(group_numel: int, dp: int) -> int:
    """Elements of one DP rank's partition of a ZeRO-1/2 parameter group, as DeepSpeed 0.19 cuts it
    (runtime/zero/stage_1_and_2.py, DeepSpeedZeroOptimizer.__init__): the group is flattened and
    padded to a multiple of ``nccl_start_alignment_factor (2) x dp`` (align_dense_tensors), then
    cut into dp equal partitions (get_data_parallel_partitions). hybridpar leaves
    ``parameter_alignment`` at its default (False): no padding between parameters."""
    alignment = 2 * dp
    return -(-group_numel // alignment) * alignment // dp


@dataclass(frozen=True)
class StageCount:
    """One pipeline rank's chunks as built, and the bytes the runtime holds for them."""
    stage: str
    pp_rank: int
    layers: int
    params: int  # elements of every parameter of the rank's chunks
    extra_bytes: int  # registered buffers and plain tensor attributes (RoPE inv_freq)
    groups: tuple[int, ...]  # elements per optimizer parameter group (engine.param_groups)
    partitions: tuple[int, ...]  # this rank's ZeRO partition of each group (elements)
    weights: int  # bytes
    grads: int
    optimizer: int


@dataclass(frozen=True)
class StageAudit:
    built: StageCount
    planner_params: float
    planner: dict  # part -> bytes (topology.memory.stage_memory)

    def error(self, part: str) -> float:
        built = getattr(self.built, part)
        return (self.planner[part] - built) / built if built else float(self.planner[part] != 0)

    @property
    def agrees(self) -> bool:
        return all(abs(self.error(p)) <= TOLERANCE for p in PARTS)


@contextlib.contextmanager
def fake_world(world: int, rank: int):
    """A process group of ``world`` ranks in which this process is ``rank`` and no collective moves
    data: torch's fake backend (``compat.torch.fake_store``). megatron's ``initialize_model_parallel``
    needs the full world to lay out its groups; no peer exists."""
    from hybridpar.compat import torch as torch_compat

    dist.init_process_group("fake", rank=rank, world_size=world, store=torch_compat.fake_store())
    try:
        yield
    finally:
        dist.destroy_process_group()


def _held_tensors(chunks) -> tuple[list, int]:
    """(parameters, bytes of buffers and of tensors held as plain module attributes)."""
    params, extra, seen = [], 0, set()
    for chunk in chunks:
        params += list(chunk.parameters())
        for module in chunk.modules():
            tensors = list(module.buffers(recurse=False))
            tensors += [v for v in vars(module).values() if isinstance(v, torch.Tensor)
                        and not isinstance(v, torch.nn.Parameter)]
            for t in tensors:
                if id(t) not in seen:
                    seen.add(id(t))
                    extra += t.numel() * t.element_size()
    return params, extra


def count_stage(chunks, stage: Stage, zero_stage: int, dp: int) -> StageCount:
    """The runtime's weights, gradients and optimizer bytes for one rank's built chunks."""
    from hybridpar.zero.engine import param_groups

    params, extra = _held_tensors(chunks)
    groups = tuple(sum(p.numel() for p in g["params"]) for g in param_groups(chunks, 0.0))
    size = params[0].element_size()
    n = sum(p.numel() for p in params)
    if zero_stage >= 1:
        partitions = tuple(zero_partition(g, dp) for g in groups)
        weights = sum(part * dp for part in partitions) * size  # the padded flat buffers
        optimizer = sum(partitions) * (MASTER_BYTES + ADAM_STATE_BYTES)
    else:
        partitions = groups
        weights = n * size
        optimizer = n * (ADAM_STATE_BYTES + (MASTER_BYTES if size < 4 else 0))
    return StageCount(stage.name, stage.rank, stage.layers, n, extra, groups, partitions,
                      weights + extra, n * GRAD_BYTES, optimizer)


def build_stage(plan: Plan, stage: Stage, dtype: torch.dtype) -> StageCount:
    """Join a fake world as ``stage``'s pipeline rank, build its chunks on meta and count them."""
    from hybridpar.compat import cpu
    from hybridpar.runtime.mesh import Mesh
    from hybridpar.runtime.model import ModelOptions, build_model

    layout = plan.layout
    with fake_world(layout.world_size, layout.rank(pp=stage.rank)):
        mesh = Mesh.build(layout, vpp=plan.vpp)
        try:
            opts = ModelOptions(seq_len=plan.seq_len, sequence_parallel=plan.sequence_parallel, dtype=dtype,
                                lighter_end_stages=plan.lighter_end_stages, recompute=plan.recompute)
            with cpu.meta_build():
                chunks = build_model(plan.model, mesh, opts, draw_weights=False)
            real = [p for c in chunks for p in c.parameters() if p.device.type != "meta"]
            if real:
                raise RuntimeError(f"{len(real)} parameters were allocated on {real[0].device}, not meta")
            layers = sum(len(c.decoder.layers) for c in chunks)
            if layers != stage.layers:
                raise RuntimeError(f"pipeline rank {stage.rank}: built {layers} layers, the planner's stage has "
                                   f"{stage.layers}")
            return replace(count_stage(chunks, stage, plan.zero_stage, mesh.size("dp_cp")), layers=layers)
        finally:
            mesh.destroy()


def audit(plan: Plan, dtype: torch.dtype = torch.bfloat16) -> list[StageAudit]:
    from hybridpar.topology.stages import params_per_rank

    out = []
    for stage in stages(plan):
        built = build_stage(plan, stage, dtype)
        mem = stage_memory(plan, stage, HYBRIDPAR)
        out.append(StageAudit(built, params_per_rank(plan, stage),
                              {"weights": mem.params, "grads": mem.grads, "optimizer": mem.optimizer}))
    return out


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
