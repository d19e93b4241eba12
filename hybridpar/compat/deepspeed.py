"""Every use of DeepSpeed's internals: its ZeRO-1/2 optimizer's bookkeeping, read and replaced.

DeepSpeed has no public API for what hybridpar does with ZeRO: reducing gradients once per step
under megatron's schedule, handing DeepSpeed partitions reduced elsewhere, deferring its weight
all-gather, one norm reduction for all groups, reading and writing one rank's optimizer fragments
without collectives (its ``safe_get_local_*`` functions are ZeRO-3 only, the ``safe_get_full_*``
ones all-reduce). So each such use is one function here, and ``RELIES_ON`` lists what they touch;
tests/unit/test_compat.py checks the installed DeepSpeed for each. Nothing here imports DeepSpeed
before it is called.
"""
from __future__ import annotations

import importlib
import types
from contextlib import contextmanager
from dataclasses import dataclass

from hybridpar.compat.declared import ASSIGNED, FIELD, MEMBER, READ, Internal, Reliance

_ZERO = "deepspeed.runtime.zero.stage_1_and_2"
_OPT = f"{_ZERO}:DeepSpeedZeroOptimizer"
_ENGINE = "deepspeed.runtime.engine:DeepSpeedEngine"
_UNFUSED = "deepspeed.runtime.fp16.unfused_optimizer:FP16_UnfusedOptimizer"
_MUON = "deepspeed.runtime.zero.muon.muon_optimizer"


_SHM = "hybridpar.compat.cpu skips the shared-memory op's build on CPU ranks"
_HOOKS = "hybridpar.zero.engine reduces once per step, not in DeepSpeed's per-parameter hooks"
_FP32 = "hybridpar.zero.engine accumulates bf16 runs' gradients in fp32"
_ZERO2 = "hybridpar.zero.engine defers ZeRO-2's reduction through it"
_HAND_OFF = "hybridpar.zero.partitions hands DeepSpeed partitions that grad_sync reduced"
_GATHER = "hybridpar.zero.param_gather gathers the updated weights itself"
_NORM = "hybridpar's one-reduction gradient norm (reduce_group_norms_together) relies on it"
_CHECKPOINT = "hybridpar.checkpoint.optim saves and loads each rank's optimizer fragments"
_MASTERS = "hybridpar.zero.engine repairs the bf16 ZeRO-0 wrapper's fp32 masters"


def _opt(name, used_for, kind=ASSIGNED, params=()):
    return Internal(_OPT, name, used_for, kind, params)


