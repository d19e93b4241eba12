"""Multi-rank worker for tests/integration/test_runtime.py: many layouts in one launch.

Usage: torchrun --nproc-per-node N tests/workers/runtime_worker.py CONFIG.json
CONFIG: {"out": DIR, "steps": S, "layouts": [{"name": ..., "tp":..., ...}], "record": [names]}
For each layout it builds a Job (fresh mesh, model, engine), trains S steps, evaluates the held-out
loss after step 2 and after the last, checks after every step that every rank holding the same weights (its dp_cp group: the DP replicas and, with CP, the
CP ranks) holds bit-identical parameters (ReplicaCheck's digests, gathered over dp_cp), and, for
layouts named in "record", logs every collective and p2p of one training step with its group.
Rank 0 writes DIR/results.json and DIR/<name>.pt (the full gathered weights).
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # an installed hybridpar first

from hybridpar.topology.models import ModelSpec  # noqa: E402
from hybridpar.topology.plan import Plan  # noqa: E402

from hybridpar.observe.comm_trace import Recorder  # noqa: E402  (shared with benchmarks/comm.py)
from hybridpar.data import SyntheticTokens  # noqa: E402
from hybridpar.config.optim import OptimConfig  # noqa: E402
from hybridpar.launch.local import init_distributed  # noqa: E402
from process_groups import destroy_groups_created_since, groups_now, thread_count  # noqa: E402
from results_io import finish  # noqa: E402
from hybridpar.reliability.replicas import gather_digests  # noqa: E402
from hybridpar.runtime.job import Job  # noqa: E402
from hybridpar.runtime.model import canonical_params  # noqa: E402

# GQA test model: 8 query heads over 4 KV heads, so TP 4 divides both.
MODEL = ModelSpec(layers=4, hidden=64, ffn_hidden=176, heads=8, kv_heads=4, vocab=320, name="test-gqa")
SEQ, GLOBAL_BATCH = 32, 16
EVAL_AFTER, EVAL_BATCHES = 2, 2  # held-out loss (Job.evaluate) after step 2 and after the last


def make_job(cfg: dict, layout: dict) -> Job:
    model = MODEL if not layout.get("tied") else ModelSpec(**{**MODEL.to_dict(), "tied_embeddings": True})
    if layout.get("layers"):
        model = ModelSpec(**{**model.to_dict(), "layers": layout["layers"]})
    plan = Plan(
        model=model, seq_len=SEQ, global_batch=GLOBAL_BATCH, precision="fp32",
        tp=layout.get("tp", 1), pp=layout.get("pp", 1), dp=layout.get("dp", 1), vpp=layout.get("vpp", 1),
        cp=layout.get("cp", 1),
        micro_batch=layout.get("micro_batch", 2), zero_stage=layout.get("zero", 1),
        sequence_parallel=layout.get("sp", False),
    )
    plan = plan.with_default_split()  # lighter end stages where layers + 2 divide and layers do not
    assert not plan.violations(), plan.violations()
    assert plan.lighter_end_stages == bool(layout.get("lighter")), (layout, plan.lighter_end_stages)
    lr = layout.get("lr", cfg.get("lr", 3e-3))
    optim = OptimConfig(lr=lr, min_lr=lr / 10, warmup_steps=2, total_steps=cfg["steps"],
                        grad_clip=cfg.get("grad_clip", 1.0), eps=layout.get("eps", cfg.get("eps", 1e-8)))
    source = SyntheticTokens(SEQ, GLOBAL_BATCH, MODEL.vocab, seed=0)
    if layout.get("fixed_batch"):  # the same batch every step: the model must memorise it
        source = FixedBatch(source.global_batch(1))
    overlap = dict(overlap_grad_reduce=layout.get("overlap", True), overlap_param_gather=layout.get("overlap", True))
    if layout.get("bucket"):  # small buckets: many reductions issued while the backward runs
        overlap["grad_bucket_numel"] = layout["bucket"]
    return Job(plan, optim, source, seed=0, **overlap)


class FixedBatch:
    def __init__(self, batch):
        self.batch, self.global_batch_size = batch, batch.shape[0]

    def global_batch(self, step):
        return self.batch

    def rows(self, step, start, stop):
        return self.batch[start:stop]


def run_layout(cfg, layout, recorder):
    job = make_job(cfg, layout)
    mesh = job.mesh
    initial = job.full_state_dict() if layout.get("independent") else None  # one process: all weights
    losses, norms, lrs, identical, times, in_flight, evals = [], [], [], [], [], [], []
    held = job.source.held_out_source() if hasattr(job.source, "held_out_source") else None
    for step in range(1, cfg["steps"] + 1):
        record = layout["name"] in cfg.get("record", []) and step == 2
        recorder.events.clear()
        recorder.active = record
        m = job.train_step(step)
        recorder.active = False
        gather = job.engine.param_gather  # read before job.chunks, which waits for the gather
        in_flight.append(bool(gather is not None and gather.pending))
        if record:
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, {"rank": dist.get_rank(), "events": list(recorder.events), "groups": mesh.members})
            if dist.get_rank() == 0:
                with open(os.path.join(cfg["out"], f"{layout['name']}.events.json"), "w") as f:
                    json.dump(gathered, f)
        _, digests, _ = gather_digests(canonical_params(job.chunks), mesh)
        same = torch.tensor([1 if all(d == digests[0] for d in digests) else 0], device=mesh.device)
        dist.all_reduce(same, op=dist.ReduceOp.MIN)
        identical.append(bool(same.item()))
        losses.append(m.loss)
        norms.append(m.grad_norm)
        lrs.append(m.lr)
        times.append(m.step_time_s)
        if held is not None and step in (EVAL_AFTER, cfg["steps"]):  # between steps: training must go on unchanged
            evals.append(job.evaluate(held, EVAL_BATCHES))
    sync = job.engine.grad_sync  # DP reduction overlapped with the last backward (grad_sync.py)
    overlap = [len(sync.buckets), job.engine.buckets_issued_in_backward] if sync else None
    overlaps = [None] * dist.get_world_size()
    dist.all_gather_object(overlaps, overlap)
    numels = [None] * dist.get_world_size()  # (gradient elements, those reduced whole) per rank
    dist.all_gather_object(numels, [sum(p.numel() for c in job.chunks for p in c.parameters()),
                                    sum(p.numel() for p in job.engine.whole_grad_params)])
    layers = [None] * dist.get_world_size()
    dist.all_gather_object(layers, [len(c.decoder.layers) for c in job.chunks])
    state = job.full_state_dict()
    # Strict device mode (tests/conftest.py) in every rank, and the gathered weights on rank 0's CPU only.
    held = [None] * dist.get_world_size()
    dist.all_gather_object(held, {"default_device": str(torch.get_default_device()), "state_keys": len(state),
                                  "state_devices": sorted({str(t.device) for t in state.values()})})
    inner = job.engine.engine.optimizer
    inner = getattr(inner, "optimizer", inner)  # ZeRO wraps the client torch optimizer
    opt_numel = sum(s["exp_avg"].numel() for s in inner.state.values() if "exp_avg" in s)
    plain = _plain_reference(cfg, layout, job, initial) if initial is not None else None
    job.close()
    gathers = [None] * dist.get_world_size()  # per rank: weights still in flight after each step
    dist.all_gather_object(gathers, in_flight)
    if plain is not None:
        torch.save(plain.pop("weights"), os.path.join(cfg["out"], f"{layout['name']}.plain.pt"))
    return {"plain": plain, "ranks_hold": held, "weights_in_flight_after_step": gathers, "grad_buckets_and_issued_in_backward": overlaps, "grad_and_whole_numel": numels, "layers_per_rank": layers, "opt_state_numel_rank0": opt_numel, "losses": losses, "grad_norms": norms, "lrs": lrs, "replicas_identical": identical, "step_times": times,
            "eval_losses": evals}, state


def _plain_reference(cfg, layout, job, initial: dict) -> dict:
    """The same run in plain PyTorch (workers/plain_reference.py), from the same initial weights."""
    from plain_reference import train_plain

    o = job.optim
    return train_plain(job.plan.model, initial, job.source, cfg["steps"], lr=o.lr, min_lr=o.min_lr,
                       warmup=o.warmup_steps, total=o.total_steps, weight_decay=o.weight_decay,
                       betas=(o.beta1, o.beta2), eps=o.eps, grad_clip=o.grad_clip, tied=job.tied)


def main():
    cfg = json.load(open(sys.argv[1]))
    init_distributed()
    recorder = Recorder()
    recorder.install()
    results = {}
    for layout in cfg["layouts"]:
        start = time.perf_counter()
        groups_before = groups_now()
        try:
            result, state = run_layout(cfg, layout, recorder)
            destroy_groups_created_since(groups_before)  # process_groups.py: else each layout slows the next
            result["threads_after"] = thread_count()  # rank 0's
            result["seconds"] = time.perf_counter() - start
            if dist.get_rank() == 0:
                torch.save(state, os.path.join(cfg["out"], f"{layout['name']}.pt"))
        except Exception:  # record and go on: other layouts still report
            result = {"error": traceback.format_exc()}
            if dist.get_world_size() > 1:
                raise
        results[layout["name"]] = result
        if dist.get_rank() == 0:
            print(f"layout {layout['name']}: {time.perf_counter() - start:.1f} s", flush=True)
    finish(cfg["out"], results)


if __name__ == "__main__":
    main()
