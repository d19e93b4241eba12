"""Multi-rank worker for tests/integration/test_recompute.py: one layout, every recompute mode, one launch.

Usage: torchrun --nproc-per-node N tests/workers/recompute_worker.py CONFIG.json
CONFIG: {"out": DIR, "steps": S, "tp": T, "pp": P, "micro_batch": M, "global_batch": G,
         "modes": ["none", "selective", "full"]}
For each mode it builds a Job from the same seed (fresh mesh, model, engine) with
``Plan.recompute = mode``, counts the forward calls of every transformer layer and of every
core-attention module on this rank, and trains S steps. Per mode, rank 0 writes into
DIR/results.json the losses, grad norms, megatron's recompute settings as built, and the
forward calls per layer per micro-batch (summed over ranks and steps, divided by layers x
micro-batches x steps x ranks-holding-them); DIR/<mode>.pt holds the full gathered weights.
"""
from __future__ import annotations

import os
import sys
import traceback
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # an installed hybridpar first

from hybridpar.topology.models import PRESETS  # noqa: E402
from hybridpar.topology.plan import Plan  # noqa: E402

from hybridpar.data import SyntheticTokens  # noqa: E402
from hybridpar.config.optim import OptimConfig  # noqa: E402
from hybridpar.launch.local import init_distributed  # noqa: E402
from hybridpar.runtime.job import Job  # noqa: E402
from results_io import finish  # noqa: E402

MODEL = PRESETS["tiny"]
SEQ = 32


def run_mode(cfg: dict, mode: str) -> tuple[dict, dict]:
    world = dist.get_world_size()
    tp, pp = cfg["tp"], cfg["pp"]
    plan = Plan(model=MODEL, seq_len=SEQ, global_batch=cfg["global_batch"], precision="fp32", tp=tp, pp=pp,
                dp=world // (tp * pp), micro_batch=cfg["micro_batch"], zero_stage=1, recompute=mode)
    assert not plan.violations(), plan.violations()
    optim = OptimConfig(lr=3e-3, min_lr=3e-4, warmup_steps=1, total_steps=cfg["steps"], grad_clip=1.0)
    job = Job(plan, optim, SyntheticTokens(SEQ, plan.global_batch, MODEL.vocab, seed=0), seed=0)
    counts = {"layer": 0, "core_attention": 0}
    layers = attns = 0
    config = None
    for chunk in job.chunks:
        config = chunk.config
        for layer in chunk.decoder.layers:
            layers += 1
            layer.register_forward_hook(lambda *a: counts.__setitem__("layer", counts["layer"] + 1))
            core = layer.self_attention.core_attention
            attns += 1
            core.register_forward_hook(lambda *a: counts.__setitem__("core_attention", counts["core_attention"] + 1))
    losses, norms = [], []
    for step in range(1, cfg["steps"] + 1):
        m = job.train_step(step)
        losses.append(m.loss)
        norms.append(m.grad_norm)
    state = job.full_state_dict()
    per = plan.grad_accum * cfg["steps"]
    local = torch.tensor([counts["layer"], layers * per, counts["core_attention"], attns * per], dtype=torch.float64,
                         device=job.mesh.device)
    dist.all_reduce(local)
    held_out_loss = job.evaluate(job.source.held_out_source(), 1)  # forward-only, after the calls were counted
    result = {
        "eval_loss": held_out_loss,
        "losses": losses, "grad_norms": norms,
        "recompute_granularity": config.recompute_granularity, "recompute_method": config.recompute_method,
        "recompute_num_layers": config.recompute_num_layers, "recompute_modules": list(config.recompute_modules or []),
        "core_attention_class": type(job.chunks[0].decoder.layers[0].self_attention.core_attention).__name__,
        "layer_calls_per_microbatch": float(local[0] / local[1]),
        "attention_calls_per_microbatch": float(local[2] / local[3]),
        "grad_accum": plan.grad_accum,
    }
    job.close()
    return result, state


def rng_rerun_check() -> float:
    """megatron's checkpoint with dropout drawn inside the model-parallel tracker (CPU accommodation 4
    of hybridpar/compat/cpu.py): the rerun in backward must draw the same mask, so the input gradient
    equals the one without checkpointing. Returns the largest difference."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    from megatron.core import tensor_parallel
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    def f(x):
        with get_cuda_rng_tracker().fork():
            return torch.nn.functional.dropout(x, p=0.5, training=True) * x

    grads = []
    for checkpointed in (False, True):
        torch.manual_seed(7)
        states = get_cuda_rng_tracker().get_states()
        x = torch.randn(64, 32, requires_grad=True, device=device)
        y = tensor_parallel.checkpoint(f, False, x) if checkpointed else f(x)
        torch.randn(1000, device=device)  # move the generators on before backward: the rerun must restore them
        with get_cuda_rng_tracker().fork():
            torch.randn(1000, device=device)
        y.sum().backward()
        grads.append(x.grad)
        get_cuda_rng_tracker().set_states(states)
    return float((grads[0] - grads[1]).abs().max())


def main():
    cfg = __import__("json").load(open(sys.argv[1]))
    init_distributed()
    results = {}
    for mode in cfg["modes"]:
        try:
            result, state = run_mode(cfg, mode)
            if dist.get_rank() == 0:
                torch.save(state, os.path.join(cfg["out"], f"{mode}.pt"))
        except Exception:
            if dist.get_world_size() > 1:
                raise
            result = {"error": traceback.format_exc()}
        results[mode] = result
        if dist.get_rank() == 0:
            print(f"recompute {mode}: {result.get('losses')}", flush=True)
    results["rng_rerun_max_diff"] = rng_rerun_check()
    finish(cfg["out"], results)


if __name__ == "__main__":
    main()
