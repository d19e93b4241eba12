"""The published runs of ../shared/cases/public_cases.json as Plans, with the software and
network each run actually had (from its paper or README), for checking the planner.

Nothing here is tuned to the reported throughput: each case's layout is evaluated as given;
an unpublished micro-batch or virtual-stage count is chosen by the planner (fastest that fits).
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from .hardware import GPU, get_gpu
from .links import LINK_EFFICIENCY
from .models import ModelSpec
from .plan import Plan
from .search import Evaluated, evaluate
from .software import DEEPSPEED_BF16_PIPE, MEGATRON_2021, MEGATRON_2021_TORCH_DDP, MEGATRON_CORE, PROFILES, Software

# The planner's own data, installed with it (topology/data/). public_cases.json is a copy of the
# project's shared/cases/public_cases.json (a test keeps the two equal where shared/ is present).
DATA = Path(__file__).resolve().parent / "data"
CASES_PATH = DATA / "public_cases.json"
# Out-of-sample runs, same fields plus "software" (a topology.software profile name) and, where
# they apply, "network_gbit_per_gpu" (the cluster's scale-out NIC per GPU), "tied_embeddings",
# "outcome" ("ran", or "oom": the layout ran out of memory, no timing), "optimizer_state_dtype"
# ("bf16" where the run's optimizer kept its state in bf16), "rotary" and "dropout" (where the
# model differs from its profile: false / true for GPT-3), "attention_kernel" (where the run's
# attention was not FlashAttention-2-class: "triton" for MosaicML's MPT runs), "cross_entropy" (where the
# run's loss kernel was not megatron's unfused one: "vocab-parallel-fused" for NeMo 2's, "fused-16bit" for
# MosaicML's), "attention_fraction"
# (FlashAttention-2's rate on the run's GPU where the catalogue's is another kernel's: 0.35 on H100,
# FlashAttention-3 paper), "tp_comm_overlap" (true where the run's recipe set up Transformer Engine's
# userbuffers: NeMo's ub_tp_comm_overlap, megatron-core's --tp-comm-overlap), "norm_fusion" (false where the
# run's RMSNorm was PyTorch operations: torchtitan's norm_type rmsnorm), "reported_memory_gb" (the
# run's published peak), "sweep" (layouts of one model on one cluster, ranked against each other) and
# "stack" (the software family that ran it, case_stack); docs/planner.md gives their provenance.
VALIDATION_PATH = DATA / "validation_runs.json"


# Jean Zay's A100 partition, where BLOOM and its layout sweep ran: 4 Omni-Path links of 100 Gbit/s per
# 8-GPU node (BLOOM README), of which NCCL reached far less. bigscience-workshop/bigscience
# experiments/bandwidth/all_reduce_bench-a100-n4.txt (4 of those nodes, 32 A100s, NCCL 2.10.3, a 4 GB
# fp32 all-reduce timed 160 times, January 2022) [M]: bus bandwidth median 40.5 Gbit/s (14.7-40.8), for
# a ring that entered and left each node over one Omni-Path link (its log: "via NET/IB/1" in,
# "NET/IB/3" out, 2 channels), 41% of that link's 100 Gbit/s. Assumed: a link carries no more when
# several rings share it, as each of a TP=8 layout's 8 DP rings per node does over its 4 links. The
# planner derates a link by LINK_EFFICIENCY; the measured figure is already what NCCL reaches, so it
# enters as 4 x 40.5 / 8 Gbit/s per GPU over that factor. The benchmark's ring had all 8 GPUs of each node
# and still crossed over one link: a ring with several members on a node (DP inside PP at TP < 8) is held
# to one link's 40.5 Gbit/s (GPU.network_ring_gbps), not its members' share of the four.
JEAN_ZAY_NCCL_GBIT_PER_LINK = 40.5
JEAN_ZAY_NETWORK_GBPS = 4 * JEAN_ZAY_NCCL_GBIT_PER_LINK / 8 / 8 / LINK_EFFICIENCY
JEAN_ZAY_RING_GBPS = JEAN_ZAY_NCCL_GBIT_PER_LINK / 8 / LINK_EFFICIENCY

# Narayanan et al.'s run script (Megatron-LM examples/sc21/run_table_1.sh) sets DDP=torch for the
# models without pipeline parallelism, DDP=local from 39B up.
TORCH_DDP_RUNS = {"narayanan21-t1-1.7B", "narayanan21-t1-3.6B", "narayanan21-t1-7.5B", "narayanan21-t1-18.4B"}


def load_cases(path: Path = CASES_PATH) -> list[dict]:
    return json.loads(Path(path).read_text())


# The stack family of the public cases, whose file (a copy of the shared one) has no "stack" field.
PUBLIC_CASE_STACKS = (("llama3", "Llama 3 (Meta)"), ("narayanan21", "Megatron-LM 2021"),
                      ("bloom", "Megatron-DeepSpeed (BigScience)"))


def case_stack(case: dict) -> str:
    """The software family a published run trained on: the validation statistics are given per stack."""
    if "stack" in case:
        return case["stack"]
    return next(stack for prefix, stack in PUBLIC_CASE_STACKS if case["id"].startswith(prefix))


def _modern(case: dict) -> bool:
    """megatron-core era (2024+): FlashAttention-class kernels, sequence parallelism, untied
    embeddings (Llama 3, Nemotron-4)."""
    profile = PROFILES.get(case.get("software", ""))
    return case["id"].startswith("llama3") or (profile is not None and profile.flash_attention)


def case_software(case: dict) -> tuple[Software, GPU]:
    sw, gpu = _profile(case), get_gpu(case["gpu"].lower())
    if case.get("network_gbit_per_gpu"):
        gpu = replace(gpu, network_gbps=case["network_gbit_per_gpu"] / 8)
    if case["id"].startswith("bloom"):
        # BLOOM and its sweep ran on Jean Zay (JEAN_ZAY_NETWORK_GBPS) with CUDA_LAUNCH_BLOCKING=1 from the
        # 02-17 tables on, the workaround for NCCL hangs at 320+ GPUs (chronicles-prequel.md, "dealing
        # with JZ hanging on the large model"; tr11-176B-ml.slurm exports it for the production run).
        sw = replace(sw, launch_blocking=True)
        gpu = replace(gpu, network_gbps=JEAN_ZAY_NETWORK_GBPS, network_ring_gbps=JEAN_ZAY_RING_GBPS)
    return sw, gpu


def _profile(case: dict) -> Software:
    """The software profile of the stack that ran the case."""
    if case.get("software") in PROFILES:
        # e.g. NeMo/megatron-core recipes: distributed optimizer, overlapped grad reduce / param
        # gather / p2p, cuDNN or FlashAttention kernels: hybridpar's layers, classic ZeRO-2.
        sw = PROFILES[case["software"]]
        if case.get("optimizer_state_dtype") == "bf16":
            # apex DistributedFusedAdam with dtype bf16 (nemotron4-340b-synth.yaml): parameter copy
            # and both moments in bf16
            sw = replace(sw, optimizer_state_bytes_per_param=6)
        # The model's own architecture where it differs from the profile's Llama-style default:
        # GPT-3 on NeMo (gpt3_175b_hydra.yaml) has learned absolute positions (NeMo's default
        # position_embedding_type) and hidden and attention dropout 0.1.
        return replace(sw, rotary=case.get("rotary", sw.rotary), dropout=case.get("dropout", sw.dropout),
                       attention_kernel=case.get("attention_kernel", sw.attention_kernel),
                       cross_entropy=case.get("cross_entropy", sw.cross_entropy),
                       attention_fraction=case.get("attention_fraction", sw.attention_fraction),
                       tp_comm_overlap=case.get("tp_comm_overlap", sw.tp_comm_overlap),
                       norm_fusion=case.get("norm_fusion", sw.norm_fusion),
                       fp8_params=case.get("fp8_params", sw.fp8_params),
                       fp8_param_gather=case.get("fp8_param_gather", sw.fp8_param_gather),
                       fp8_scaling=case.get("fp8_scaling", sw.fp8_scaling))
    if case["id"].startswith("llama3"):
        # Llama 3 (2024): FP32 gradient accumulation and reduce-scatter (§3.3.2, as megatron-core's
        # profile); FlashAttention-2 on H100 reaches "only 35% utilization" (FlashAttention-3 paper,
        # abstract).
        # Its ranks are ordered [TP, CP, PP, DP] innermost first (§3.3.2), DP outermost.
        # Its CP all-gathers K and V before the attention (§3.3.2), no ring.
        return replace(MEGATRON_CORE, attention_fraction=0.35, dp_inside_pp=False, cp_ring_overlap=False)
    if case["id"].startswith("bloom"):
        return DEEPSPEED_BF16_PIPE
    if case["id"] in TORCH_DDP_RUNS:
        return MEGATRON_2021_TORCH_DDP
    return MEGATRON_2021


# Where a run does not publish its micro-batch, the planner costs these and keeps the fastest that fits.
UNPUBLISHED_MICRO_BATCHES = (1, 2)
UNPUBLISHED_VPPS = (1, 2, 4, 8)


def _virtual_stage_choices(layers: int, pp: int) -> list[int]:
    """Virtual stages per pipeline rank an unpublished VPP may be: 1, 2, 4 or 8 (Plan.violations drops
    the ones the layout cannot take); where each rank's layers split into none of those, as 7 per rank,
    every count that splits them evenly (Megatron's --num-layers-per-virtual-pipeline-stage), so a
    pipelined run is not costed without the interleaving its layer count allows."""
    per_rank = layers // pp if pp > 1 and layers % pp == 0 else 0
    if not per_rank or any(per_rank % v == 0 for v in UNPUBLISHED_VPPS[1:]):
        return list(UNPUBLISHED_VPPS)
    return [1] + [v for v in range(2, per_rank + 1) if per_rank % v == 0]


def case_plans(case: dict) -> list[Plan]:
    modern = _modern(case)
    # GPT in Megatron-LM 2021 and BLOOM share the input embedding with the output layer
    # (Megatron's embedding group; BLOOM's TiedLayerSpec); Llama 3 does not.
    m = ModelSpec(case["layers"], case["hidden"], case["ffn_hidden"], case["heads"], case["kv_heads"],
                  case["vocab"], case["mlp"], case["id"], tied_embeddings=case.get("tied_embeddings", not modern))
    out = []
    unpublished = _virtual_stage_choices(case["layers"], case["pp"]) if _profile(case).interleaved_pipeline else [1]
    for mb in [case["micro_batch"]] if case["micro_batch"] else UNPUBLISHED_MICRO_BATCHES:
        for v in [case["vpp"]] if case["vpp"] else unpublished:
            plan = Plan(m, case["seq_len"], case["global_batch_seqs"], tp=case["tp"], cp=case["cp"],
                        pp=case["pp"], dp=case["dp"], vpp=v, micro_batch=mb, zero_stage=case["zero_stage"],
                        recompute=case["recompute"] or "none",
                        sequence_parallel=case.get("sequence_parallel", modern) and case["tp"] > 1,
                        precision=next((p for p in ("fp16", "fp8") if case["precision"].startswith(p)), "bf16"),
                        gpu=case["gpu"].lower(),
                        lighter_end_stages=case["pp"] > 1 and case["layers"] % case["pp"] != 0)
            if not plan.violations():
                out.append(plan)
    return out


def predict_case(case: dict) -> Evaluated:
    """The published layout, costed whether or not it fits (a run that went out of memory too)."""
    sw, gpu = case_software(case)
    results = [evaluate(p, sw, gpu) for p in case_plans(case)]
    fitting = [e for e in results if e.fits] or results
    return min(fitting, key=lambda e: e.cost.step_time_s)
