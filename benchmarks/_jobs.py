"""Building hybridpar Jobs for the benchmarks: one Plan per layout of a preset model, synthetic data."""
from __future__ import annotations

from dataclasses import dataclass

from topology.models import load_model
from topology.plan import Plan


@dataclass(frozen=True)
class Layout:
    name: str
    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 1
    sp: bool = False
    reduce_to_owner: bool = False  # '_rs': DeepSpeed use_multi_rank_bucket_allreduce off

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @classmethod
    def parse(cls, text: str) -> "Layout":
        """'tp2_cp2_pp2_dp2_z1[_sp]' -> Layout."""
        kw = {"name": text}
        for part in text.split("_"):
            if part == "sp":
                kw["sp"] = True
            elif part == "rs":
                kw["reduce_to_owner"] = True
            elif part.startswith("tp"):
                kw["tp"] = int(part[2:])
            elif part.startswith("cp"):
                kw["cp"] = int(part[2:])
            elif part.startswith("pp"):
                kw["pp"] = int(part[2:])
            elif part.startswith("dp"):
                kw["dp"] = int(part[2:])
            elif part.startswith("z"):
                kw["zero"] = int(part[1:])
            else:
                raise ValueError(f"bad layout part {part!r} in {text!r}")
        return cls(**kw)


def make_plan(layout: Layout, model: str = "tiny", seq_len: int = 32, global_batch: int = 16,
              micro_batch: int = 2, precision: str = "fp32") -> Plan:
    spec = load_model(model) if isinstance(model, str) else model
    plan = Plan(model=spec, seq_len=seq_len, global_batch=global_batch, tp=layout.tp, cp=layout.cp, pp=layout.pp,
                dp=layout.dp, micro_batch=micro_batch, zero_stage=layout.zero, sequence_parallel=layout.sp,
                precision=precision)
    bad = plan.violations()
    if bad:
        raise ValueError(f"{layout.name}: {'; '.join(bad)}")
    return plan


def make_job(plan: Plan, steps: int = 100, lr: float = 1e-3, seed: int = 0, reduce_to_owner: bool = False,
             overlap_grad_reduce: bool = True):
    """A hybridpar Job (requires torch.distributed up) on synthetic tokens.

    ``reduce_to_owner``: an experiment, not hybridpar's configuration: DeepSpeed's ZeRO-1/2
    reduce each gradient partition to its owner instead of all-reducing whole buckets (so the
    DP reduction is DeepSpeed's, after the backward, not hybridpar.grad_sync's).
    ``overlap_grad_reduce``: hybridpar's bucketed DP all-reduce during the last backward."""
    from hybridpar import engine
    from hybridpar.data import SyntheticTokens
    from hybridpar.engine import OptimConfig
    from hybridpar.train import Job

    if reduce_to_owner:
        original = engine.deepspeed_config

        def patched(*args, **kwargs):
            cfg = original(*args, **kwargs)
            cfg["zero_optimization"]["use_multi_rank_bucket_allreduce"] = False
            return cfg

        engine.deepspeed_config = patched
        try:
            return make_job(plan, steps, lr, seed, overlap_grad_reduce=False)  # DeepSpeed must reduce
        finally:
            engine.deepspeed_config = original

    optim = OptimConfig(lr=lr, min_lr=lr / 10, warmup_steps=0, total_steps=steps)
    source = SyntheticTokens(plan.seq_len, plan.global_batch, plan.model.vocab, seed=seed)
    return Job(plan, optim, source, seed=seed, overlap_grad_reduce=overlap_grad_reduce)
