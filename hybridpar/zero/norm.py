"""ZeRO-1/2: the global gradient norm with one reduction for all parameter groups.

DeepSpeed's ZeRO-1/2 step (``stage_1_and_2.scaled_global_norm``) sums each parameter group's
squared partition norm with its own all-reduce over DP, then over the model-parallel group:
hybridpar's two groups (weight decay or not) cost two latency-bound scalar collectives per step
on each axis. ``install`` replaces that method on one optimizer: the same per-group sums, with
the same parameter selection, stacked and reduced together (one all-reduce over DP, one over the
model-parallel group); each group's norm is then masked and combined as DeepSpeed does.
"""
from __future__ import annotations

import types

import torch
import torch.distributed as dist


def install(opt) -> bool:
    """Replace ``opt.scaled_global_norm``; False (nothing changed) for the paths it does not
    cover: CPU offload, MoE, Muon."""
    groups = range(len(opt.bit16_groups))
    if opt.cpu_offload or opt.has_moe_layers or any(opt._muon_update_lacks_loss_scale(i) for i in groups):
        return False
    opt.scaled_global_norm = types.MethodType(_scaled_global_norm, opt)
    return True


def _local_square_sum(opt, gradients, params) -> torch.Tensor:
    """This rank's share of one group's squared L2 norm, selected as ``get_grad_norm_direct``
    selects: padding skipped, pipeline-replicated parameters skipped, parameters that are not
    model-parallel counted on model-parallel rank 0 only."""
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
