"""Read a run's metrics.jsonl, summarize it, and draw its loss and throughput curves to PNG.

metrics.jsonl holds one JSON object per step: step, loss, grad_norm, lr, step_time_s,
tokens_per_s, and optionally device, tflops_per_gpu (tflops_per_rank on CPU ranks), mfu (a fraction
of the device's peak), predicted_step_time_s (the planner's estimate for the layout) and predicted_on
(the GPU it is for), and eval_loss on the steps that evaluated held-out data. A CPU run's timings
are never set beside a GPU prediction as a ratio. A resumed run appends steps it
may already have logged; the last record of a step wins.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
from dataclasses import dataclass

from hybridpar.errors import UsageError
from hybridpar.files import head_of, replacing_path
from hybridpar.observe.metrics import per_device_tflops

REQUIRED = ("step", "loss", "step_time_s", "tokens_per_s")


@dataclass
class Summary:
    steps: int
    first_step: int
    last_step: int
    first_loss: float
    last_loss: float
    min_loss: float
    min_loss_step: int
    median_step_time_s: float
    total_time_s: float
    median_tokens_per_s: float
    last_lr: float | None = None
    median_grad_norm: float | None = None
    median_tflops_per_gpu: float | None = None
    median_mfu: float | None = None
    predicted_step_time_s: float | None = None
    device: str | None = None  # "cpu", a catalogue GPU name, ...; None in files from before it was logged
    predicted_on: str | None = None  # "h100-80gb bf16": what the prediction is for
    predicted_range: tuple | None = None  # (lo, hi) s: the validation spread around the prediction
    tflops_unit: str = "gpu"  # "rank" on CPU ranks
    eval_points: tuple = ()  # (step, held-out loss) of every step that evaluated

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu" or self.tflops_unit == "rank"


def load_metrics(run_dir: str, warn=None) -> list[dict]:
    """The step records of RUN_DIR/metrics.jsonl, one per step, in step order. A last line cut short
    (no newline: a run killed while writing it) is left out and named through ``warn`` (stderr by
    default), as a resumed run drops it (reliability/run_dir.keep_steps_before); any other line that is
    not a record is an error."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if os.path.isfile(run_dir):
        raise UsageError(f"{run_dir} is a file: give the run directory that holds metrics.jsonl (a training run's --out)")
    if not os.path.isdir(run_dir):
        raise UsageError(f"run directory {run_dir} does not exist: give the --out directory of a training run")
    if not os.path.isfile(path):
        raise UsageError(f"no metrics.jsonl in {run_dir}: give the --out directory of a training run")
    by_step = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                if not line.endswith("\n"):
                    (warn or _warn)(f"{path}:{number}: the last line is cut short (a run killed while writing it); "
                                    f"left out")
                    continue
                raise UsageError(f"{path}:{number}: not JSON ({err.msg}); the file is damaged") from None
            missing = [k for k in REQUIRED if not isinstance(record, dict) or k not in record]
            if missing:
                raise UsageError(f"{path}:{number}: missing {', '.join(missing)}; not a hybridpar metrics file")
            by_step[int(record["step"])] = record
    if not by_step:
        raise UsageError(f"{path} is empty: the run logged no step yet")
    return [by_step[s] for s in sorted(by_step)]


def _warn(message: str) -> None:
    print(f"hybridpar report: warning: {message}", file=sys.stderr, flush=True)


