"""The planner's collective model (topology/links.py: NCCL's per-call latency, then the bytes at
LINK_EFFICIENCY of the link) against measured all-reduce tables by payload.

Source: stas00/ml-engineering network/README.md, "Inter-node speed depends on intra-node speed":
all_reduce_bench.py on 1 and 4 AWS P6-B200 nodes (8 B200 per node, NVLink 5 inside, 8 x 50 GB/s EFA
v4 out), torch 2.9.1, CUDA 13.0, NCCL 2.27.7; bus bandwidth in GB/s (10^9 bytes), payload in KiB.
Nothing here is fitted: the tables check the model, and the bounds below are where it stands
(docs/planner.md, "Collective bandwidth by message size").
"""
from dataclasses import replace

import pytest

from hybridpar.topology.cases import CASES_PATH, JEAN_ZAY_NCCL_GBIT_PER_LINK, case_software, load_cases
from hybridpar.topology.hardware import get_gpu
from hybridpar.topology.links import allreduce_time, dp_link_gbps, group_nodes
from hybridpar.topology.models import PRESETS
from hybridpar.topology.plan import Plan
from hybridpar.topology.software import DEEPSPEED_PIPE_ZERO1, HYBRIDPAR

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


def test_jean_zay_ring_crosses_each_node_over_one_link():
    """BigScience's all-reduce benchmark on Jean Zay (all_reduce_bench-a100-n4.txt: 4 nodes of 8 A100s
    in one ring, a 4 GB fp32 payload) reached a bus bandwidth of 40.5 Gbit/s, the ring entering and
    leaving each node over one Omni-Path link of four. The BLOOM runs' GPU (cases.case_software) gives
    that ring the measurement, and a DP ring with one member per node (TP8) its share of the node's
    four links: 8 rings over 4 links."""
    bloom = next(c for c in load_cases(CASES_PATH) if c["id"].startswith("bloom"))
    _, gpu = case_software(bloom)
    whole_nodes = Plan(PRESETS["llama3-8b"], 2048, 32, dp=32, gpu="a100-80gb")
    gbps = dp_link_gbps(whole_nodes, gpu, DEEPSPEED_PIPE_ZERO1)
    payload = 4e9
    busbw = 2 * 31 / 32 * payload / allreduce_time(payload, 32, 4, gbps) / 1e9 * 8
    assert busbw == pytest.approx(JEAN_ZAY_NCCL_GBIT_PER_LINK, rel=0.01)
    one_per_node = Plan(PRESETS["llama3-8b"], 2048, 64, tp=8, dp=8, gpu="a100-80gb")
    assert dp_link_gbps(one_per_node, gpu, DEEPSPEED_PIPE_ZERO1) == pytest.approx(gbps / 2)


def test_a_ring_cap_binds_only_rings_with_several_members_on_a_node():
    a100 = get_gpu("a100-80gb")
    capped = replace(a100, network_ring_gbps=a100.network_gbps * 1.5)
    four_per_node = Plan(PRESETS["llama3-8b"], 2048, 64, tp=2, dp=32, gpu="a100-80gb")
    one_per_node = Plan(PRESETS["llama3-8b"], 2048, 64, tp=8, dp=8, gpu="a100-80gb")
    assert dp_link_gbps(four_per_node, a100, HYBRIDPAR) == pytest.approx(4 * a100.network_gbps)
    assert dp_link_gbps(four_per_node, capped, HYBRIDPAR) == pytest.approx(1.5 * a100.network_gbps)
    assert dp_link_gbps(one_per_node, capped, HYBRIDPAR) == dp_link_gbps(one_per_node, a100, HYBRIDPAR)
