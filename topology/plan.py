"""The Plan: the contract between the planner and the runtime.

The planner produces Plans, ``hybridpar train`` consumes one, and ``plan.json`` in a run
directory is one, serialised.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from .layout import DEFAULT_ORDER, RankLayout
from .models import ModelSpec, model_from_dict

# Activation recomputation the planner costs, from the least recomputed to the most: megatron's "selective" (the
# attention core again in backward), torchtitan's two selective policies ("every-other-block": every second block
# checkpointed whole; "op-selective": every block recomputed but for its attention and every other matmul's
# output, software.TORCHTITAN_2024) and "full" (every block's forward again). The runtime runs megatron-core's
# (software.HYBRIDPAR.recompute_modes).
RECOMPUTE_MODES = ("none", "selective", "every-other-block", "op-selective", "full")
# Forward passes a block runs per micro-batch where recomputation repeats its TP collectives ("op-selective" keeps
# torchtitan's reduce-scatters, on its policy's list, and is counted as not repeating them [assumed]), and the share
# of its attention core run again in backward (where context parallelism exchanges K and V again).
RECOMPUTED_FORWARDS = {"full": 2, "every-other-block": 1.5}
RECOMPUTED_ATTENTION = {"full": 1, "selective": 1, "every-other-block": 0.5}
PRECISIONS = ("fp32", "bf16", "fp16", "fp8")


class PlanError(ValueError):
    """A layout that cannot run: the message names the constraint and the fix."""


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    seq_len: int
    global_batch: int  # sequences per optimizer step, over all replicas
    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 1
    vpp: int = 1  # virtual pipeline stages per pipeline rank (interleaved 1F1B when > 1)
    micro_batch: int = 1
    zero_stage: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    precision: str = "bf16"
    order: str = DEFAULT_ORDER
    gpu: str = "h100-80gb"
    gpus_per_node: int = 8
    # Llama 3's pipeline split (megatron-core's account_for_embedding_in_pipeline_split and
    # account_for_loss_in_pipeline_split): the embedding and the loss each count as one layer,
    # so the first and last stages carry one transformer layer fewer and (layers + 2) must
    # divide by pp x vpp. Evens out memory and time when the ends hold the big vocab matrices.
    lighter_end_stages: bool = False

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def zero_group(self) -> int:
        """Ranks that hold the same weights: DP x CP. ZeRO shards over them and the gradients are
        averaged over them (megatron-core's data-parallel group with CP; hybridpar's mesh dp_cp)."""
        return self.dp * self.cp

    @property
    def grad_accum(self) -> int:
        """Micro-batches per pipeline per optimizer step."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def layout(self) -> RankLayout:
        return RankLayout(tp=self.tp, cp=self.cp, pp=self.pp, dp=self.dp, order=self.order)

    def violations(self) -> list[str]:
        """Every divisibility rule this plan breaks, each as a one-line reason with its fix."""
        m = self.model
        out = []
        for key in ("tp", "cp", "pp", "dp", "vpp", "micro_batch", "seq_len", "global_batch"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                out.append(f"{key} must be a positive integer, got {value!r}")
        if out:
            return out
        if m.heads % self.tp:
            out.append(f"heads {m.heads} not divisible by tp {self.tp}")
        if m.kv_heads % self.tp:
            out.append(f"kv_heads {m.kv_heads} not divisible by tp {self.tp}")
        if m.ffn_hidden % self.tp:
            out.append(f"ffn_hidden {m.ffn_hidden} not divisible by tp {self.tp}")
        if self.lighter_end_stages:
            if self.pp == 1:
                out.append("lighter end stages need pp > 1")
            elif (m.layers + 2) % (self.pp * self.vpp):
                out.append(
                    f"layers + 2 = {m.layers + 2} (embedding and loss as layers) not divisible by "
                    f"pp x vpp = {self.pp} x {self.vpp}"
                )
        elif m.layers % (self.pp * self.vpp):
            out.append(f"layers {m.layers} not divisible by pp x vpp = {self.pp} x {self.vpp}")
        if self.vpp > 1 and self.pp == 1:
            out.append(f"vpp {self.vpp} needs pp > 1")
        if self.global_batch % (self.dp * self.micro_batch):
            out.append(
                f"global batch {self.global_batch} not divisible by dp x micro-batch = {self.dp} x {self.micro_batch}"
            )
        elif self.vpp > 1 and self.grad_accum % self.pp:
            out.append(
                f"interleaved schedule needs micro-batches per step ({self.grad_accum}) divisible by pp {self.pp}"
            )
        if self.seq_len % (2 * self.cp) and self.cp > 1:
            out.append(f"seq_len {self.seq_len} not divisible by 2 x cp = {2 * self.cp}")
        if self.sequence_parallel and self.seq_len % self.tp:
            out.append(f"sequence parallel needs seq_len {self.seq_len} divisible by tp {self.tp}")
        if self.zero_stage not in (0, 1, 2, 3):
            out.append(f"zero stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.recompute not in RECOMPUTE_MODES:
            out.append(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, got {self.recompute!r}")
        if self.precision not in PRECISIONS:
            out.append(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        return out

    def with_default_split(self) -> "Plan":
        """Llama 3's lighter end stages (embedding and loss count as a layer each on the first and
        last pipeline stage) when the layers do not divide evenly over pp x vpp but layers + 2 do."""
        slots = self.pp * self.vpp
        if self.pp > 1 and self.model.layers % slots and (self.model.layers + 2) % slots == 0:
            return self.with_(lighter_end_stages=True)
        return self

    def validate(self) -> "Plan":
        problems = self.violations()
        if problems:
            raise PlanError(problems[0])
        return self

    def with_(self, **changes) -> "Plan":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["world_size"] = self.world_size
        data["grad_accum"] = self.grad_accum
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "Plan":
        data = {k: v for k, v in data.items() if k not in ("world_size", "grad_accum")}
        data["model"] = model_from_dict(data["model"])
        return cls(**data)
