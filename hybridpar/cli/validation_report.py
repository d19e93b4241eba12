"""`hybridpar plan --validate [--gpu NAME] [--software NAME]`: the published runs the planner is checked
against (topology/validation.py), as a table or JSON, all of them or those of one GPU and/or one
software profile, so that a user can read how the planner has done on what they will run."""
from __future__ import annotations

from pathlib import Path

from hybridpar.errors import UsageError
from hybridpar.topology import validation
from hybridpar.topology.hardware import HardwareError, get_gpu
from hybridpar.topology.software import PROFILES

GPU_FILE_SUFFIXES = (".json", ".yaml", ".yml")


def selection(gpu: str | None, software: str | None) -> tuple[str | None, str | None]:
    """The catalogue GPU and software profile to keep runs of (None: any), checked: a GPU file cannot
    select published runs, and a selection must hold at least one run with a reported throughput."""
    if gpu is not None:
        if gpu.lower().endswith(GPU_FILE_SUFFIXES) or Path(gpu).is_file():
            raise UsageError(f"--validate --gpu takes a catalogue GPU name, not the file {gpu}: published runs are "
                             f"filed under {', '.join(sorted({r.gpu for r in validation.checks()}))}")
        try:
            gpu = get_gpu(gpu).name
        except HardwareError as err:
            raise UsageError(str(err)) from None
    if software is not None and software not in PROFILES:
        raise UsageError(f"unknown software profile {software!r}; choose one of {', '.join(PROFILES)}")
    if not any(r.error is not None for r in validation.select(gpu, software)):
        raise UsageError(f"--validate: no published run with a throughput {_described(gpu, software)}; there are "
                         f"{_available(gpu, software)}")
    return gpu, software


def _described(gpu: str | None, software: str | None) -> str:
    return " ".join(part for part in (gpu and f"on {gpu}", software and f"costed with {software}") if part)


def _available(gpu: str | None, software: str | None) -> str:
    """What a failed selection could have asked for: the profiles on its GPU, the GPUs of its profile,
    else every GPU or every profile with runs."""
    timed = [r for r in validation.checks() if r.error is not None]
    listed = lambda values: ", ".join(sorted(set(values)))
    if gpu and any(r.gpu == gpu for r in timed):
        return "runs on it costed with " + listed(r.software for r in timed if r.gpu == gpu)
    if software and any(r.software == software for r in timed):
        return "runs costed with it on " + listed(r.gpu for r in timed if r.software == software)
    if gpu:
        return "runs on " + listed(r.gpu for r in timed)
    return "runs costed with " + listed(r.software for r in timed)


def _selected(gpu: str | None, software: str | None) -> tuple[tuple, validation.Summary, validation.Summary]:
    """The selection's runs, their summary, and the summary of every run (the same one when nothing is selected)."""
    everything = validation.summary()
    if gpu is None and software is None:
        return validation.checks(), everything, everything
    rows = validation.select(gpu, software)
    return rows, validation.summary(rows), everything


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:.1%}"


