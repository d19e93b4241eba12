"""This rank's weights and AdamW state, seen per parameter (DeepSpeed ZeRO 0/1/2 alike).

- ZeRO 1/2 (DeepSpeedZeroOptimizer, and DeepSpeed's BF16 optimizer): the base optimizer steps
  one flat fp32 partition per param group; DeepSpeed links each parameter that overlaps this
  rank's partition to its piece of it (``compat.deepspeed.fragment_address``: the range inside the
  flattened parameter and the range inside the flat partition). The fp32 master weights are that flat
  partition; AdamW's moments are keyed by it.
- ZeRO 0: a plain torch optimizer over the parameters themselves, replicated on every DP rank
  (DP rank 0 saves it; every rank loads it).
- ZeRO 0 in bf16: DeepSpeed's bf16 wrapper (FP16_UnfusedOptimizer, ``fp16_groups`` /
  ``fp32_groups``) around hybridpar's ClippedAdamW: the wrapper's fp32 copy of each bf16
  parameter is its master weight, and the inner optimizer's state, keyed by those masters,
  holds the moments. Saved and loaded like plain ZeRO 0, through the masters.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridpar.checkpoint.files import CheckpointError
from hybridpar.compat import deepspeed as deepspeed_compat

MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass
class Fragment:
    start: int  # offset in the flattened (TP-shard) parameter
    numel: int
    tensors: dict  # "param" (fp32 master), "exp_avg", "exp_avg_sq": flat views of this range


class OptimizerView:
    def __init__(self, stage_engine, dp_rank: int):  # dp_rank: index in the ZeRO group (DP x CP)
        self.opt = stage_engine.engine.optimizer
        self.dp_rank = dp_rank
        # ZeRO-0 bf16: model parameter -> its fp32 master (StageEngine found them; absent: the parameter itself)
        self.masters = stage_engine.fp32_masters
        if deepspeed_compat.is_partitioned(self.opt):
            self.partitioned, self.base = True, deepspeed_compat.inner_optimizer(self.opt)
        elif isinstance(self.opt, torch.optim.Optimizer):
            self.partitioned, self.base = False, self.opt
        elif self.masters:
            self.partitioned, self.base = False, deepspeed_compat.inner_optimizer(self.opt)
        else:
            raise CheckpointError(f"checkpointing does not know DeepSpeed's optimizer wrapper {type(self.opt).__name__}")

    # --- reading ------------------------------------------------------------------------
    def _master(self, p):
        """ZeRO 0: the tensor the optimizer steps for ``p`` (its fp32 master, or ``p`` itself)."""
        return self.masters.get(p, p)

    def _flat(self, at: deepspeed_compat.FragmentAddress):
        """The flat fp32 partition (the master weights) that holds the fragment at ``at``."""
        return self.base.param_groups[at.group]["params"][0]

    def fragment(self, p) -> Fragment | None:
        """The part of ``p`` this rank saves (None: another DP rank owns all of it)."""
        if self.partitioned:
            at = deepspeed_compat.fragment_address(p)
            if at is None:
                return None
            flat = self._flat(at)
            state = self.base.state.get(flat, {})
            tensors = {"param": flat.detach().narrow(0, at.flat_start, at.flat_numel)}
            for key in MOMENTS:
                tensors[key] = (state[key].narrow(0, at.flat_start, at.flat_numel) if key in state
                                else torch.zeros(at.flat_numel, device=flat.device))
            return Fragment(at.param_start, at.param_numel, tensors)
        if self.dp_rank != 0:
            return None
        master = self._master(p)
        state = self.base.state.get(master, {})
        tensors = {"param": master.detach().reshape(-1).float()}
        for key in MOMENTS:
            tensors[key] = state[key].reshape(-1) if key in state else torch.zeros(p.numel(), device=master.device)
        return Fragment(0, p.numel(), tensors)

    def adam_step(self) -> int:
        """AdamW's step count (0 before the first step)."""
        for state in self.base.state.values():
            if "step" in state:
                return int(float(state["step"]))
        return 0

    # --- writing ------------------------------------------------------------------------
    def _state_tensors(self):
        """Every tensor the base optimizer keeps state for (flat partitions, or parameters)."""
        return [p for g in self.base.param_groups for p in g["params"]]

    def prepare(self, adam_step: int) -> None:
        """Create AdamW state (zeros) where it does not exist yet, and set its step count."""
        for t in self._state_tensors():
            state = self.base.state[t]
            if "step" in state and torch.is_tensor(state["step"]):
                state["step"].fill_(float(adam_step))
            else:
                # torch's AdamW keeps its step count on the host (unless capturable or fused)
                state["step"] = torch.tensor(float(adam_step), dtype=torch.float32, device="cpu")
            for key in MOMENTS:
                if key not in state:
                    state[key] = torch.zeros_like(t, memory_format=torch.preserve_format)

    def needed_range(self, p) -> tuple[int, int] | None:
        """The flat range of ``p`` whose optimizer state this rank holds (None: none)."""
        if self.partitioned:
            at = deepspeed_compat.fragment_address(p)
            if at is None:
                return None
            return at.param_start, at.param_start + at.param_numel
        return 0, p.numel()

    @torch.no_grad()
    def set_param(self, p, value: torch.Tensor) -> None:
        """The model's copy (all of this rank's shard) and, where it has one, the fp32 master."""
        p.data.copy_(value.view_as(p).to(p.dtype))
        master = self.masters.get(p)
        if master is not None:
            master.data.copy_(value.view_as(master))
        at = deepspeed_compat.fragment_address(p) if self.partitioned else None
        if at is not None:
            self._flat(at).data.narrow(0, at.flat_start, at.flat_numel).copy_(
                value.reshape(-1)[at.param_start:at.param_start + at.param_numel])

    @torch.no_grad()
    def set_moment(self, p, key: str, values: torch.Tensor) -> None:
        """``values``: the flat range ``needed_range(p)`` of moment ``key``."""
        if self.partitioned:
            at = deepspeed_compat.fragment_address(p)
            self.base.state[self._flat(at)][key].narrow(0, at.flat_start, at.flat_numel).copy_(values)
        else:
            master = self._master(p)
            self.base.state[master][key].copy_(values.view_as(master))
