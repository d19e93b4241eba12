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
# ("bf16" where the run's optimizer kept its state in bf16), "reported_memory_gb" (the
# run's published peak) and "sweep" (layouts of one model on one cluster, ranked against each
# other); docs/planner.md gives their provenance.
VALIDATION_PATH = DATA / "validation_runs.json"


# Narayanan et al.'s run script (Megatron-LM examples/sc21/run_table_1.sh) sets DDP=torch for the
# models without pipeline parallelism, DDP=local from 39B up.
TORCH_DDP_RUNS = {"narayanan21-t1-1.7B", "narayanan21-t1-3.6B", "narayanan21-t1-7.5B", "narayanan21-t1-18.4B"}


def load_cases(path: Path = CASES_PATH) -> list[dict]:
    return json.loads(Path(path).read_text())


def _modern(case: dict) -> bool:
    """megatron-core era (2024+): FlashAttention-class kernels, sequence parallelism, untied
    embeddings (Llama 3, Nemotron-4)."""
    profile = PROFILES.get(case.get("software", ""))
    return case["id"].startswith("llama3") or (profile is not None and profile.flash_attention)


def case_software(case: dict) -> tuple[Software, GPU]:
    gpu = get_gpu(case["gpu"].lower())
    if case.get("network_gbit_per_gpu"):
        gpu = replace(gpu, network_gbps=case["network_gbit_per_gpu"] / 8)
    if case.get("software") in PROFILES:
        # e.g. NeMo/megatron-core recipes: distributed optimizer, overlapped grad reduce / param
        # gather / p2p, cuDNN or FlashAttention kernels: hybridpar's layers, classic ZeRO-2.
        sw = PROFILES[case["software"]]
        if case.get("optimizer_state_dtype") == "bf16":
            # apex DistributedFusedAdam with dtype bf16 (nemotron4-340b-synth.yaml): parameter copy
            # and both moments in bf16
            sw = replace(sw, optimizer_state_bytes_per_param=6)
        return sw, gpu
    if case["id"].startswith("llama3"):
        # Llama 3 (2024): FP32 gradient accumulation and reduce-scatter (§3.3.2, as megatron-core's
        # profile); FlashAttention-2 on H100 reaches "only 35% utilization" (FlashAttention-3 paper,
        # abstract).
        # Its ranks are ordered [TP, CP, PP, DP] innermost first (§3.3.2), DP outermost.
        return replace(MEGATRON_CORE, attention_fraction=0.35, dp_inside_pp=False), gpu
    if case["id"].startswith("bloom"):
        # Jean Zay: 4 Omni-Path 100 Gb/s links per 8-GPU node = 6.25 GB/s per GPU (BLOOM README).
        return DEEPSPEED_BF16_PIPE, replace(gpu, network_gbps=4 * 100 / 8 / 8)
    if case["id"] in TORCH_DDP_RUNS:
        return MEGATRON_2021_TORCH_DDP, gpu
    return MEGATRON_2021, gpu


def case_plans(case: dict) -> list[Plan]:
    modern = _modern(case)
    # GPT in Megatron-LM 2021 and BLOOM share the input embedding with the output layer
    # (Megatron's embedding group; BLOOM's TiedLayerSpec); Llama 3 does not.
    m = ModelSpec(case["layers"], case["hidden"], case["ffn_hidden"], case["heads"], case["kv_heads"],
                  case["vocab"], case["mlp"], case["id"], tied_embeddings=case.get("tied_embeddings", not modern))
    out = []
    for mb in [case["micro_batch"]] if case["micro_batch"] else [1, 2]:
        for v in [case["vpp"]] if case["vpp"] else [1, 2, 4, 8]:
            plan = Plan(m, case["seq_len"], case["global_batch_seqs"], tp=case["tp"], cp=case["cp"],
                        pp=case["pp"], dp=case["dp"], vpp=v, micro_batch=mb, zero_stage=case["zero_stage"],
                        recompute=case["recompute"] or "none", sequence_parallel=modern and case["tp"] > 1,
                        precision="fp16" if case["precision"].startswith("fp16") else "bf16",
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