RELIES_ON = Reliance("deepspeed", ("0.19.8", "0.20"), (
    Internal("deepspeed.comm.torch", "build_shm_op", _SHM),
    Internal("deepspeed.comm.torch:TorchBackend", "build_shm_op", _SHM + " (looked up at call time)", READ),
    Internal(_MUON, "MuonWithAuxAdam", "hybridpar.compat.cpu imports this module before ZeRO does, torch.compile off"),
    _opt(_MUON, "hybridpar.compat.cpu imports it before average_tensor does", READ),
    _opt("_grad_acc_hooks", _HOOKS),
    _opt("setup_buckets", _HOOKS + " (it sets up the buckets they set up)", MEMBER),
    _opt("bit16_groups", _HOOKS),
    _opt("gradient_accumulation_dtype", _FP32),
    _opt("use_separate_grad_accum", _FP32),
    _opt("use_grad_accum_attribute", _FP32),
    _opt("grad_accum", _FP32 + " (handed over in p.grad_accum)", READ),
    _opt("finalize_gradient_accumulation_boundary", _ZERO2, MEMBER),
    _opt("set_gradient_accumulation_boundary", _ZERO2, MEMBER, ("is_boundary",)),
    _opt("get_gradient_for_reduction", _ZERO2, MEMBER, ("param",)),
    _opt("reduce_ready_partitions_and_remove_grads", _ZERO2, MEMBER, ("param", "i")),
    _opt("overlapping_partition_gradients_reduce_epilogue", _ZERO2, MEMBER),
    _opt("round_robin_bit16_groups", _HAND_OFF),
    _opt("round_robin_bit16_offsets", _HAND_OFF),
    _opt("partition_size", _HAND_OFF),
    _opt("params_in_partition", _HAND_OFF),
    _opt("averaged_gradients", _HAND_OFF),
    _opt("flat_partition", _HAND_OFF + " (the step takes it whole)", READ),
    _opt("real_dp_process_group", _HAND_OFF),
    _opt("device", _HAND_OFF),
    _opt("bit16_groups_flat", _GATHER),
    Internal(_ZERO, "all_gather_dp_groups", _GATHER + " (it skips DeepSpeed's)", params=("groups_flat",)),
    _opt("all_gather_dp_groups", _GATHER + " (DeepSpeed's step looks it up at call time)", READ),
    _opt("scaled_global_norm", "hybridpar's one-reduction gradient norm replaces it", MEMBER, ("norm_type",)),
    _opt("cpu_offload", _NORM),
    _opt("has_moe_layers", _NORM),
    _opt("_muon_update_lacks_loss_scale", _NORM, MEMBER, ("group_index",)),
    _opt("dp_process_group", _NORM),
    _opt("_model_parallel_all_reduce", _NORM, MEMBER, ("tensor", "op")),
    _opt("model_parallel_rank", _NORM),
    Internal(_ZERO, "_zero_padding", _NORM, ASSIGNED),
    Internal(_ZERO, "PIPE_REPLICATED", "hybridpar.runtime.model marks the last stage's tied embedding with it",
             value="ds_pipe_replicated"),
    Internal(_ZERO, "is_model_parallel_parameter", _NORM),
    Internal(_ZERO, "get_norm_dtype", _NORM),
    Internal(_ZERO, "mask_nan_or_inf_with_val_inplace", _NORM),
    Internal(_ZERO, "combine_grad_norm_groups", _NORM),
    _opt("single_partition_of_fp32_groups", _CHECKPOINT),
    Internal("deepspeed.runtime.bf16_optimizer:BF16_Optimizer", "fp32_groups_flat_partition", _CHECKPOINT, ASSIGNED),
    _opt("optimizer", _CHECKPOINT),
    Internal("deepspeed.utils.mixed_precision_linkage", "_hp_mapping", _CHECKPOINT, ASSIGNED),
    *(Internal("deepspeed.utils.tensor_fragment:tensor_fragment", name, _CHECKPOINT, FIELD)
      for name in ("lp_fragment_address", "hp_fragment_address", "param_group_index")),
    *(Internal("deepspeed.utils.tensor_fragment:fragment_address", name, _CHECKPOINT, FIELD)
      for name in ("start", "numel")),
    Internal(_UNFUSED, "optimizer", _MASTERS, ASSIGNED),
    Internal(_UNFUSED, "fp16_groups", _MASTERS, ASSIGNED),
    Internal(_UNFUSED, "fp32_groups", _MASTERS, ASSIGNED),
    Internal(_ENGINE, "enable_backward_allreduce", "hybridpar.zero.engine hands DP reduction to grad_sync", ASSIGNED),
    Internal(_ENGINE, "global_steps", "hybridpar.checkpoint.load and reliability.replica_loss restore the step counters", ASSIGNED),
    Internal(_ENGINE, "global_samples", "hybridpar.checkpoint.load and reliability.replica_loss restore the step counters", ASSIGNED),
))


# --- start-up ------------------------------------------------------------------------------
def skip_shm_build() -> None:
    """DeepSpeed's CPU backend builds its shared-memory op through this module global at start."""
    # (`import deepspeed.comm.torch as m` would bind deepspeed.comm's `torch` attribute: torch itself)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def import_zero_muon() -> None:
    """The Muon optimizer module that ZeRO-1/2 imports in each gradient reduction (average_tensor),
    whose kernels are compiled when it is first imported (hybridpar.compat.cpu imports it first)."""
    importlib.import_module(_MUON)


def skip_engine_allreduce(engine) -> None:
    """ZeRO 0/1: ``engine.step()`` reduces no more (the gradients arrive averaged)."""
    engine.enable_backward_allreduce = False


def set_step_counters(engine, steps: int, samples: int) -> None:
    engine.global_steps = steps
    engine.global_samples = samples


# --- the optimizers DeepSpeed wraps -----------------------------------------------------------
def inner_optimizer(opt):
    """The torch optimizer a DeepSpeed optimizer steps (``opt`` itself when it wraps none)."""
    return getattr(opt, "optimizer", opt)


def fp32_masters(wrapper) -> dict | None:
    """{bf16 parameter: its fp32 master} of DeepSpeed's bf16 ZeRO-0 wrapper (FP16_UnfusedOptimizer);
    None for an optimizer without such groups."""
    low_groups, high_groups = getattr(wrapper, "fp16_groups", None), getattr(wrapper, "fp32_groups", None)
    if low_groups is None or high_groups is None:
        return None
    return {p: master for low, high in zip(low_groups, high_groups) for p, master in zip(low, high)}


