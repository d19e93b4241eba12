"""Multi-rank worker for tests/integration/test_bf16.py: bf16 gradient accumulation and bf16 training.

Usage: torchrun --nproc-per-node 4 tests/workers/bf16_worker.py CONFIG.json
CONFIG: {"out": DIR, "accum": [LAYOUT, ...], "train": [LAYOUT, ...], "steps": S}

"accum" layouts: one bf16 step with many micro-batches (micro-batch 1), run twice: with the fp32
accumulation (hybridpar.engine.FP32_GRAD_ACCUM, the default) and without it (the plain bf16
accumulation it replaced). A tensor hook on every parameter sees each micro-batch's bf16 gradient
as autograd produces it; their exact sum (fp64), averaged over DP, is the reference. The gradient
checked is what the optimizer steps with: the fp32 flat partition gradients that DeepSpeed hands
to AdamW (clipping off), compared with the reference through DeepSpeed's own partition map
(``_hp_mapping``). Reported: relative L2 error of that gradient (``deepspeed_err``), and of a
bf16 running sum of the same micro-batch gradients (``bf16_sum_err``, what autograd accumulates
in a bf16 ``p.grad``).

"train" layouts: S steps in bf16 and in fp32 (same seed, data, layout), memorising one batch: both
loss curves.
Rank 0 writes DIR/results.json.
"""
from __future__ import annotations

import json
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # an installed hybridpar first

from hybridpar.topology.models import ModelSpec  # noqa: E402
from hybridpar.topology.plan import Plan  # noqa: E402

import hybridpar.zero.engine as hp_engine  # noqa: E402
from hybridpar.data import SyntheticTokens  # noqa: E402
from hybridpar.config.optim import OptimConfig  # noqa: E402
from hybridpar.launch.local import init_distributed  # noqa: E402
from hybridpar.runtime.job import Job  # noqa: E402
from results_io import finish  # noqa: E402

MODEL = ModelSpec(layers=4, hidden=64, ffn_hidden=176, heads=8, kv_heads=4, vocab=320, name="test-gqa")
SEQ = 32


class SameBatchEveryStep(SyntheticTokens):
    """Step 1's batch at every step: the model memorises it, so the loss must fall step by step."""

    def rows(self, step: int, start: int, stop: int):
        return super().rows(1, start, stop)


def make_job(lay: dict, precision: str, global_batch: int, steps: int, grad_clip: float, lr: float,
             source_class=SyntheticTokens) -> Job:
    plan = Plan(
        model=MODEL, seq_len=SEQ, global_batch=global_batch, precision=precision,
        tp=lay.get("tp", 1), pp=lay.get("pp", 1), dp=lay.get("dp", 1),
        micro_batch=lay.get("micro_batch", 1), zero_stage=lay.get("zero", 1),
    )
    assert not plan.violations(), plan.violations()
    optim = OptimConfig(lr=lr, min_lr=lr / 10, warmup_steps=1, total_steps=steps, grad_clip=grad_clip)
    return Job(plan, optim, source_class(SEQ, global_batch, MODEL.vocab, seed=0), seed=0)


