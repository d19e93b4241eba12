"""Multi-rank worker for tests/integration/test_checkpoint_resume.py and tests/integration/test_checkpoint_bf16.py: several checkpoint jobs in one launch.

Usage: torchrun --nproc-per-node N tests/workers/checkpoint_worker.py CONFIG.json
CONFIG: {"out": DIR, "jobs": [JOB, ...]}, each JOB:
  name, layout {tp, cp, pp, dp, vpp, zero, micro_batch}, tied (bool), precision ("fp32", the default,
  or "bf16"), total_steps (the LR schedule's length),
  first/last (the steps to train), load (checkpoint path or null), save_after_load (a save dir:
  save right after loading, before training), save_dir + save_every (periodic saves),
  expect_error (load only, and report every rank's CheckpointError message).
Each job builds a fresh Job (mesh, model, engine); rank 0 writes DIR/results.json:
{name: {"losses": {step: loss}, "grad_norms": {...}, "resumed_from": step, "seconds": s,
"model_freed": whether the job's weights were freed once it was closed and its groups destroyed}}.
"""
from __future__ import annotations

import json
import os
import sys
import time
import warnings
import weakref
from dataclasses import replace

warnings.filterwarnings("ignore")

import torch.distributed as dist  # noqa: E402

sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # an installed hybridpar first

from hybridpar.topology.models import ModelSpec  # noqa: E402
from hybridpar.topology.plan import Plan  # noqa: E402

from hybridpar.checkpoint import CheckpointConfig, CheckpointError, Checkpointer, load_checkpoint, save_checkpoint  # noqa: E402
from hybridpar.data import SyntheticTokens  # noqa: E402
from hybridpar.config.optim import OptimConfig  # noqa: E402
from hybridpar.launch.local import init_distributed  # noqa: E402
from process_groups import destroy_groups_created_since, groups_now  # noqa: E402
from results_io import finish  # noqa: E402
from hybridpar.runtime.job import Job  # noqa: E402

# 8 query heads over 4 KV heads: TP 1, 2 and 4 all divide it.
MODEL = ModelSpec(layers=4, hidden=64, ffn_hidden=176, heads=8, kv_heads=4, vocab=320, name="test-gqa")
SEQ, GLOBAL_BATCH = 32, 16


def make_job(spec: dict) -> Job:
    lay = spec["layout"]
    model = replace(MODEL, tied_embeddings=True) if spec.get("tied") else MODEL
    plan = Plan(
        model=model, seq_len=SEQ, global_batch=GLOBAL_BATCH, precision=spec.get("precision", "fp32"),
        tp=lay.get("tp", 1), pp=lay.get("pp", 1), dp=lay.get("dp", 1), vpp=lay.get("vpp", 1), cp=lay.get("cp", 1),
        micro_batch=lay.get("micro_batch", 2), zero_stage=lay.get("zero", 1),
    )
    assert not plan.violations(), plan.violations()
    optim = OptimConfig(lr=1e-2, min_lr=1e-3, warmup_steps=2, total_steps=spec["total_steps"], grad_clip=1.0)
    return Job(plan, optim, SyntheticTokens(SEQ, GLOBAL_BATCH, MODEL.vocab, seed=0), seed=0)


def run_job(spec: dict) -> dict:
    job = make_job(spec)
    spec["_a_weight"] = weakref.ref(next(job.chunks[0].parameters()))  # freed once the job is closed?
    first, resumed = spec.get("first", 1), None
    if spec.get("expect_error"):  # a damaged checkpoint: every rank must raise the same one-line error
        try:
            load_checkpoint(job, spec["load"])
            message = None
        except CheckpointError as err:
            message = str(err)
        messages = [None] * dist.get_world_size()
        dist.all_gather_object(messages, message)
        job.close()
        return {"errors": messages}
    if spec.get("load"):
        resumed = load_checkpoint(job, spec["load"])
        first = resumed + 1
    if spec.get("save_after_load"):
        save_checkpoint(job, spec["save_after_load"], resumed or 0)
    hook = Checkpointer(CheckpointConfig(save_dir=spec.get("save_dir"), save_every=spec.get("save_every", 0)),
                        last_step=spec["last"], print_fn=None)
    losses, norms = {}, {}
    for step in range(first, spec["last"] + 1):
        m = job.train_step(step)
        losses[step], norms[step] = m.loss, m.grad_norm
        hook.on_step(job, m)
    job.close()
    return {"losses": losses, "grad_norms": norms, "resumed_from": resumed}


def main():
    cfg = json.load(open(sys.argv[1]))
    init_distributed()
    results = {}
    for spec in cfg["jobs"]:
        start = time.perf_counter()
        groups_before = groups_now()
        results[spec["name"]] = run_job(spec)
        destroy_groups_created_since(groups_before)  # process_groups.py: else each job slows the next
        results[spec["name"]]["model_freed"] = spec.pop("_a_weight")() is None
        results[spec["name"]]["seconds"] = time.perf_counter() - start
        if dist.get_rank() == 0:
            print(f"job {spec['name']}: {time.perf_counter() - start:.1f} s", flush=True)
    finish(cfg["out"], results)


if __name__ == "__main__":
    main()