def is_partitioned(opt) -> bool:
    """ZeRO 1/2 (DeepSpeedZeroOptimizer, or DeepSpeed's BF16 optimizer): flat fp32 partitions."""
    return hasattr(opt, "single_partition_of_fp32_groups") or hasattr(opt, "fp32_groups_flat_partition")


@dataclass(frozen=True)
class FragmentAddress:
    """The piece of one parameter that this rank's flat fp32 partition holds (DeepSpeed's
    ``p._hp_mapping``)."""
    group: int  # the optimizer parameter group, whose one flat tensor the partition is
    param_start: int  # range in the flattened parameter
    param_numel: int
    flat_start: int  # range in the group's flat partition
    flat_numel: int


def fragment_address(p) -> FragmentAddress | None:
    """None: another DP rank's partition holds all of ``p``."""
    m = getattr(p, "_hp_mapping", None)
    if m is None:
        return None
    lp, hp = m.lp_fragment_address, m.hp_fragment_address
    return FragmentAddress(m.param_group_index, lp.start, lp.numel, hp.start, hp.numel)


# --- ZeRO-1/2 gradient reduction ------------------------------------------------------------
def remove_grad_hooks(opt) -> None:
    """The hooks DeepSpeed puts on every parameter's gradient accumulation (it reduces there)."""
    for handle in opt._grad_acc_hooks:
        handle.remove()
    opt._grad_acc_hooks = []


def setup_buckets(opt) -> None:
    """What the removed hooks did before a reduction: allocate the reduction buckets."""
    opt.setup_buckets()


def accumulate_through_grad_accum(opt) -> None:
    """DeepSpeed's fp32 accumulation path (ZeRO-1 with CPU offload uses it): the reduction reads
    ``p.grad_accum`` into an fp32 bucket and adds the fp32 result into an fp32 partition."""
    import torch

    opt.gradient_accumulation_dtype = torch.float32
    opt.use_separate_grad_accum = True
    opt.use_grad_accum_attribute = True


def hand_over_as_grad_accum(opt) -> None:
    """Move each partitioned parameter's ``p.grad`` to ``p.grad_accum``, where that path reads it,
    and set up its buckets."""
    for group in opt.bit16_groups:
        for p in group:
            if p.grad is not None:
                p.grad_accum = p.grad  # fp32 (engine._fp32_grad): DeepSpeed reads it without a cast
                p.grad = None
    opt.setup_buckets()  # fp32 buckets (allocated per step; the hooks that did it are gone)


def clear_grad_accum(p) -> None:
    if getattr(p, "grad_accum", None) is not None:
        p.grad_accum = None


def reduce_zero2_once_at_boundary(opt) -> None:
    """Replace the hook DeepSpeed calls at the boundary of an unmanaged step
    (``finalize_gradient_accumulation_boundary``) by one pass of DeepSpeed's own bucketed
    reduction over every gradient."""

    def reduce_once_at_boundary():
        opt.set_gradient_accumulation_boundary(True)
        opt.setup_buckets()
        for i, group in enumerate(opt.bit16_groups):
            for p in group:
                if opt.get_gradient_for_reduction(p) is not None:
                    opt.reduce_ready_partitions_and_remove_grads(p, i)
        opt.overlapping_partition_gradients_reduce_epilogue()  # also builds averaged_gradients

    opt.finalize_gradient_accumulation_boundary = reduce_once_at_boundary


def skip_zero2_boundary_reduction(opt) -> None:
    """ZeRO-2's boundary reduces nothing (the partitions are handed over already reduced)."""
    opt.finalize_gradient_accumulation_boundary = lambda: opt.set_gradient_accumulation_boundary(True)


# --- ZeRO-1/2 partitions ---------------------------------------------------------------------
def flat_positions(opt) -> dict:
    """{parameter: (group, index in the group, first element in the group's flat buffer)}."""
    return {p: (i, k, offset)
            for i, (params, offsets) in enumerate(zip(opt.round_robin_bit16_groups, opt.round_robin_bit16_offsets))
            for k, (p, offset) in enumerate(zip(params, offsets))}


def partition_sizes(opt) -> list[int]:
    """Elements of each group's DP partition (every rank's is the same size)."""
    return [int(size) for size in opt.partition_size]


def group_lengths(opt) -> list[int]:
    """Parameters in each group."""
    return [len(params) for params in opt.round_robin_bit16_groups]


def flat_weights(opt) -> list:
    """Each group's flat 16-bit weight buffer (the parameters are views of it)."""
    return opt.bit16_groups_flat


def dp_groups(opt) -> list:
    """The DP process group DeepSpeed partitions each parameter group over."""
    return opt.real_dp_process_group