def _median(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarize(records: list[dict]) -> Summary:
    losses = [r["loss"] for r in records]
    throughput = [per_device_tflops(r) for r in records]
    per_device = [t for t, _ in throughput if t is not None]
    best = min(range(len(records)), key=losses.__getitem__)
    return Summary(
        steps=len(records),
        first_step=records[0]["step"],
        last_step=records[-1]["step"],
        first_loss=losses[0],
        last_loss=losses[-1],
        min_loss=losses[best],
        min_loss_step=records[best]["step"],
        median_step_time_s=_median(records, "step_time_s"),
        total_time_s=sum(r["step_time_s"] for r in records),
        median_tokens_per_s=_median(records, "tokens_per_s"),
        last_lr=records[-1].get("lr"),
        median_grad_norm=_median(records, "grad_norm"),
        median_tflops_per_gpu=statistics.median(per_device) if per_device else None,
        median_mfu=_median(records, "mfu"),
        predicted_step_time_s=records[-1].get("predicted_step_time_s"),
        device=records[-1].get("device"),
        predicted_on=records[-1].get("predicted_on"),
        predicted_range=tuple(records[-1]["predicted_step_time_s_range"])
        if records[-1].get("predicted_step_time_s_range") else None,
        tflops_unit=throughput[-1][1],
        eval_points=tuple((r["step"], r["eval_loss"]) for r in records if r.get("eval_loss") is not None),
    )


def format_summary(s: Summary) -> str:
    rows = [
        ("steps", f"{s.steps} (steps {s.first_step}..{s.last_step})"),
        ("loss", f"first {s.first_loss:.4f}   last {s.last_loss:.4f}   min {s.min_loss:.4f} (step {s.min_loss_step})"),
        ("step time", f"median {s.median_step_time_s:.3f} s   total {s.total_time_s:.1f} s"),
        ("tokens/s", f"median {s.median_tokens_per_s:,.0f}"),
    ]
    if s.eval_points:
        (first_step, first), (last_step, last) = s.eval_points[0], s.eval_points[-1]
        best_step, best = min(s.eval_points, key=lambda p: p[1])
        rows.insert(2, ("eval loss", f"first {first:.4f} (step {first_step})   last {last:.4f} (step {last_step})   "
                                     f"min {best:.4f} (step {best_step}); held-out data, {len(s.eval_points)} "
                                     f"evaluations"))
    if s.predicted_step_time_s is not None:
        on = f" on {s.predicted_on}" if s.predicted_on else ""
        spread = f" ({s.predicted_range[0]:.4g}-{s.predicted_range[1]:.4g} s)" if s.predicted_range else ""
        predicted = f"{s.predicted_step_time_s:.4g} s per step{spread}{on}"
        if s.on_cpu:
            rows.append(("predicted", f"{predicted} (a GPU prediction; this run ran on CPU ranks, so no ratio)"))
        else:
            ratio = s.median_step_time_s / s.predicted_step_time_s if s.predicted_step_time_s else float("nan")
            rows.append(("predicted", f"{predicted} (measured/predicted {ratio:.2f})"))
    if s.median_tflops_per_gpu is not None:
        tf = s.median_tflops_per_gpu
        # CPU runs reach GFLOP/s, not TFLOP/s: keep significant digits instead of printing 0.00.
        label = "TFLOP/s/rank" if s.on_cpu else "TFLOP/s/GPU"
        rows.append((label, f"median {tf:.2f}" if tf >= 0.1 else f"median {tf:.3g} ({tf * 1e3:.3g} GFLOP/s)"))
    if s.median_mfu is not None:
        rows.append(("MFU", f"median {100 * s.median_mfu:.1f}%"))
    if s.median_grad_norm is not None:
        rows.append(("grad norm", f"median {s.median_grad_norm:.3g}"))
    if s.last_lr is not None:
        rows.append(("lr", f"last {s.last_lr:.3g}"))
    return "\n".join(f"{k:<12} {v}" for k, v in rows)


# Written into every plot's PNG text chunk: a loss.png or throughput.png without it is someone else's.
PNG_SOFTWARE = "hybridpar report"
PLOTS = ("loss.png", "throughput.png")


def foreign_plots(out_dir: str) -> list[str]:
    """The plot paths in out_dir that hold a file report did not write (it never replaces those)."""
    found = []
    for name in PLOTS:
        path = os.path.join(out_dir, name)
        # PNG text chunks come before the image data
        if os.path.lexists(path) and PNG_SOFTWARE.encode() not in head_of(path, 4096):
            found.append(path)
    return found


def _save_png(fig, path: str) -> None:
    with replacing_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight", metadata={"Software": PNG_SOFTWARE})


def plot(records: list[dict], out_dir: str, loss_baseline: float | None = None) -> list[str]:
    """Write loss.png and throughput.png of one run under out_dir; return their paths."""
    return plot_runs([("", records)], out_dir, loss_baseline)


def tokens_per_step(run_dir: str) -> int:
    """Tokens of one optimizer step of the run in RUN_DIR (its plan.json: global batch x sequence)."""
    path = os.path.join(run_dir, "plan.json")
    try:
        with open(path) as f:
            plan = json.load(f)["plan"]
        return int(plan["global_batch"]) * int(plan["seq_len"])
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"{path} is missing or unreadable: --by-tokens needs the run's plan.json (its global batch "
                         f"and sequence length)") from None


