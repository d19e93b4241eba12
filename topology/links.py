"""Where a layout's traffic runs and what moving it costs: which links a group's collectives
cross (the stack's rank order decides which ranks share a node), NCCL's latency per call and the
bandwidth its collectives reach. topology/cost.py adds these up into a step.
"""
from __future__ import annotations

from math import ceil

from .collectives import measured_time
from .hardware import GPU
from .plan import Plan
from .software import HYBRIDPAR, Software

# Fraction of a link's peak that NCCL collectives reach as bus bandwidth (nccl-tests on DGX
# A100/H100 reach roughly 75-85% of NVLink and InfiniBand peak; DeepSeek-V3 measures 160 of
# H800's 200 GB/s NVLink) [S]. Assumed, not fitted. Check on A100: 8 A100 80GB through NVSwitch (Azure
# NDm A100 v4, NCCL 2.17.1, 1 GB in place) reach 231 GB/s all-reduce and 254 GB/s all-gather bus
# bandwidth (microsoft/mscclpp docs/performance-ndmv4.md) [M], against 0.8 x 300 = 240 here.
LINK_EFFICIENCY = 0.8
# Per-call latency of a collective: NCCL's own tuning model (NVIDIA/nccl src/graph/tuning.cc,
# ncclTopoTuneModel, Ring/Simple, the protocol of large messages): baseLat 8.4 us, plus hwLat per ring
# step, 3.4 us over NVLink and 9.6 us over the network; a ring all-reduce across nodes pays 1.9x
# ("plateau effect of ring", ncclTopoGetAlgoTime). Steps: 2(n-1) for an all-reduce, n-1 for a
# reduce-scatter or all-gather, 1 for a pipeline send/receive.
NCCL_BASE_LAT_S = 8.4e-6
NCCL_HOP_LAT_S = {"nvlink": 3.4e-6, "network": 9.6e-6}
NCCL_RING_PLATEAU = 1.9
# NCCL runs a collective as one CUDA block per channel, each holding an SM while the collective
# lasts. An 8-GPU NVSwitch node's rings use 24 channels on A100 (NVIDIA/nccl-tests#100, an HGX A100
# log: "Channel 23/24") and on H100 (NVIDIA developer forum, "Compute-communication overlap causes
# severe GEMM performance degradation", an FSDP trace: ncclAllGather runs 24 blocks beside a GEMM on
# 132 SMs); a ring across nodes 16 (NVIDIA/nccl#1453, 3 nodes of 8 H100s: "Channel 00/16") [S].
# Compute overlapped with a collective has the other SMs: it loses the collective's blocks / sms of
# its rate while the collective runs (sm_contention). Check: Lee et al. 2025, "Characterizing
# Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning" (arXiv 2507.03114),
# measured compute slowed by 18.9% on average (40% at most) under overlapped communication on A100
# and H100 [R]; 24/108 = 22%, 24/132 = 18%. Not counted: the collective's HBM traffic, and the extra
# wave a one-wave GEMM needs with fewer SMs (the forum trace's near-doubling).
NCCL_COLLECTIVE_CTAS = {"nvlink": 24, "network": 16}


def link_time(nbytes: float, gbps: float) -> float:
    return nbytes / (gbps * 1e9 * LINK_EFFICIENCY)


def nccl_sm_share(gpu: GPU, nodes: int) -> float:
    """The share of the GPU's SMs an NCCL collective over ``nodes`` nodes holds (NCCL_COLLECTIVE_CTAS)."""
    return NCCL_COLLECTIVE_CTAS["network" if nodes > 1 else "nvlink"] / gpu.sms


def sm_contention(hidden_s: float, gpu: GPU, nodes: int) -> float:
    """Compute time lost while a collective over ``nodes`` nodes runs ``hidden_s`` seconds behind
    it (NCCL_COLLECTIVE_CTAS): its SMs work for NCCL, not for the compute."""
    return hidden_s * nccl_sm_share(gpu, nodes)


def nccl_latency(steps: int, ranks: int, nodes: int, allreduce: bool = False) -> float:
    """Latency of one NCCL call of `steps` ring steps over `ranks` ranks on `nodes` nodes, in NCCL's
    own cost model (see NCCL_BASE_LAT_S): the steps that cross nodes pay the network hop."""
    if ranks <= 1:
        return 0.0
    inter = steps * (nodes - 1) / (ranks - 1)
    lat = NCCL_BASE_LAT_S + (steps - inter) * NCCL_HOP_LAT_S["nvlink"] + inter * NCCL_HOP_LAT_S["network"]
    return lat * (NCCL_RING_PLATEAU if allreduce and nodes > 1 else 1.0)