def device(opt):
    return opt.device


def params_in_partition(opt) -> list[list]:
    """Per group: the parameters that overlap this rank's partition, in partition order."""
    return opt.params_in_partition


class _PartitionGradients(list):
    """DeepSpeed's ``averaged_gradients[i]``: this rank's slice of each parameter in its partition
    (``params_in_partition`` order, read by the norm), and ``flat_partition``, the whole partition
    (taken by the step as is)."""
    flat_partition: object


def install_averaged_partition(opt, group: int, slices: list, flat) -> None:
    grads = _PartitionGradients(slices)
    grads.flat_partition = flat
    opt.averaged_gradients[group] = grads


# --- ZeRO-1/2 weight gather ------------------------------------------------------------------
_SKIPPED_GATHERS: set[int] = set()  # ids of the flat-buffer lists whose gather is skipped right now


def allow_skipping_weight_gather() -> None:
    """DeepSpeed's ZeRO-1/2 step calls ``all_gather_dp_groups`` from its module namespace: let a
    skipped optimizer's call through as a no-op (every other call, e.g. after a checkpoint load,
    gathers as before)."""
    from deepspeed.runtime.zero import stage_1_and_2

    original = stage_1_and_2.all_gather_dp_groups
    if getattr(original, "hybridpar_deferral", False):
        return

    def all_gather_dp_groups(groups_flat, *args, **kwargs):
        if id(groups_flat) in _SKIPPED_GATHERS:
            return None
        return original(groups_flat, *args, **kwargs)

    all_gather_dp_groups.hybridpar_deferral = True
    stage_1_and_2.all_gather_dp_groups = all_gather_dp_groups


@contextmanager
def weight_gather_skipped(opt):
    """Around DeepSpeed's step: it does not all-gather the updated weights
    (``allow_skipping_weight_gather()`` first)."""
    key = id(opt.bit16_groups_flat)
    _SKIPPED_GATHERS.add(key)
    try:
        yield
    finally:
        _SKIPPED_GATHERS.discard(key)


# --- ZeRO-1/2 gradient norm ------------------------------------------------------------------
def reduce_group_norms_together(opt) -> bool:
    """Replace ``opt.scaled_global_norm`` (each group's squared norm all-reduced on its own, over
    DP and then over the model-parallel group) by the same per-group sums, with the same parameter
    selection, stacked and reduced together: one all-reduce per axis; each group's norm is then
    masked and combined as DeepSpeed does. False (nothing changed) for the paths it does not
    cover: CPU offload, MoE, Muon."""
    groups = range(len(opt.bit16_groups))
    if opt.cpu_offload or opt.has_moe_layers or any(opt._muon_update_lacks_loss_scale(i) for i in groups):
        return False
    opt.scaled_global_norm = types.MethodType(_scaled_global_norm, opt)
    return True


def _local_square_sum(opt, gradients, params):
    """This rank's share of one group's squared L2 norm, selected as ``get_grad_norm_direct``
    selects: padding skipped, pipeline-replicated parameters skipped, parameters that are not
    model-parallel counted on model-parallel rank 0 only."""
    import torch
    from deepspeed.runtime.zero import stage_1_and_2 as ds

    norms = []
    grads = (g for g in gradients if not getattr(g, "_zero_padding", False))
    for g, p in zip(grads, params):
        if getattr(p, ds.PIPE_REPLICATED, False):
            continue
        if ds.is_model_parallel_parameter(p) or opt.model_parallel_rank == 0:
            norms.append(torch.linalg.vector_norm(g.data.to(ds.get_norm_dtype()).detach(), ord=2))
    if not norms:
        return torch.zeros((), dtype=torch.float32, device=opt.device)
    return torch.stack(norms).pow(2).sum().float()


def _scaled_global_norm(self, norm_type=2):
    import torch
    import torch.distributed as dist
    from deepspeed.runtime.zero import stage_1_and_2 as ds

    assert norm_type == 2, "only L2 norm supported"
    sums = torch.stack([_local_square_sum(self, self.averaged_gradients[i], self.params_in_partition[i])
                        for i in range(len(self.bit16_groups))])
    dist.all_reduce(sums, group=self.dp_process_group)
    self._model_parallel_all_reduce(tensor=sums, op=dist.ReduceOp.SUM)
    norms = []
    for total in sums.pow(0.5):
        ds.mask_nan_or_inf_with_val_inplace(total, device=self.device)
        norms.append(total)
    return ds.combine_grad_norm_groups(norms, norm_type=2)
