"""Building hybridpar Jobs for the benchmarks: one Plan per layout of a preset model, synthetic data."""
from __future__ import annotations

from dataclasses import dataclass

from hybridpar.topology.models import load_model
from hybridpar.topology.plan import Plan


@dataclass(frozen=True)
class Layout:
    name: str
    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 1
    sp: bool = False
    deepspeed_reduces: bool = False  # '_after': DP reduction left to DeepSpeed, after the backward

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @classmethod
    def parse(cls, text: str) -> "Layout":
        """'tp2_cp2_pp2_dp2_z1[_sp][_after]' -> Layout."""
        kw = {"name": text}
        for part in text.split("_"):
            if part == "sp":
                kw["sp"] = True
            elif part == "after":
                kw["deepspeed_reduces"] = True
            elif part[:2] in ("tp", "cp", "pp", "dp") or part[:1] == "z":
                key, digits = ("zero", part[1:]) if part[:1] == "z" else (part[:2], part[2:])
                if not digits.isdigit():
                    raise ValueError(f"bad layout part {part!r} in {text!r}: {part[:len(part) - len(digits)]} "
                                     f"takes a number, e.g. {part[:len(part) - len(digits)]}2")
                kw[key] = int(digits)
            else:
                raise ValueError(f"bad layout part {part!r} in {text!r}: parts are tpN, cpN, ppN, dpN, zN, sp "
                                 f"and after, joined by '_' (e.g. tp2_pp2_dp2_z1)")
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


def make_job(plan: Plan, steps: int = 100, lr: float = 1e-3, seed: int = 0, overlap_grad_reduce: bool = True,
             overlap_param_gather: bool = True):
    """A hybridpar Job (requires torch.distributed up) on synthetic tokens.

    ``overlap_grad_reduce``: hybridpar's bucketed DP reduction during the last backward (ZeRO 1/2:
    each element to the rank that steps it); False leaves it to DeepSpeed, after the backward.
    ``overlap_param_gather``: ZeRO 1/2's weight gather behind the next forward (param_gather.py);
    False: inside DeepSpeed's step."""
    from hybridpar.data import SyntheticTokens
    from hybridpar.config.optim import OptimConfig
    from hybridpar.runtime.job import Job

    optim = OptimConfig(lr=lr, min_lr=lr / 10, warmup_steps=0, total_steps=steps)
    source = SyntheticTokens(plan.seq_len, plan.global_batch, plan.model.vocab, seed=seed)
    return Job(plan, optim, source, seed=seed, overlap_grad_reduce=overlap_grad_reduce,
               overlap_param_gather=overlap_param_gather)