def allreduce_time(nbytes: float, ranks: int, nodes: int, gbps: float, gpu: GPU | None = None) -> float:
    """One all-reduce of ``nbytes`` on each of ``ranks`` ranks over ``nodes`` nodes (collective_time)."""
    return collective_time("all-reduce", nbytes, ranks, nodes, gbps, gpu)


def collective_time(op: str, nbytes: float, ranks: int, nodes: int, gbps: float, gpu: GPU | None = None) -> float:
    """One NCCL ``op`` ("all-reduce", "all-gather", "reduce-scatter") of ``nbytes`` in nccl-tests'
    convention (each rank's buffer; the gathered output; the input before scattering) over ``ranks``
    ranks on ``nodes`` nodes, on links of ``gbps``. Inside one node of a GPU with a measured table
    (GPU.nvlink_collectives, topology/collectives.py) for that group size: the measured time. Otherwise
    the ring model: each rank moves (n-1)/n of the bytes over its link (2(n-1)/n for an all-reduce) at
    LINK_EFFICIENCY, plus NCCL's latency for the ring's steps."""
    if ranks <= 1:
        return 0.0
    if nodes == 1 and gpu is not None and gpu.nvlink_collectives:
        measured = measured_time(gpu.nvlink_collectives, op, nbytes, ranks)
        if measured is not None:
            return measured
    allreduce = op == "all-reduce"
    steps = (2 if allreduce else 1) * (ranks - 1)
    return link_time(steps / ranks * nbytes, gbps) + nccl_latency(steps, ranks, nodes, allreduce=allreduce)


def group_nodes(ranks: int, span: int, gpus_per_node: int) -> int:
    """Nodes a group of `ranks` ranks, spread evenly over `span` consecutive GPUs, touches."""
    return max(1, min(ranks, ceil(span / gpus_per_node)))


def dp_ranks_per_node(plan: Plan, sw: Software = HYBRIDPAR) -> int:
    """Members of a rank's DP x CP group (the group its gradients are reduced over) on its node.
    hybridpar lays ranks out [TP, CP, PP, DP] innermost first, as Llama 3 did: CP peers are TP
    ranks apart, DP peers TP x CP x PP apart. Megatron-LM puts DP inside PP (megatron-core
    parallel_state order "tp-cp-ep-dp-pp"; Megatron-LM 2021's and DeepSpeed's
    PipeModelDataParallelTopology, axes pipe, data, model): the DP x CP group is every TP-th rank
    of a block, so with TP < GPUs per node several of its members share a node."""
    g = plan.gpus_per_node
    if sw.dp_inside_pp:
        return max(1, min(plan.zero_group, g // plan.tp))
    return max(1, min(plan.cp, g // plan.tp)) * max(1, min(plan.dp, g // (plan.tp * plan.cp * plan.pp)))


def dp_inside_node(plan: Plan, sw: Software = HYBRIDPAR) -> bool:
    """Whether DP traffic stays on NVLink: the whole DP x CP group on one node."""
    return dp_ranks_per_node(plan, sw) >= plan.zero_group


def pp_crosses_nodes(plan: Plan, sw: Software = HYBRIDPAR) -> bool:
    """Whether some pipeline hop leaves its node: pipeline peers are TP x CP ranks apart in hybridpar's
    order, TP x CP x DP in Megatron's (dp_ranks_per_node)."""
    stride = plan.tp * plan.cp * (plan.dp if sw.dp_inside_pp else 1)
    return stride * plan.pp > plan.gpus_per_node


def dp_link_gbps(plan: Plan, gpu: GPU, sw: Software) -> float:
    """Bandwidth of the DP x CP ring's slowest hop. Inside a node: NVLink. Across nodes, a node's
    m members of the ring are consecutive in it, and the node holds the rings of its other
    GPUs too: each ring leaves the node once, over m GPUs' NICs' worth of the node's links
    (NCCL spreads a communicator's channels over the node's NICs; nccl-tests' cross-node
    all-reduce bus bandwidth with all 8 GPUs of each node in the communicator is the node's
    NIC bandwidth, not one GPU's) [S]; no more than one NIC's where the cluster's NCCL was measured
    to take one per ring (GPU.network_ring_gbps)."""
    if dp_inside_node(plan, sw):
        return gpu.nvlink_gbps
    spread = min(gpu.nvlink_gbps, dp_ranks_per_node(plan, sw) * gpu.network_gbps)
    return spread if gpu.network_ring_gbps is None else min(spread, gpu.network_ring_gbps)
