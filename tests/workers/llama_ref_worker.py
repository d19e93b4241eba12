"""One-process worker for tests/integration/test_generate.py: megatron's logits vs hybridpar.llama_ref's.

Usage: python tests/workers/llama_ref_worker.py OUT.json
For the tiny GQA model (4 heads, 2 KV groups), untied and tied embeddings: build a 1-rank Job
(megatron-core GPTModel), push the weights far from their initialisation (matrices x 10, norm
weights randomised: sharp attention, so a wrong head/group/RoPE layout shows), run megatron's
forward on random tokens, gather the canonical weights and run LlamaReference on them. Writes
{case: {"max_diff", "max_logit", "rope_control_diff"}}; the control runs the reference with the
wrong RoPE base, to show the comparison can tell models apart.
"""
from __future__ import annotations

from dataclasses import replace
import os
import sys
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402

sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # an installed hybridpar first

from hybridpar.topology.models import PRESETS  # noqa: E402
from hybridpar.topology.plan import Plan  # noqa: E402

from hybridpar.config.optim import OptimConfig  # noqa: E402
from hybridpar.runtime.llama_ref import LlamaReference, RefOptions  # noqa: E402
from hybridpar.runtime.job import Job  # noqa: E402
from results_io import run_alone  # noqa: E402


def compare(tied: bool, seq: int = 24, rope_theta: float = 10000.0) -> dict:
    """Megatron's logits vs the reference's; the control runs the reference with the other RoPE base."""
    spec = replace(PRESETS["tiny"], rope_theta=rope_theta)
    job = Job(Plan(model=spec, seq_len=seq, global_batch=2, precision="fp32"), OptimConfig(), source=None, seed=7, tied=tied)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in job.chunks[0].parameters():
            if p.dim() == 2:
                p.mul_(10)
            else:
                p.add_(torch.randn(p.shape, generator=gen, device="cpu").to(p.device) * 0.3)
    tokens = torch.randint(0, spec.vocab, (2, seq), generator=gen, device="cpu").to(job.mesh.device)
    positions = torch.arange(seq, device=job.mesh.device).unsqueeze(0).expand_as(tokens)
    with torch.no_grad():
        megatron = job.chunks[0](tokens, positions, None).float()
    weights = job.full_state_dict()
    job.close()
    ref = LlamaReference(spec, weights, RefOptions(rope_base=rope_theta), tied=tied).logits(tokens)
    other_base = 10000.0 if rope_theta != 10000.0 else 500000.0
    wrong = LlamaReference(spec, weights, RefOptions(rope_base=other_base), tied=tied).logits(tokens)
    return {"max_diff": float((megatron - ref).abs().max()), "max_logit": float(megatron.abs().max()),
            "rope_control_diff": float((megatron - wrong).abs().max()), "shape": list(megatron.shape),
            "params": sorted(weights)}


def compare_all() -> dict:
    return {"untied": compare(False), "tied": compare(True), "rope_500k": compare(False, rope_theta=500000.0)}


if __name__ == "__main__":
    run_alone(compare_all)
