"""What surviving the loss of a whole DP replica costs (``--tolerate-replica-loss``): after every
optimizer step each rank copies its optimizer state to host memory and, with ZeRO, swaps that copy
with its peer in the neighbouring replica, so a lost replica's ZeRO partitions live on in the next.

Per GPU, for the largest pipeline stage (the step waits for the slowest rank):
* snapshot: the optimizer state the rank holds, 12 bytes per parameter (fp32 master, AdamW's two
  moments; memory.model_state_bytes): its ZeRO partition, params / (dp x cp), with ZeRO >= 1; the
  whole state of its model-parallel shard without ZeRO;
* copy: with ZeRO, the previous replica's snapshot, received from the rank at the same TP/CP/PP
  position over a ring of the DP group; 0 without ZeRO, where every replica holds the full state;
* host memory: KEEP steps of both;
* host link: the snapshot to host memory; with ZeRO also the exchange's two crossings, as the
  runtime does it (reliability/replica_loss.py): the serialized host copy goes back to the device
  for NCCL, and the received copy comes out to host memory: 3 x snapshot over the host link, one
  after the other; exchange: the copy, send and receive at once (full duplex), over the link DP
  traffic takes (links.dp_inside_node: NVLink inside a node, else the network) plus one
  send/receive's NCCL latency. Both links at links.LINK_EFFICIENCY of their peak.
All of it runs synchronously after the step and adds to it. Serializing the snapshot in host
memory (torch.save) is not counted.

Pure arithmetic on a Plan, no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from .links import dp_inside_node, link_time, nccl_latency
from .hardware import GIB, GPU
from .memory import model_state_bytes
from .plan import Plan, PlanError
from .stages import params_per_rank, stages

KEEP = 2  # steps of snapshots (own and received) kept in host memory
HOST_CROSSINGS = 3  # with ZeRO: own snapshot out, serialized copy in for NCCL, the neighbour's copy out


@dataclass(frozen=True)
class ReplicaRedundancy:
    """Per GPU, per optimizer step."""
    snapshot_bytes: float  # own optimizer state copied to host memory
    copy_bytes: float  # the previous replica's snapshot held for it (0 without ZeRO)
    d2h_s: float  # host-link copies: the snapshot out (and with ZeRO the exchange's two crossings)
    exchange_s: float  # snapshot sent to the next replica while the previous one's arrives
    link: str  # what the exchange crosses: "nvlink", "network", or "none" (no ZeRO, no exchange)

    @property
    def host_bytes(self) -> float:
        return KEEP * (self.snapshot_bytes + self.copy_bytes)

    @property
    def added_s(self) -> float:
        return self.d2h_s + self.exchange_s

    def to_json(self) -> dict:
        return {"host_gib_per_gpu": round(self.host_bytes / GIB, 3), "snapshot_bytes": round(self.snapshot_bytes),
                "copy_bytes": round(self.copy_bytes), "keep_steps": KEEP, "link": self.link,
                "d2h_s": round(self.d2h_s, 6), "exchange_s": round(self.exchange_s, 6),
                "added_s": round(self.added_s, 6)}


def batch_problem(global_batch: int, dp: int, micro_batch: int) -> str | None:
    """Why dp replicas cannot lose one: the job goes on with dp - 1 and the same global batch."""
    if dp < 2:
        return f"tolerating a replica loss needs dp >= 2, got dp {dp}"
    if global_batch % (micro_batch * (dp - 1)):
        return (f"global batch {global_batch} not divisible by micro-batch x (dp - 1) = {micro_batch} x {dp - 1}: "
                f"the {dp - 1} replicas left after a replica loss must share it")
    return None


def tolerance_problems(plan: Plan) -> list[str]:
    """Why a plan cannot survive a replica loss: the batch rule above, then whatever the plan with
    dp - 1 replicas breaks (e.g. the interleaved schedule's micro-batches per step over pp)."""
    problem = batch_problem(plan.global_batch, plan.dp, plan.micro_batch)
    if problem:
        return [problem]
    return [f"after a replica loss (dp {plan.dp - 1}): {p}" for p in plan.with_(dp=plan.dp - 1).violations()]


def replica_redundancy(plan: Plan, gpu: GPU) -> ReplicaRedundancy:
    if plan.dp < 2:
        raise PlanError(batch_problem(plan.global_batch, plan.dp, plan.micro_batch))
    n = max(params_per_rank(plan, s) for s in stages(plan))
    snapshot = model_state_bytes(n, plan.zero_group, plan.zero_stage)[2]
    if plan.zero_stage == 0:
        return ReplicaRedundancy(snapshot, 0.0, link_time(snapshot, gpu.host_link_gbps), 0.0, "none")
    d2h = link_time(HOST_CROSSINGS * snapshot, gpu.host_link_gbps)
    inside = dp_inside_node(plan)
    exchange = (link_time(snapshot, gpu.nvlink_gbps if inside else gpu.network_gbps)
                + nccl_latency(1, 2, 1 if inside else 2))
    return ReplicaRedundancy(snapshot, snapshot, d2h, exchange, "nvlink" if inside else "network")