def accumulation_check(lay: dict, fp32_accum: bool) -> dict:
    hp_engine.FP32_GRAD_ACCUM = fp32_accum
    try:
        job = make_job(lay, "bf16", lay["global_batch"], 1, grad_clip=0.0, lr=1e-3)
    finally:
        hp_engine.FP32_GRAD_ACCUM = True
    params = [p for c in job.chunks for p in c.parameters() if p.requires_grad]
    assert all(p.dtype == torch.bfloat16 for p in params)
    exact = {p: torch.zeros(p.shape, dtype=torch.float64, device=p.device) for p in params}
    bf16_sum: dict = {}
    counts = {p: 0 for p in params}
    names = {p: n for c in job.chunks for n, p in c.named_parameters()}
    finer = set()  # parameters whose micro-batch gradients arrive finer than bf16 (fp32 math)

    def hook_for(p):
        def hook(g):
            counts[p] += 1
            exact[p] += g.double()
            gb = g.to(torch.bfloat16)
            if not torch.equal(gb.float(), g.float()):
                finer.add(names[p])
            bf16_sum[p] = gb.clone() if p not in bf16_sum else bf16_sum[p] + gb
        return hook

    handles = [p.register_hook(hook_for(p)) for p in params]
    inner = job.engine.engine.optimizer
    base = getattr(inner, "optimizer", inner)
    stepped = {}  # id(flat fp32 partition) -> its gradient as AdamW receives it
    orig_step = base.step

    def capture_step(*a, **k):  # DeepSpeed steps one param group at a time
        stepped.update({id(q): q.grad.detach().clone() for g in base.param_groups for q in g["params"]})
        return orig_step(*a, **k)

    base.step = capture_step
    m = job.train_step(1)
    for h in handles:
        h.remove()
    n_micro = lay["global_batch"] // lay.get("dp", 1)
    assert all(c == n_micro for c in counts.values()), (set(counts.values()), n_micro)

    dp_group, dp = job.mesh.group("dp_cp"), job.mesh.size("dp_cp")
    ref, plain = {}, {}
    for p in params:  # the DP average of the exact sums (fp64), and of the bf16 running sums
        r, b = exact[p].clone(), bf16_sum[p].double()
        if dp > 1:
            dist.all_reduce(r, group=dp_group)
            dist.all_reduce(b, group=dp_group)
        ref[p], plain[p] = r / dp, b / dp
    sq = torch.zeros(4, dtype=torch.float64, device=job.mesh.device)  # |got-ref|^2, |ref|^2 (partitions), |bf16-ref|^2, |ref|^2 (full)
    covered = 0
    for p in params:
        if hp_engine.counted_in_norm(p, job.mesh.tp_rank) and job.mesh.dp_rank == 0:  # each element once
            sq[2] += (plain[p] - ref[p]).pow(2).sum()
            sq[3] += ref[p].pow(2).sum()
    if job.engine.zero_stage > 0:
        for p in params:
            mp = getattr(p, "_hp_mapping", None)
            if mp is None or not hp_engine.counted_in_norm(p, job.mesh.tp_rank):
                continue
            lp, hp = mp.lp_fragment_address, mp.hp_fragment_address
            flat = stepped[id(base.param_groups[mp.param_group_index]["params"][0])]
            assert flat.dtype == torch.float32
            got = flat.narrow(0, hp.start, hp.numel).double()
            want = ref[p].reshape(-1).narrow(0, lp.start, lp.numel)
            sq[0] += (got - want).pow(2).sum()
            sq[1] += want.pow(2).sum()
            covered += lp.numel
    else:  # ZeRO-0: DeepSpeed's bf16 wrapper keeps one fp32 master (and gradient) per parameter
        for lps, masters in zip(inner.fp16_groups, inner.fp32_groups):
            for p, q in zip(lps, masters):
                if not hp_engine.counted_in_norm(p, job.mesh.tp_rank):
                    continue
                got, want = stepped[id(q)].double(), ref[p]
                sq[0] += (got - want).pow(2).sum()
                sq[1] += want.pow(2).sum()
                covered += p.numel() if job.mesh.dp_rank == 0 else 0
    dist.all_reduce(sq)
    total = torch.tensor([covered], dtype=torch.float64, device=job.mesh.device)
    dist.all_reduce(total)
    result = {
        "deepspeed_err": float((sq[0] / sq[1]).sqrt()),
        "bf16_sum_err": float((sq[2] / sq[3]).sqrt()),
        "micro_batches": n_micro,
        "grad_norm": m.grad_norm,
        "loss": m.loss,
        "checked_elements": int(total.item()),
        "optimizer": type(inner).__name__,
        "fp32_micro_grads": sorted(finer),
        "fp32_accum": job.engine.fp32_grad_accum,
    }
    job.close()
    return result


def train_curve(lay: dict, precision: str, steps: int) -> dict:
    hp_engine.FP32_GRAD_ACCUM = lay.get("fp32_accum", True)
    try:
        job = make_job(lay, precision, lay.get("global_batch", 16), steps, grad_clip=1.0, lr=3e-3,
                       source_class=SameBatchEveryStep)
    finally:
        hp_engine.FP32_GRAD_ACCUM = True
    losses, norms = [], []
    for step in range(1, steps + 1):
        m = job.train_step(step)
        losses.append(m.loss)
        norms.append(m.grad_norm)
    dtype = str(next(job.chunks[0].parameters()).dtype)
    job_opt = job.engine.engine.optimizer
    job.close()
    return {"losses": losses, "grad_norms": norms, "dtype": dtype, "optimizer": type(job_opt).__name__}


def main():
    cfg = json.load(open(sys.argv[1]))
    init_distributed()
    results = {"accum": {}, "train": {}}
    for lay in cfg.get("accum", []):
        start = time.perf_counter()
        results["accum"][lay["name"]] = {mode: accumulation_check(lay, mode == "fp32_accum")
                                         for mode in ("fp32_accum", "bf16_accum")}
        results["accum"][lay["name"]]["seconds"] = time.perf_counter() - start
        if dist.get_rank() == 0:
            print(lay["name"], json.dumps(results["accum"][lay["name"]]), flush=True)
    for lay in cfg.get("train", []):
        start = time.perf_counter()
        results["train"][lay["name"]] = {prec: train_curve(lay, prec, cfg["steps"]) for prec in ("bf16", "fp32")}
        results["train"][lay["name"]]["seconds"] = time.perf_counter() - start
        if dist.get_rank() == 0:
            print(lay["name"], json.dumps(results["train"][lay["name"]]), flush=True)
    finish(cfg["out"], results)


if __name__ == "__main__":
    main()
