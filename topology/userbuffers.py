"""Transformer Engine's userbuffers (Software.tp_comm_overlap): the sequence-parallel TP collectives overlapped
chunk by chunk with the GEMMs they feed or drain."""
from __future__ import annotations

from dataclasses import replace

from .hardware import GPU
from .kernels import gemm_time
from .links import collective_time

# Transformer Engine's userbuffers (Software.tp_comm_overlap), as NeMo's recipes configure them
# (NVIDIA/dgxc-benchmarking v24.11.1 llama3.1/llama3.1_70b.yaml, ub_tp_comm_overlap_cfg) [S]: the
# all-gathers before the QKV and fc1 GEMMs and before the proj and fc2 input-gradient GEMMs are
# `ring_exchange`: tp steps, each multiplying the chunk of tokens at hand while the next arrives over
# NVLink by copy engine (num_sm 1: no SMs taken); the reduce-scatters after the proj and fc2 GEMMs are
# `pipeline`: the GEMM in UB_RS_SPLITS chunks on the SMs the reduce-scatter leaves (set_sm_margin 1), each
# chunk's reduce-scatter beside the next chunk's GEMM, the last one after it. The weight-gradient
# re-gather and the input-gradient reduce-scatter (`bulk`) overlap whole GEMMs as megatron-core's async
# collectives do, on the SMs UB_BULK_SMS gives them rather than NCCL's channels.
UB_RS_SPLITS = 4
UB_RS_SMS = {"proj": 24, "fc2": 16}
# `bulk`: the input re-gather beside the input-gradient GEMM and the input-gradient reduce-scatter beside the
# weight-gradient GEMM, on num_sm SMs each (qkv_dgrad 4, qkv_wgrad 24, fc1_dgrad 2, fc1_wgrad 4).
UB_BULK_SMS = {"qkv": (4, 24), "fc1": (2, 4)}


def ub_ring_exchange(gather_s: float, chunk_gemm_s: float, tp: int) -> float:
    """Seconds of an all-gather of ``gather_s`` fed chunk by chunk into a GEMM of ``chunk_gemm_s`` per
    chunk of 1/tp of the tokens: tp - 1 exchange steps, each beside one chunk's GEMM, then the last
    chunk's GEMM."""
    return (tp - 1) * max(chunk_gemm_s, gather_s / (tp - 1)) + chunk_gemm_s


def ub_pipeline(scatter_s: float, chunk_gemm_s: float) -> float:
    """Seconds of a GEMM in UB_RS_SPLITS chunks of ``chunk_gemm_s`` (on the SMs the reduce-scatter
    leaves) whose output is reduce-scattered, ``scatter_s`` in all, chunk by chunk behind it."""
    step = scatter_s / UB_RS_SPLITS
    return chunk_gemm_s + (UB_RS_SPLITS - 1) * max(chunk_gemm_s, step) + step


def userbuffers_tp_time(gemms: list, tokens: int, token_bytes: int, gpu: GPU, peak: float, in_bytes: int,
                 tp: int, gather_token_bytes: int | None = None) -> tuple[float, float]:
    """Seconds the sequence-parallel TP collectives add beyond their GEMMs under Transformer Engine's
    userbuffers (UB_RS_SPLITS): the forward pass's (QKV and fc1 gathers, proj and fc2 reduce-scatters)
    and the backward's output-gradient gathers before the proj and fc2 input-gradient GEMMs. The gathers move
    ``gather_token_bytes`` per token (fp8: the hidden size), the reduce-scatters ``token_bytes``."""
    (qkv_k, qkv_n, qkv, _, _), (proj_k, proj_n, proj, proj_dgrad, _) = gemms[:2]
    (fc1_k, fc1_n, fc1, _, _), (fc2_k, fc2_n, fc2, fc2_dgrad, _) = gemms[2:]
    gather = collective_time("all-gather", tokens * (gather_token_bytes or token_bytes), tp, 1, gpu.nvlink_gbps, gpu)
    scatter = collective_time("reduce-scatter", tokens * token_bytes, tp, 1, gpu.nvlink_gbps, gpu)
    chunk = -(-tokens // tp)

    def gathered(k: int, n: int, whole: float) -> float:
        return ub_ring_exchange(gather, gemm_time(chunk, k, n, gpu, peak, 1, in_bytes), tp) - whole

    def scattered(k: int, n: int, whole: float, sms: int) -> float:
        rest = replace(gpu, sms=max(1, gpu.sms - sms))  # a GPU file may describe a GPU with fewer SMs
        part = gemm_time(-(-tokens // UB_RS_SPLITS), k, n, rest, peak, 1, in_bytes)
        return ub_pipeline(scatter, part) - whole

    forward = (gathered(qkv_k, qkv_n, qkv) + scattered(proj_k, proj_n, proj, UB_RS_SMS["proj"])
               + gathered(fc1_k, fc1_n, fc1) + scattered(fc2_k, fc2_n, fc2, UB_RS_SMS["fc2"]))
    backward = gathered(proj_n, proj_k, proj_dgrad) + gathered(fc2_n, fc2_k, fc2_dgrad)
    return forward, backward
