"""The planner against every published run it has: each published layout costed as given
(topology/cases.py), the error of its MFU and its memory verdict; the spread of those errors gives
every prediction its range, and the runs' shapes say where the planner has been checked at all.

Runs: ../shared/cases/public_cases.json (14) and topology/data/validation_runs.json (the out-of-sample
runs: NeMo recipes, BigScience's sweeps of layouts on one cluster with the layouts that ran out of memory,
Megatron-Turing NLG, MosaicML's PyTorch FSDP benchmarks, Megatron-Core's and torchtitan's tables).
Nothing here feeds back into the physics: the ranges are read off the errors, never used to correct
the prediction.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import lru_cache

from .cases import CASES_PATH, VALIDATION_PATH, case_software, case_stack, load_cases, predict_case
from .search import Evaluated
from .hardware import GIB, catalogue_base, get_gpu

# The range given with a prediction: the 10th to 90th percentile of reported / predicted over the
# runs that report a throughput.
RANGE_PERCENTILES = (10, 90)
# A GPU with at least this many timed runs gets the range of its own runs (A100 and H100 lean
# differently), and a plan for a software profile that has this many on its GPU the range of those
# (DeepSpeed's pipeline engine and FSDP lean differently from NeMo); anything else the range of all runs.
OWN_RANGE_MIN_RUNS = 10
TOLERANCE = 0.15  # "within" in the summary: |predicted / reported - 1| <= 15%
# The parts of a predicted step (cost.StepCost's *_s fields) each checked run lists.
STEP_PARTS = ("compute", "bubble", "tp", "cp", "pp", "dp", "optimizer")
# A plan is "near" a validated run along one axis when within these factors of it.
NEAR = {"params": 3.0, "hidden_per_tp": 2.0, "seq_len": 2.0}


@dataclass(frozen=True)
class CaseCheck:
    id: str
    gpus: int
    gpu: str
    layout: str  # TP/PP/CP/DP and the micro-batch (and VPP) costed
    params: float
    hidden_per_tp: int
    seq_len: int
    reported_mfu: float | None  # None: the layout ran out of memory, no throughput
    predicted_mfu: float
    memory_gib: float
    capacity_gib: float
    fits: bool
    ran: bool  # False: published as out of memory
    sweep: str | None
    stack: str  # the software family that ran it (cases.case_stack)
    precision: str = "bf16"  # what its layers computed in: bf16, fp16 or fp8
    software: str = ""  # the software profile it was costed with (topology/software PROFILES)
    predicted_step_s: float = 0.0  # the published layout's predicted step at the run's global batch
    # where that step goes, seconds: (part, seconds) for compute, bubble, TP, CP, PP, DP and the optimizer step
    step_parts: tuple[tuple[str, float], ...] = ()
    reported_step_s: float | None = None  # where the run publishes its step time

    @property
    def gpu_software(self) -> tuple[str, str]:
        return self.gpu, self.software

    @property
    def error(self) -> float | None:
        return None if self.reported_mfu is None else self.predicted_mfu / self.reported_mfu - 1

    @property
    def memory_verdict(self) -> str:
        if self.ran:
            return "fits" if self.fits else "REFUSED (it ran)"
        return "OOM predicted" if not self.fits else "FITS (it ran out of memory)"

    @property
    def memory_right(self) -> bool:
        return self.fits == self.ran


def _mfu_16bit(e: Evaluated, case: dict) -> float:
    """Predicted MFU over the dense 16-bit peak, the convention of model_flops_mfu for every run (an fp8
    plan's own MFU is over the fp8 peak)."""
    return e.cost.tflops_per_gpu / get_gpu(case["gpu"].lower()).bf16_tflops


def check(case: dict) -> CaseCheck:
    e = predict_case(case)
    p, c = e.plan, e.cost
    layout = f"{p.tp}/{p.pp}/{p.cp}/{p.dp} mb{p.micro_batch}" + (f" v{p.vpp}" if p.vpp > 1 else "")
    return CaseCheck(case["id"], case["num_gpus"], case["gpu"].lower(), layout, p.model.total_params,
                     p.model.hidden // p.tp, p.seq_len, case.get("model_flops_mfu"), _mfu_16bit(e, case),
                     e.memory.total / GIB, get_gpu(case["gpu"].lower()).memory_gib, e.fits,
                     case.get("outcome", "ran") != "oom", case.get("sweep"), case_stack(case), p.precision,
                     case_software(case)[0].name, c.step_time_s,
                     tuple((part, getattr(c, f"{part}_s")) for part in STEP_PARTS), case.get("reported_step_time_s"))


@lru_cache(maxsize=1)
def checks() -> tuple[CaseCheck, ...]:
    cases = (load_cases(CASES_PATH) if CASES_PATH.is_file() else []) + load_cases(VALIDATION_PATH)
    return tuple(check(c) for c in cases)


def select(gpu: str | None = None, software: str | None = None) -> tuple[CaseCheck, ...]:
    """The published runs on ``gpu`` (a catalogue name) costed with the ``software`` profile; None: any."""
    return tuple(r for r in checks() if gpu in (None, r.gpu) and software in (None, r.software))


def _percentile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        for rank, i in enumerate(order):
            r[i] = rank
        return r

    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else 0.0


@dataclass(frozen=True)
class Summary:
    timed: int  # runs with a reported throughput
    median_abs_error: float
    signed_bias: float  # median signed error
    within: int  # |error| <= TOLERANCE
    memory_right: int
    memory_checked: int
    ratio_range: tuple[float, float]  # RANGE_PERCENTILES of reported / predicted
    sweeps: dict  # sweep name -> Spearman rank correlation of predicted vs reported MFU
    by_gpu: dict  # GPU -> (timed runs, median |error|, median signed error): where the lean sits
    gpu_ranges: dict  # GPU with OWN_RANGE_MIN_RUNS timed runs -> RANGE_PERCENTILES of its reported / predicted
    profile_ranges: dict  # (GPU, software profile) with OWN_RANGE_MIN_RUNS timed runs -> the same over those
    by_gpu_software: dict  # (GPU, software profile) -> (timed runs, median |error|, median signed error)
    by_stack: dict  # software family -> (timed runs, median |error|, median signed error)
    by_precision: dict  # bf16 / fp16 / fp8 -> (timed runs, median |error|, median signed error)


def _ratio_range(errors: list[float]) -> tuple[float, float]:
    ratios = [1 / (1 + e) for e in errors]
    return _percentile(ratios, RANGE_PERCENTILES[0]), _percentile(ratios, RANGE_PERCENTILES[1])


@lru_cache(maxsize=1)
def summary(rows: tuple[CaseCheck, ...] | None = None) -> Summary:
    rows = checks() if rows is None else rows
    errors = [r.error for r in rows if r.error is not None]
    sweeps = {}
    for name in sorted({r.sweep for r in rows if r.sweep}):
        timed = [r for r in rows if r.sweep == name and r.error is not None]
        sweeps[name] = spearman([r.predicted_mfu for r in timed], [r.reported_mfu for r in timed])
    errors_by_gpu, errors_by_gpu_software = _errors_by(rows, "gpu"), _errors_by(rows, "gpu_software")
    own = lambda errors_by: {k: _ratio_range(errs) for k, errs in errors_by.items() if len(errs) >= OWN_RANGE_MIN_RUNS}
    return Summary(len(errors), statistics.median(abs(e) for e in errors), statistics.median(errors),
                   sum(abs(e) <= TOLERANCE for e in errors), sum(r.memory_right for r in rows), len(rows),
                   _ratio_range(errors), sweeps, _stats(errors_by_gpu), own(errors_by_gpu),
                   own(errors_by_gpu_software), _stats(errors_by_gpu_software), _stats(_errors_by(rows, "stack")),
                   _stats(_errors_by(rows, "precision")))


def _errors_by(rows: tuple[CaseCheck, ...], key: str) -> dict:
    """key value -> the errors of the timed rows with it, values sorted."""
    out: dict = {}
    for r in rows:
        if r.error is not None:
            out.setdefault(getattr(r, key), []).append(r.error)
    return dict(sorted(out.items()))


def _stats(errors_by: dict) -> dict:
    """key value -> (timed runs, median |error|, median signed error)."""
    return {value: (len(errs), statistics.median(abs(e) for e in errs), statistics.median(errs))
            for value, errs in errors_by.items()}


def _range_runs(gpu: str | None, software: str | None) -> tuple[tuple[str, str] | str | None, tuple[float, float]]:
    """Which published runs a plan's range comes from, and their spread: those on its GPU costed with its
    software profile where there are OWN_RANGE_MIN_RUNS, else those on its GPU where there are as many,
    else all (key None). A GPU file based on a catalogue GPU is that GPU."""
    s, base = summary(), catalogue_base(gpu or "")
    if (base, software) in s.profile_ranges:
        return (base, software), s.profile_ranges[base, software]
    if base in s.gpu_ranges:
        return base, s.gpu_ranges[base]
    return None, s.ratio_range


def ratio_range(gpu: str | None = None, software: str | None = None) -> tuple[float, float]:
    """reported / predicted spread for plans on ``gpu`` under the ``software`` profile (_range_runs)."""
    return _range_runs(gpu, software)[1]


def mfu_range(mfu: float, gpu: str | None = None, software: str | None = None) -> tuple[float, float]:
    """[lo, hi] around a predicted MFU from the validation spread; lo <= mfu <= hi."""
    lo, hi = ratio_range(gpu, software)
    return mfu * min(lo, 1.0), mfu * max(hi, 1.0)


def step_time_range(step_s: float, gpu: str | None = None, software: str | None = None) -> tuple[float, float]:
    lo, hi = ratio_range(gpu, software)
    return step_s / max(hi, 1.0), step_s / min(lo, 1.0)


def range_note(gpu: str | None = None, software: str | None = None) -> str:
    """One line saying which published runs the ranges of a plan on ``gpu`` under ``software`` come from,
    and the command that lists them."""
    key, (lo, hi) = _range_runs(gpu, software)
    s = summary()
    if isinstance(key, tuple):
        runs = f"the {s.by_gpu_software[key][0]} published runs on {key[0]} costed with {key[1]}"
        listed = f"hybridpar plan --validate --gpu {key[0]} --software {key[1]}"
    elif key:
        fewer = f": fewer than {OWN_RANGE_MIN_RUNS} costed with {software}" if software else ""
        runs = f"the {s.by_gpu[key][0]} published runs on {key} (every stack{fewer})"
        listed = f"hybridpar plan --validate --gpu {key}"
    else:
        runs = f"all {s.timed} published runs (fewer than {OWN_RANGE_MIN_RUNS} on this GPU)"
        listed = "hybridpar plan --validate"
    widened = ""  # mfu_range and step_time_range always hold the prediction itself
    if hi < 1.0:
        widened = "; both below 1, so each range's top is the prediction itself"
    elif lo > 1.0:
        widened = "; both above 1, so each range's bottom is the prediction itself"
    return (f"ranges: the {RANGE_PERCENTILES[0]}th-{RANGE_PERCENTILES[1]}th percentile of reported/predicted MFU, "
            f"{lo:.2f}-{hi:.2f}, over {runs} (`{listed}`){widened}")


def outside_validated_region(params: float, gpu: str, hidden_per_tp: int, seq_len: int) -> str | None:
    """One line naming what no validated run is near, or None inside the validated region. Model size,
    hidden/TP and sequence length are each looked for among the runs on the plan's GPU (a run of the
    same size on another GPU says little about this one); on a GPU without runs, among all."""
    timed = [r for r in checks() if r.error is not None]
    near = lambda a, b, f: b / f <= a <= b * f
    missing = []
    gpu = catalogue_base(gpu)
    same_gpu = [r for r in timed if r.gpu == gpu]
    if not same_gpu:
        missing.append(f"GPU {gpu} (validated: {', '.join(sorted({r.gpu for r in timed}))})")
    runs = same_gpu or timed
    if not any(near(params, r.params, NEAR["params"]) for r in runs):
        missing.append(f"model size {params / 1e9:.3g}B")
    if not any(near(hidden_per_tp, r.hidden_per_tp, NEAR["hidden_per_tp"]) for r in runs):
        missing.append(f"hidden/TP {hidden_per_tp}")
    if not any(near(seq_len, r.seq_len, NEAR["seq_len"]) for r in runs):
        missing.append(f"sequence length {seq_len:,}")
    if not missing:
        return None
    where = f" on {gpu}" if same_gpu else ""
    return f"outside the validated region: no published run{where} near its " + "; ".join(missing)
