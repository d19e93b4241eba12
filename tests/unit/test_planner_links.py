"""The planner's collective model (topology/links.py: NCCL's per-call latency, then the bytes at
LINK_EFFICIENCY of the link) against measured all-reduce tables by payload.

Source: stas00/ml-engineering network/README.md, "Inter-node speed depends on intra-node speed":
all_reduce_bench.py on 1 and 4 AWS P6-B200 nodes (8 B200 per node, NVLink 5 inside, 8 x 50 GB/s EFA
v4 out), torch 2.9.1, CUDA 13.0, NCCL 2.27.7; bus bandwidth in GB/s (10^9 bytes), payload in KiB.
Nothing here is fitted: the tables check the model, and the bounds below are where it stands
(docs/planner.md, "Collective bandwidth by message size").
"""
import pytest

from hybridpar.topology.hardware import get_gpu
from hybridpar.topology.links import allreduce_time, dp_link_gbps, group_nodes
from hybridpar.topology.models import PRESETS
from hybridpar.topology.plan import Plan
from hybridpar.topology.software import HYBRIDPAR

ONE_NODE = {32: 1.20, 64: 2.17, 128: 4.86, 256: 9.54, 512: 18.71, 1024: 36.06, 2048: 63.09, 4096: 76.48,
            8192: 126.49, 16384: 254.96, 32768: 325.97, 65536: 400.60, 131072: 568.38, 262144: 646.11,
            524288: 688.99, 1048576: 723.34, 2097152: 734.97}
FOUR_NODES = {1024: 5.37, 2048: 10.38, 4096: 18.90, 8192: 35.12, 16384: 64.43, 32768: 91.19, 65536: 156.74,
              131072: 197.94, 262144: 229.09, 524288: 326.90, 1048576: 361.99, 2097152: 372.42}


def ratios(table: dict, ranks: int) -> dict:
    """Predicted / measured bus bandwidth of a ring all-reduce over `ranks` B200s, 8 per node, on the
    link the planner gives a DP ring of that many ranks (links.dp_link_gbps)."""
    b200 = get_gpu("b200-180gb")
    ring = Plan(PRESETS["llama3-8b"], 8192, ranks, dp=ranks, gpu="b200-180gb")
    gbps, nodes = dp_link_gbps(ring, b200, HYBRIDPAR), group_nodes(ranks, ranks, b200.gpus_per_node)
    out = {}
    for kib, measured in table.items():
        payload = kib * 1024
        busbw = 2 * (ranks - 1) / ranks * payload / allreduce_time(payload, ranks, nodes, gbps) / 1e9
        out[kib] = busbw / measured
    return out


def test_one_node_all_reduce_from_32_kib_to_2_gib():
    """Inside a node the model is within 16% below and 52% above the measurement; it is most
    optimistic at 4-64 MiB, a regime that a constant link efficiency does not describe (the table
    does not say why NCCL is slower there)."""
    r = ratios(ONE_NODE, 8)
    assert all(0.8 <= x <= 1.6 for x in r.values()), r
    assert all(x <= 1.0 for kib, x in r.items() if kib <= 1024), "latency-bound payloads: NCCL's model is the slower"
    assert all(abs(x - 1) <= 0.05 for kib, x in r.items() if kib >= 512 * 1024), "large payloads: 80% of NVLink"


def test_four_nodes_all_reduce_from_1_mib_to_2_gib():
    """Across 4 nodes (a 32-rank ring leaving each node over its 8 NICs, links.dp_link_gbps) the model
    is within 25% below and 10% above from 1 MiB on: conservative at large payloads, where NCCL
    reached 73% of the NICs' line rate and the model assumes 80% of one ring's share of them."""
    r = ratios(FOUR_NODES, 32)
    assert all(0.75 <= x <= 1.1 for x in r.values()), r
    assert r[2097152] == pytest.approx(0.83, abs=0.02)
