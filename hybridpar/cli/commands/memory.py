"""`hybridpar memory`: build each distinct pipeline stage of a recipe's layout on the meta device
and print what it holds beside the planner's figures (hybridpar/memory_audit.py)."""
from __future__ import annotations

import json
import time
import warnings

from hybridpar.errors import UsageError

HELP = ("build each distinct pipeline stage of a recipe on the meta device and compare its weights, "
        "gradients and optimizer bytes with the planner's (exit 1 if any differs by more than 0.5%)")
GIB = 1024**3


def add_arguments(p):
    p.add_argument("--recipe", required=True, help="a training recipe (hybridpar/config/recipe.py)")
    p.add_argument("--gpus", type=int, help="world size, which sets dp (default: the recipe's cluster.gpus, or its "
                                            "tp x cp x pp x dp when it pins dp)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")


def resolve_plan(args):
    """The recipe's Plan at --gpus, in the precision a GPU run trains in (auto: bf16). Torch-free."""
    from dataclasses import replace

    from hybridpar.config.recipe import load_recipe

    recipe = load_recipe(args.recipe)
    if args.gpus is None:
        args.gpus = recipe.planned_world()
        if args.gpus is None:
            raise UsageError("--gpus N is required: the recipe leaves parallel.dp to the world size and states no "
                             "cluster.gpus")
    if args.gpus < 1:
        raise UsageError(f"--gpus must be a positive integer, got {args.gpus}")
    recipe = recipe.validate(args.gpus)
    precision = "bf16" if recipe.train.precision == "auto" else recipe.train.precision
    return recipe.to_plan_unresolved().with_(precision=precision)


def run(args) -> int:
    plan = resolve_plan(args)
    start = time.perf_counter()
    with warnings.catch_warnings():  # megatron-core's notes that Transformer Engine and Apex are absent
        warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
        import torch

        from hybridpar.observe import memory_audit

        rows = memory_audit.audit(plan, torch.bfloat16 if plan.precision == "bf16" else torch.float32)
    seconds = time.perf_counter() - start
    ok = all(r.agrees for r in rows)
    if args.json:
        print(json.dumps(to_json(plan, rows, ok, seconds), indent=1))
    else:
        print(render(plan, rows, ok, seconds, memory_audit.peak_rss_bytes()))
    return 0 if ok else 1


def _layout(plan) -> str:
    return (f"TP{plan.tp} CP{plan.cp} PP{plan.pp} VPP{plan.vpp} DP{plan.dp}, ZeRO-{plan.zero_stage} over DP x CP = "
            f"{plan.zero_group}, {plan.precision}")


def render(plan, rows, ok, seconds, rss) -> str:
    from hybridpar.observe.memory_audit import PARTS, TOLERANCE

    lines = [f"{plan.model.name} on {plan.world_size} GPUs: {_layout(plan)}; each stage built on meta by "
             f"hybridpar.runtime.model.build_model (megatron-core GPTModel), planner: hybridpar.topology.memory.stage_memory",
             "", f"{'stage':<12} {'pp':>3} {'layers':>6} {'parameters built':>17} {'planner':>15}   "
             + "   ".join(f"{p + ' GiB built/planner':>27}" for p in PARTS) + "  agrees"]
    lines.append("-" * len(lines[-1]))
    for r in rows:
        b = r.built
        parts = "   ".join(f"{getattr(b, p) / GIB:>9.3f} /{r.planner[p] / GIB:>9.3f} ({r.error(p):+.2%})"
                           for p in PARTS)
        lines.append(f"{b.stage:<12} {b.pp_rank:>3} {b.layers:>6} {b.params:>17,} {r.planner_params:>15,.0f}   "
                     f"{parts}  {'yes' if r.agrees else 'NO'}")
    extra = max(r.built.extra_bytes for r in rows)
    lines += ["", f"{'every stage agrees' if ok else 'DISAGREEMENT'} within {TOLERANCE:.1%} (error = planner/built - 1); "
              f"buffers and tensor attributes up to {extra:,} bytes per stage (counted in weights); "
              f"ZeRO partitions padded as DeepSpeed pads them; {seconds:.1f} s, peak memory {rss / GIB:.2f} GiB "
              f"(no weight allocated)"]
    return "\n".join(lines)


def to_json(plan, rows, ok, seconds) -> dict:
    from dataclasses import asdict

    from hybridpar.observe.memory_audit import PARTS, TOLERANCE

    return {"model": plan.model.name, "gpus": plan.world_size, "layout": _layout(plan), "tolerance": TOLERANCE,
            "agrees": ok, "seconds": round(seconds, 2),
            "stages": [{**asdict(r.built), "planner_params": r.planner_params,
                        "planner": r.planner, "error": {p: r.error(p) for p in PARTS}, "agrees": r.agrees}
                       for r in rows]}