def plot_runs(runs: list[tuple[str, list[dict]]], out_dir: str, loss_baseline: float | None = None,
              tokens: list[int] | None = None) -> list[str]:
    """Write loss.png and throughput.png under out_dir with every run's curves, each labelled (one
    unlabelled run: its own report); ``tokens``: each run's tokens per step, to draw against tokens
    seen instead of steps (runs of different batch sizes compare there). Returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = [os.path.join(out_dir, name) for name in PLOTS]
    scale = tokens or [1] * len(runs)
    xlabel = "tokens" if tokens else "step"

    def xs(records, k):
        return [r["step"] * scale[k] for r in records]

    fig, ax = plt.subplots(figsize=(7, 4))
    any_held = False
    for k, (label, records) in enumerate(runs):
        line, = ax.plot(xs(records, k), [r["loss"] for r in records], lw=1.2, label=f"{label} loss" if label else "loss")
        held = [r for r in records if r.get("eval_loss") is not None]
        if held:
            any_held = True
            ax.plot(xs(held, k), [r["eval_loss"] for r in held], "o--", ms=3, lw=1.0, color=line.get_color(),
                    label=f"{label} held-out" if label else "held-out loss")
    if loss_baseline is not None:
        ax.axhline(loss_baseline, color="gray", ls="--", lw=1, label=f"baseline {loss_baseline:.3f}")
    ax.set(xlabel=xlabel, ylabel="loss (nats/token)",
           title="Training and held-out loss" if any_held else "Training loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    _save_png(fig, paths[0])
    plt.close(fig)

    all_records = [r for _, records in runs for r in records]
    panels = [("tokens_per_s", "tokens/s"), ("step_time_s", "step time (s)")]
    if any(r.get("tflops_per_gpu") is not None for r in all_records):
        panels.append(("tflops_per_gpu", "TFLOP/s per GPU"))
    elif any(r.get("tflops_per_rank") is not None for r in all_records):
        panels.append(("tflops_per_rank", "TFLOP/s per CPU rank"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.4 * len(panels)), sharex=True)
    for ax, (key, label) in zip(axes, panels):
        for k, (name, records) in enumerate(runs):
            points = [r for r in records if r.get(key) is not None]
            ax.plot(xs(points, k), [r[key] for r in points], lw=1.2, label=name or None)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    if len(runs) == 1:
        records = runs[0][1]
        predicted = records[-1].get("predicted_step_time_s")
        if predicted is not None and not summarize(records).on_cpu:  # a GPU prediction is no line for CPU timings
            on = records[-1].get("predicted_on")
            axes[1].axhline(predicted, color="gray", ls="--", lw=1, label=f"planner's prediction{f' ({on})' if on else ''}")
            axes[1].legend()
    else:
        axes[0].legend(fontsize="small")
    axes[0].set_title("Throughput")
    axes[-1].set_xlabel(xlabel)
    _save_png(fig, paths[1])
    plt.close(fig)
    return paths
