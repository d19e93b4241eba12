"""Scaling as the planner predicts it: Llama 3 8B/70B/405B on 8 to 16,384 H100s, weak and strong.

For each model and power-of-two GPU count the planner's best plan (full search) is recorded:
layout, tokens/s, MFU, bubble share and each communication axis' share of the step.
  weak:   fixed tokens per GPU (default 2 sequences of 8,192), so the batch grows with the fleet;
  strong: fixed global batch of 2,048 x 8,192 = 16M tokens (Llama 3's, the recipes' default).
The two meet at 1,024 GPUs. Writes benchmarks/results/scaling.{csv,json} and scaling_*.png.

    .venv/bin/python -m hybridpar.benchmarks.scaling [--models llama3-8b,...] [--max-gpus 16384]
"""
from __future__ import annotations

import csv
import sys
import time

from hybridpar.topology.models import PRESETS
from hybridpar.topology.plan import PlanError
from hybridpar.topology.search import Request, search

from ._cli import BenchParser, positive_int
from .results_io import RESULTS_DIR, replacing, write_result

MODELS = ("llama3-8b", "llama3-70b", "llama3-405b")
SEQ = 8192
STRONG_BATCH = 2048  # sequences: 16,777,216 tokens
WEAK_SEQS_PER_GPU = 2
PARTS = ("compute", "bubble", "tp", "cp", "pp", "dp", "optimizer")
FIELDS = ("model", "mode", "gpus", "global_batch", "tp", "cp", "pp", "dp", "vpp", "micro_batch", "grad_accum",
          "zero_stage", "recompute", "memory_gib", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu",
          "mfu", "bubble_fraction", *(f"share_{p}" for p in PARTS), "note")


def best_plan_row(model: str, mode: str, gpus: int, batch: int) -> dict:
    row = {"model": model, "mode": mode, "gpus": gpus, "global_batch": batch}
    try:
        best = search(Request(PRESETS[model], gpus, batch, SEQ), top=1).plans[0]
    except PlanError as err:
        return {**row, "note": str(err)}
    p, c = best.plan, best.cost
    parts = {"compute": c.compute_s, "bubble": c.bubble_s, **c.comm(), "optimizer": c.optimizer_s}
    row.update(tp=p.tp, cp=p.cp, pp=p.pp, dp=p.dp, vpp=p.vpp, micro_batch=p.micro_batch,
               grad_accum=p.grad_accum, zero_stage=p.zero_stage, recompute=p.recompute,
               memory_gib=round(best.memory.total / 2**30, 1), step_time_s=round(c.step_time_s, 4),
               tokens_per_s=round(c.tokens_per_s), tokens_per_s_per_gpu=round(c.tokens_per_s / gpus, 1),
               mfu=round(c.mfu, 4), bubble_fraction=round(c.bubble_fraction, 4), note="")
    row.update({f"share_{k}": round(v / c.step_time_s, 4) for k, v in parts.items()})
    return row


def run(models, max_gpus: int) -> list[dict]:
    rows = []
    counts = [2**k for k in range(3, 15) if 2**k <= max_gpus]
    for model in models:
        for gpus in counts:
            rows.append(best_plan_row(model, "weak", gpus, WEAK_SEQS_PER_GPU * gpus))
            rows.append(best_plan_row(model, "strong", gpus, STRONG_BATCH))
    return rows


def plot(rows: list[dict], models) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fitted = [r for r in rows if r.get("note") == ""]
    written = []
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, metric, label in ((axes[0], "tokens_per_s", "tokens/s (whole job)"), (axes[1], "mfu", "MFU")):
        for model in models:
            for mode, style in (("weak", "-o"), ("strong", "--s")):
                pts = [r for r in fitted if r["model"] == model and r["mode"] == mode]
                ax.plot([r["gpus"] for r in pts], [r[metric] for r in pts], style, ms=3, label=f"{model} {mode}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("H100 GPUs")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"Best plan per GPU count: weak = {WEAK_SEQS_PER_GPU} x {SEQ} tokens per GPU, "
                 f"strong = {STRONG_BATCH} x {SEQ} tokens per step")
    fig.tight_layout()
    written.append(_save(fig, "scaling_throughput.png"))

    for mode in ("weak", "strong"):
        fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 5), sharey=True)
        for ax, model in zip(axes, models):
            pts = [r for r in fitted if r["model"] == model and r["mode"] == mode]
            xs = range(len(pts))
            bottom = [0.0] * len(pts)
            for part in PARTS:
                vals = [r[f"share_{part}"] for r in pts]
                ax.bar(xs, vals, bottom=bottom, label=part)
                bottom = [b + v for b, v in zip(bottom, vals)]
            ax.set_xticks(list(xs), [f"{r['gpus']}: {r['tp']}/{r['cp']}/{r['pp']}/{r['dp']}" for r in pts],
                          fontsize=7, rotation=90)
            ax.set_title(f"{model}, {mode} scaling", fontsize=10)
            ax.set_xlabel("GPUs / TP/CP/PP/DP of the best plan", fontsize=8)
        axes[0].set_ylabel("share of step time")
        axes[-1].legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        written.append(_save(fig, f"scaling_breakdown_{mode}.png"))
    return written


def _save(fig, name: str) -> str:
    path = RESULTS_DIR / name
    with replacing(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    fig.clf()
    return str(path.relative_to(RESULTS_DIR.parent.parent))


def main(argv=None) -> int:
    parser = BenchParser("scaling", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated presets")
    parser.add_argument("--max-gpus", type=positive_int, default=16384, help="largest GPU count planned: 8 or more")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in PRESETS]
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}; presets: {', '.join(PRESETS)}")
    if not models:
        parser.error(f"--models {args.models!r} names no model; give presets such as {','.join(MODELS)}")
    if args.max_gpus < 8:
        parser.error(f"--max-gpus {args.max_gpus}: use 8 or more (GPU counts planned: 8, 16, ... up to it)")
    start = time.perf_counter()
    rows = run(models, args.max_gpus)
    with replacing(RESULTS_DIR / "scaling.csv", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    charts = plot(rows, models)
    elapsed = time.perf_counter() - start
    command = " ".join(["python -m hybridpar.benchmarks.scaling", *(argv if argv is not None else sys.argv[1:])])
    write_result("scaling", {"seq_len": SEQ, "strong_global_batch": STRONG_BATCH,
                             "weak_seqs_per_gpu": WEAK_SEQS_PER_GPU, "elapsed_s": round(elapsed, 1),
                             "charts": charts, "rows": rows}, command)
    for r in rows:
        if r.get("note"):
            print(f"{r['model']:<12} {r['mode']:<6} {r['gpus']:>6}  no plan: {r['note'][:90]}")
        else:
            print(f"{r['model']:<12} {r['mode']:<6} {r['gpus']:>6}  {r['tp']}/{r['cp']}/{r['pp']}/{r['dp']} v{r['vpp']} "
                  f"mb{r['micro_batch']} ga{r['grad_accum']} z{r['zero_stage']} {r['recompute']:<9} "
                  f"{r['tokens_per_s']:>12,} tok/s  MFU {r['mfu']:.3f}  bubble {r['bubble_fraction']:.3f}")
    print(f"{len(rows)} plans in {elapsed:.1f} s; wrote {RESULTS_DIR / 'scaling.csv'} and {', '.join(charts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