def render(gpu: str | None = None, software: str | None = None) -> str:
    rows, s, everything = _selected(gpu, software)
    head = (f"{'run':<36} {'GPUs':>5} {'layout TP/PP/CP/DP':<22} {'reported':>8} {'predicted':>9} {'error':>7} "
            f"{'GiB':>6} memory")
    lines = ["Published runs, each costed with its published layout and the software profile of the stack "
             "that ran it (topology/cases.py); MFU in model FLOPs over the dense 16-bit peak"]
    if gpu or software:
        lines.append(f"Only the {len(rows)} runs {_described(gpu, software)}, of {len(validation.checks())}")
    lines += ["", head, "-" * len(head)]
    for r in rows:
        err = "" if r.error is None else f"{r.error:+.1%}"
        lines.append(f"{r.id:<36} {r.gpus:>5} {r.layout:<22} {_pct(r.reported_mfu):>8} {r.predicted_mfu:>9.1%} "
                     f"{err:>7} {r.memory_gib:>6.1f} {r.memory_verdict}")
    lo, hi = everything.ratio_range
    lines += ["", f"{s.timed} runs with a reported throughput: median |error| {s.median_abs_error:.1%}, signed bias "
              f"(median error) {s.signed_bias:+.1%}, {s.within} within {validation.TOLERANCE:.0%}",
              "by GPU: " + _groups_line(s.by_gpu),
              "by stack: " + _groups_line(s.by_stack),
              "by precision: " + _groups_line(s.by_precision),
              f"memory verdicts right: {s.memory_right} of {s.memory_checked} (runs that ran predicted to fit, "
              "runs that ran out of memory predicted not to)"]
    lines += [f"ranking inside sweep {name}: Spearman {rho:.3f} (predicted vs reported MFU; 1 = the measured order)"
              for name, rho in s.sweeps.items()]
    # The ranges a plan is given come from every run, whatever is shown: the selection only picks which to print.
    shown = {r.gpu for r in rows}
    keep = lambda g, sw=None: g in shown and (software is None or sw is None or sw == software)
    own = "; ".join(f"{g} {glo:.2f}-{ghi:.2f}" for g, (glo, ghi) in everything.gpu_ranges.items() if keep(g))
    by_profile = "; ".join(f"{g} {sw} {glo:.2f}-{ghi:.2f}"
                           for (g, sw), (glo, ghi) in everything.profile_ranges.items() if keep(g, sw))
    lines.append(f"range given with every prediction, reported/predicted "
                 f"({validation.RANGE_PERCENTILES[0]}th-{validation.RANGE_PERCENTILES[1]}th percentile): on a GPU "
                 f"under a software profile with {validation.OWN_RANGE_MIN_RUNS}+ runs there: {by_profile or 'none'}; "
                 f"else on the GPU: {own or 'none'}; other GPUs {lo:.2f}-{hi:.2f} (all runs)")
    return "\n".join(lines)


def _groups_line(groups: dict) -> str:
    return "; ".join(f"{name} {n} runs, median |error| {mae:.1%}, bias {bias:+.1%}" for name, (n, mae, bias) in groups.items())


def _groups_json(groups: dict) -> dict:
    return {name: {"timed": n, "median_abs_error": round(mae, 4), "signed_bias": round(bias, 4)}
            for name, (n, mae, bias) in groups.items()}


def as_json(gpu: str | None = None, software: str | None = None) -> dict:
    """The runs and the summary of the selection; the ranges plans are given, from every run."""
    rows, s, everything = _selected(gpu, software)
    return {"selection": {"gpu": gpu, "software": software},
            "runs": [{"id": r.id, "gpus": r.gpus, "gpu": r.gpu, "layout": r.layout, "reported_mfu": r.reported_mfu,
                      "predicted_mfu": round(r.predicted_mfu, 4),
                      "error": None if r.error is None else round(r.error, 4), "memory_gib": round(r.memory_gib, 2),
                      "fits": r.fits, "ran": r.ran, "memory_verdict": r.memory_verdict, "stack": r.stack,
                      "precision": r.precision, "software": r.software,
                      "predicted_step_time_s": round(r.predicted_step_s, 4), "reported_step_time_s": r.reported_step_s,
                      "predicted_time_s": {part: round(t, 4) for part, t in r.step_parts}}
                     for r in rows],
            "median_abs_error": round(s.median_abs_error, 4), "signed_bias": round(s.signed_bias, 4),
            "within_15_percent": s.within, "timed": s.timed, "memory_right": s.memory_right,
            "memory_checked": s.memory_checked,
            "reported_over_predicted_range": [round(x, 4) for x in everything.ratio_range],
            "reported_over_predicted_range_by_gpu": {g: [round(x, 4) for x in r]
                                                     for g, r in everything.gpu_ranges.items()},
            "reported_over_predicted_range_by_gpu_and_software": {f"{g}/{sw}": [round(x, 4) for x in r]
                                                                  for (g, sw), r in everything.profile_ranges.items()},
            "sweep_spearman": {k: round(v, 3) for k, v in s.sweeps.items()},
            "by_gpu": _groups_json(s.by_gpu), "by_stack": _groups_json(s.by_stack),
            "by_precision": _groups_json(s.by_precision)}
