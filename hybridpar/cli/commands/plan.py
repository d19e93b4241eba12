"""`hybridpar plan`: search TP x CP x PP x DP (and micro-batch, virtual stages, ZeRO, recomputation)
for a model on a fleet of GPUs, and print the ranked plans, their memory and time, and why the
rejected layouts were rejected. Pure Python: imports topology/ only, never torch."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from hybridpar.topology.fp8 import FP8_SCALINGS
from hybridpar.topology.kernels import ATTENTION_KERNELS
from hybridpar.topology.hardware import CATALOGUE, GIB, HardwareError, load_gpu
from hybridpar.topology.memory import PARTS, TIGHT_MARGIN
from hybridpar.topology.models import load_model
from hybridpar.topology.plan import PRECISIONS, RECOMPUTE_MODES
from hybridpar.topology.software import CROSS_ENTROPY_KERNELS
from hybridpar.topology.redundancy import KEEP
from hybridpar.topology.search import Request, search
from hybridpar.topology.software import PROFILES
from hybridpar.topology import validation

from hybridpar.cli import validation_report
from hybridpar.errors import UsageError

OTHER_PARTS = PARTS[4:]  # beyond weights, gradients, optimizer state and activations
HELP = "plan the TP x CP x PP x DP layout of a model on N GPUs (DP outermost), ranked by step time"

DEFAULT_TOKENS = 16 * 1024 * 1024  # Llama 3's 16M-token batch (Table 4)
# What runs the plan: hybridpar's own runtime (default); megatron-core's stack (distributed
# optimizer with the DP reduction overlapped, classic ZeRO-2, fp32 gradient reduction); or, to
# evaluate an older published layout, Megatron-LM 2021 (local or torch DDP) or DeepSpeed's
# pipeline engine (topology/software/ says what each does).
SOFTWARE = PROFILES
PINS = {"tp": "tp", "pp": "pp", "cp": "cp", "dp": "dp", "micro_batch": "micro_batch", "vpp": "vpp",
        "zero": "zero_stage", "recompute": "recompute"}


def add_arguments(p):
    what = p.add_mutually_exclusive_group()
    what.add_argument("--validate", action="store_true",
                      help="print the published runs the planner is checked against: reported vs predicted MFU, "
                      "signed error, memory verdict, median error and bias (docs/planner.md); with --gpu NAME and/or "
                      "--software NAME only the runs on that GPU or costed with that profile")
    what.add_argument("--model", help="preset name or a .json/.yaml model file")
    what.add_argument("--recipe", help="a training recipe (hybridpar/config/recipe.py): its model, seq_len, "
                      "global_batch, cluster and parallel sizes (as pins); flags override it")
    p.add_argument("--gpus", type=int, help="number of GPUs (required with --model; with --recipe, default: its "
                                            "cluster.gpus)")
    p.add_argument("--gpu", help=f"GPU type: {', '.join(CATALOGUE)} (default h100-80gb), or a .json/.yaml GPU "
                   "file (its keys replace those of the catalogue GPU it names as base, e.g. a measured gemm_fraction)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the GPU's, 8)")
    p.add_argument("--seq-len", type=int, help="sequence length (default 8192)")
    batch = p.add_mutually_exclusive_group()
    batch.add_argument("--global-batch", type=int, help="global batch in sequences")
    batch.add_argument("--global-batch-tokens", type=int,
                       help="global batch in tokens (default 16,777,216; must divide by --seq-len)")
    p.add_argument("--precision", default="bf16", choices=[x for x in PRECISIONS if x != "fp32"],
                   help="training precision the plan is for (default bf16)")
    for axis in ("tp", "pp", "cp", "dp", "micro-batch", "vpp", "zero"):
        p.add_argument(f"--{axis}", type=int, help=f"pin {axis}")
    p.add_argument("--recompute", choices=list(RECOMPUTE_MODES), help="pin activation recomputation")
    *older, last = [name for name in SOFTWARE if name not in ("hybridpar", "megatron-core")]
    p.add_argument("--software", choices=list(SOFTWARE), default=None,
                   help="the training software the plan is for (default hybridpar: its own runtime; "
                   f"megatron-core; {', '.join(older)} and {last} to evaluate published layouts on the stacks that ran them)")
    p.add_argument("--network-gbit", type=float,
                   help="scale-out network per GPU and direction, Gbit/s (default: the GPU's catalogue "
                   "node, 400 for H100/H200/H800, 200 for A100)")
    p.add_argument("--cuda-launch-blocking", action="store_true",
                   help="cost the plan for a run with CUDA_LAUNCH_BLOCKING=1, where the host waits for every kernel "
                   "(BigScience trained BLOOM so, to avoid NCCL hangs)")
    p.add_argument("--attention-kernel", choices=sorted(ATTENTION_KERNELS), default=None,
                   help="the attention kernel the run uses (default: the software's, FlashAttention-2-class; "
                   "triton: FlashAttention in Triton, as MosaicML's llm-foundry ran it, 1.4x slower forward and 2x "
                   "backward; flash1: FlashAttention 1.x, at its measured A100 rate, about 2.25x FlashAttention-2's "
                   "time at 2K)")
    p.add_argument("--cross-entropy", choices=sorted(CROSS_ENTROPY_KERNELS), default=None,
                   help="the loss kernel over the vocabulary (default: the software's, megatron's vocab-parallel "
                   "loss in fp32, 6 bytes per logit at its peak; vocab-parallel-fused: the same under megatron-core's "
                   "cross_entropy_loss_fusion, as NeMo 2 runs it; fused-16bit: flash-attn's fused xentropy, as "
                   "MosaicML's llm-foundry ran it, 4)")
    p.add_argument("--fp8-params", action="store_true",
                   help="with --precision fp8: weights kept in fp8 and all-gathered in fp8 by the distributed optimizer "
                   "(Megatron-LM --fp8-param-gather, NeMo's fp8_params); without it Transformer Engine caches an fp8 "
                   "copy of each weight beside the 16-bit one")
    p.add_argument("--fp8-scaling", choices=FP8_SCALINGS, default=None,
                   help="with --precision fp8: Transformer Engine's scaling recipe (default delayed: DelayedScaling, "
                   "NeMo's and megatron-core's default; current: Float8CurrentScaling, Megatron-Bridge's fp8_cs, "
                   "which reads each tensor once more for its amax before the cast)")
    p.add_argument("--tp-comm-overlap", action="store_true",
                   help="cost the plan for a run that overlaps the sequence-parallel TP collectives with the GEMMs "
                   "through Transformer Engine's userbuffers (megatron-core --tp-comm-overlap, NeMo's "
                   "ub_tp_comm_overlap); TP inside a node")
    p.add_argument("--no-sequence-parallel", action="store_true",
                   help="cost the plan for a run with sequence parallelism off where the software has it (Megatron "
                   "without --sequence-parallel, NeMo's sequence_parallel: false): TP all-reduces, and the norms, "
                   "dropout and activations kept whole on every TP rank")
    p.add_argument("--headroom", type=float, default=0.0, metavar="PERCENT",
                   help="share of each GPU's memory a plan must leave free, in percent (default 0; recipes use 10)")
    p.add_argument("--tolerate-replica-loss", action="store_true",
                   help="plan for surviving the loss of a DP replica (hybridpar train --tolerate-replica-loss): "
                   "dp >= 2, the global batch divisible over dp - 1 replicas too, and each step costed with its "
                   "optimizer-state snapshot to host memory and, with ZeRO, the exchange with the next replica "
                   "(docs/planner.md); a recipe's reliability.tolerate_replica_loss turns it on too")
    p.add_argument("--top", type=int, default=5, help="plans to show (default 5)")
    p.add_argument("--json", action="store_true", help='print {"plans": [...], "rejected": [...], "ranges_from": ...}')


# Recipe parallel keys that become pins (dp is not one: it follows from --gpus).
RECIPE_PINS = {"tp": "tp", "pp": "pp", "cp": "cp", "vpp": "vpp", "zero": "zero_stage",
               "micro_batch": "micro_batch", "recompute": "recompute"}


def recipe_defaults(path: str) -> dict:
    """What a recipe contributes to the request: model, seq_len, global batch (sequences), GPU,
    GPUs per node, and pins for the parallel sizes the file writes out. hybridpar.recipe is
    torch-free at import (tests/integration/test_planner_imports.py checks it with this module)."""
    import yaml

    from hybridpar.config.recipe import load_recipe

    recipe = load_recipe(path)
    model = recipe.model
    tied = recipe.train.tied_embeddings
    if tied is not None and tied != model.tied_embeddings:
        model = replace(model, tied_embeddings=tied)
    written = (yaml.safe_load(Path(path).read_text()) or {}).get("parallel") or {}
    return {"model": model, "seq_len": recipe.train.seq_len or None,
            "global_batch": recipe.train.global_batch or None, "gpu": recipe.cluster.gpu,
            "gpus_per_node": recipe.cluster.gpus_per_node, "gpus": recipe.planned_world(),
            "tolerate_replica_loss": bool(getattr(recipe.reliability, "tolerate_replica_loss", False)),
            "pins": {name: getattr(recipe.parallel, key) for key, name in RECIPE_PINS.items() if key in written}}


def build_request(args) -> tuple[Request, int]:
    if not (args.model or args.recipe):
        raise UsageError("give --model NAME|FILE with --gpus N, or --recipe FILE, or --validate")
    base = recipe_defaults(args.recipe) if args.recipe else {"pins": {}}
    if args.gpus is None:
        args.gpus = base.get("gpus")
    if args.gpus is None:
        raise UsageError("--gpus N is required: the number of GPUs to plan for"
                         + (" (the recipe states no cluster.gpus)" if args.recipe else ""))
    if args.seq_len is None:
        args.seq_len = base.get("seq_len") or 8192
    if args.global_batch is None and args.global_batch_tokens is None:
        args.global_batch = base.get("global_batch")
    args.gpu = args.gpu or base.get("gpu") or "h100-80gb"
    if args.gpus_per_node is None:
        args.gpus_per_node = base.get("gpus_per_node")
    for key in ("gpus", "gpus_per_node", "seq_len", "global_batch", "global_batch_tokens", "top",
                "tp", "pp", "cp", "dp", "micro_batch", "vpp"):
        value = getattr(args, key)
        if value is not None and value < 1:
            raise UsageError(f"--{key.replace('_', '-')} must be a positive integer, got {value}")
    if not 0 <= args.headroom < 100:
        raise UsageError(f"--headroom is a percentage of GPU memory to leave free, from 0 to below 100; got {args.headroom}")
    if args.network_gbit is not None and not 0 < args.network_gbit < math.inf:
        raise UsageError(f"--network-gbit must be a positive number of Gbit/s per GPU, got {args.network_gbit}")
    software = SOFTWARE[getattr(args, "software", None) or "hybridpar"]
    if getattr(args, "cuda_launch_blocking", False):
        software = replace(software, launch_blocking=True)
    if getattr(args, "attention_kernel", None):
        software = replace(software, attention_kernel=args.attention_kernel)
    if getattr(args, "cross_entropy", None):
        software = replace(software, cross_entropy=args.cross_entropy)
    if getattr(args, "no_sequence_parallel", False):
        if getattr(args, "tp_comm_overlap", False):
            raise UsageError("--tp-comm-overlap overlaps the sequence-parallel TP collectives: it cannot go with "
                             "--no-sequence-parallel; drop one of them")
        software = replace(software, sequence_parallel=False)
    if getattr(args, "tp_comm_overlap", False):
        if software.name == "hybridpar":
            raise UsageError("--tp-comm-overlap: hybridpar's runtime does not set up Transformer Engine's userbuffers; "
                             "plan for the stack that does with --software megatron-core (or a NeMo profile)")
        if not (software.sequence_parallel and software.flash_attention):
            raise UsageError(f"--tp-comm-overlap overlaps the sequence-parallel TP collectives of Transformer Engine's "
                             f"layers, which --software {software.name} does not have; drop the flag or use "
                             f"--software megatron-core")
        software = replace(software, tp_comm_overlap=True)
    if getattr(args, "fp8_params", False):
        if args.precision != "fp8":
            raise UsageError(f"--fp8-params keeps the weights in fp8: it needs --precision fp8, not {args.precision}")
        software = replace(software, fp8_params=True, fp8_param_gather=True)
    if getattr(args, "fp8_scaling", None):
        if args.precision != "fp8":
            raise UsageError(f"--fp8-scaling sets how fp8 tensors are scaled: it needs --precision fp8, "
                             f"not {args.precision}")
        software = replace(software, fp8_scaling=args.fp8_scaling)
    if args.precision == "fp8" and software.fp8 is None:
        raise UsageError(f"--precision fp8: {software.label} has no fp8 training to plan; use --software megatron-core "
                         f"(or a NeMo profile: Transformer Engine's fp8) or --precision bf16")
    if software.name == "deepspeed-pipe-bf16" and args.precision != "bf16":
        raise UsageError(f"--software deepspeed-pipe-bf16 models DeepSpeed's BF16_Optimizer; use --precision bf16, "
                         f"not {args.precision}")
    if args.zero is not None and args.zero not in (0, 1, 2, 3):
        raise UsageError(f"--zero must be 0, 1, 2 or 3, got {args.zero}")
    try:
        gpu = load_gpu(args.gpu)
        if args.precision == "fp8":
            gpu.peak_tflops("fp8")
    except HardwareError as err:
        raise UsageError(str(err)) from None
    per_node = args.gpus_per_node or gpu.gpus_per_node
    if args.gpus > per_node and args.gpus % per_node:
        raise UsageError(f"--gpus {args.gpus} is not a multiple of --gpus-per-node {per_node}")
    model = base["model"] if args.recipe else load_model(args.model)
    if args.global_batch is not None:
        seqs = args.global_batch
    else:
        tokens = args.global_batch_tokens or DEFAULT_TOKENS
        if tokens % args.seq_len:
            raise UsageError(f"--global-batch-tokens {tokens} is not a multiple of --seq-len {args.seq_len}")
        seqs = tokens // args.seq_len
    pins = {**base["pins"], **{name: getattr(args, arg) for arg, name in PINS.items() if getattr(args, arg) is not None}}
    layout = [pins.get(a) for a in ("tp", "cp", "pp", "dp")]
    product = 1
    for size in layout:
        product *= size or 1
    if all(layout) and product != args.gpus:
        raise UsageError(f"--tp x --cp x --pp x --dp = {product}, but --gpus is {args.gpus}")
    if args.gpus % product:
        raise UsageError(f"pinned sizes multiply to {product}, which does not divide --gpus {args.gpus}")
    if "micro_batch" in pins and "dp" in pins and seqs % (pins["dp"] * pins["micro_batch"]):
        raise UsageError(f"global batch {seqs} sequences not divisible by --dp x --micro-batch = "
                         f"{pins['dp']} x {pins['micro_batch']}")
    req = Request(model=model, gpus=args.gpus, global_batch=seqs, seq_len=args.seq_len, gpu=gpu.name, gpu_spec=gpu,
                  gpus_per_node=per_node, precision=args.precision, pins=pins,
                  software=software,
                  network_gbps=None if args.network_gbit is None else args.network_gbit / 8,
                  headroom=args.headroom / 100,
                  tolerate_replica_loss=bool(args.tolerate_replica_loss or base.get("tolerate_replica_loss")))
    return req, args.top


# Defaults of the planning flags that are not None or False (add_arguments): --validate takes none of them.
_PLANNING_DEFAULTS = {"precision": "bf16", "headroom": 0.0, "top": 5}
# What --validate takes: --gpu and --software select the published runs shown.
_VALIDATE_FLAGS = ("command", "validate", "json", "gpu", "software")


def run(args) -> int:
    if args.validate:
        given = [k for k, v in vars(args).items() if k not in _VALIDATE_FLAGS
                 and v not in (None, False) and v != _PLANNING_DEFAULTS.get(k)]
        if given:
            flags = ", ".join(f"--{k.replace('_', '-')}" for k in given)
            raise UsageError(f"--validate costs each published run with its own layout and stack: {flags} would be "
                             "ignored; drop it (--gpu and --software select runs), or plan with --model/--recipe")
        gpu, software = validation_report.selection(args.gpu, args.software)
        print(json.dumps(validation_report.as_json(gpu, software), indent=1) if args.json
              else validation_report.render(gpu, software))
        return 0
    req, top = build_request(args)
    result = search(req, top=top)
    if args.json:
        print(json.dumps({"plans": [plan_json(req, e) for e in result.plans],
                          "rejected": [r.to_json() for r in result.rejected],
                          "ranges_from": validation.range_note(req.hardware().name, req.software.name)}, indent=1))
        return 0
    print(render(req, result))
    return 0


def region_note(req: Request, e) -> str | None:
    p = e.plan
    return validation.outside_validated_region(p.model.total_params, req.hardware().name, p.model.hidden // p.tp,
                                               p.seq_len)


def plan_json(req: Request, e) -> dict:
    """A plan's JSON: topology.search.Evaluated.to_json plus the GPU's memory, whether the plan is tight
    (within TIGHT_MARGIN of it), its ranges and, outside the validated region, the note saying so."""
    c, hardware = e.cost, req.hardware()
    gpu, sw = hardware.name, req.software.name
    return {**e.to_json(), "capacity_gib": round(hardware.memory_bytes / GIB, 2),
            "tight": _is_tight(e, hardware),
            "mfu_range": [round(x, 4) for x in validation.mfu_range(c.mfu, gpu, sw)],
            "step_time_s_range": [round(x, 4) for x in validation.step_time_range(c.step_time_s, gpu, sw)],
            "validated_region": region_note(req, e)}


def _is_tight(e, gpu) -> bool:
    """A plan that fits with less than TIGHT_MARGIN of the GPU's memory to spare."""
    return bool(e.fits and e.memory.tight(gpu.memory_bytes))


def _three_figures(seconds: float) -> str:
    """232, 57.9, 0.448, 0.500: three significant figures, trailing zeros kept so a range reads evenly."""
    decimals = max(0, 2 - math.floor(math.log10(seconds))) if seconds > 0 else 0
    return f"{seconds:.{decimals}f}"


def _grouped_by_plan(notes: list) -> list[str]:
    """One line per distinct note, naming the plans (numbered from 1) it is about unless it is about all."""
    plans: dict[str, list[str]] = {}
    for i, note in enumerate(notes, 1):
        if note:
            plans.setdefault(note, []).append(str(i))
    return [note if len(which) == len(notes) else f"{_plans(which)}: {note}" for note, which in sorted(plans.items())]


def _plans(numbers: list[str]) -> str:
    return f"{'plan' if len(numbers) == 1 else 'plans'} {', '.join(numbers)}"


def redundancy_line(r) -> str:
    return (f"replica-loss redundancy: +{r.added_s * 1e3:.1f} ms per step (d2h {r.d2h_s * 1e3:.1f} ms, "
            f"exchange {r.exchange_s * 1e3:.1f} ms), "
            f"host memory +{r.host_bytes / GIB:.2f} GiB per GPU")


def render(req: Request, result) -> str:
    gpu = req.hardware()
    network = "" if req.network_gbps is None else f", network {req.network_gbps * 8:g} Gbit/s per GPU"
    if req.headroom:
        network += f", {req.headroom:.0%} of memory left free"
    lines = [f"{req.model.name} on {req.gpus} x {gpu.name} ({req.gpus_per_node} per node{network}), seq {req.seq_len}, "
             f"global batch {req.global_batch} seqs = {req.global_batch * req.seq_len:,} tokens, {req.precision}, "
             f"planned for {req.software.label}; "
             f"{result.examined} configurations examined, {result.evaluated} fit and were costed"]
    rc_width = max([9] + [len(e.plan.recompute) for e in result.plans])  # torchtitan's policies have long names
    head = (f"{'#':>2} {'TP':>3} {'CP':>3} {'PP':>4} {'DP':>5} {'VPP':>3} {'mb':>3} {'GA':>4} {'Z':>1} "
            f"{'recomp':<{rc_width}} {'step s (range)':>21} {'tok/s':>10} {'TFLOP/s':>7} {'MFU (range)':>13} {'bubble':>6} "
            f"{'GiB':>5} fits")
    lines += ["", head, "-" * len(head)]
    for i, e in enumerate(result.plans, 1):
        p, c = e.plan, e.cost
        slo, shi = validation.step_time_range(c.step_time_s, gpu.name, req.software.name)
        mlo, mhi = validation.mfu_range(c.mfu, gpu.name, req.software.name)
        step = f"{_three_figures(c.step_time_s)} ({_three_figures(slo)}-{_three_figures(shi)})"
        mfu = f"{c.mfu:.0%} ({mlo * 100:.0f}-{mhi:.0%})"
        fits = "yes" if e.fits else "NO"
        if _is_tight(e, gpu):
            fits = "tight"
        lines.append(f"{i:>2} {p.tp:>3} {p.cp:>3} {p.pp:>4} {p.dp:>5} {p.vpp:>3} {p.micro_batch:>3} "
                     f"{p.grad_accum:>4} {p.zero_stage:>1} {p.recompute:<{rc_width}} {step:>21} "
                     f"{c.tokens_per_s:>10,.0f} {c.tflops_per_gpu:>7.1f} {mfu:>13} {c.bubble_fraction:>6.1%} "
                     f"{e.memory.total / GIB:>5.1f} {fits}")
    lines.append(validation.range_note(gpu.name, req.software.name))
    if req.precision == "fp8":
        lines.append(f"fp8: MFU over the dense fp8 peak ({gpu.peak_tflops('fp8'):,.0f} TFLOP/s); the layers' GEMMs in fp8 with "
                     f"Transformer Engine's casts, the output layer in bf16 (docs/planner.md, \"Time\": FP8)")
    lines += _grouped_by_plan([region_note(req, e) for e in result.plans])
    lighter = [str(i) for i, e in enumerate(result.plans, 1) if e.plan.lighter_end_stages]
    if lighter:
        lines.append(f"{_plans(lighter)}: lighter end stages (Llama 3): {req.model.layers} layers + embedding + "
                     f"loss over pp x vpp model chunks, the first and last holding one layer fewer")
    lines += ["", "Memory per GPU, GiB (largest pipeline stage):"]
    for i, e in enumerate(result.plans, 1):
        g = e.memory.gib()
        lines.append(f"{i:>2} {e.memory.stage:<12} weights {g['params']:>6.2f}  grads {g['grads']:>6.2f}  "
                     f"optimizer {g['optimizer']:>6.2f}  activations {g['activations']:>6.2f}  "
                     f"other {sum(g[k] for k in OTHER_PARTS):>5.2f}  total {g['total']:>6.2f} of {gpu.memory_gib:.1f}"
                     f"{f'  (tight: within {TIGHT_MARGIN:.0%} of capacity)' if _is_tight(e, gpu) else ''}")
        other = [f"{k.replace('_', ' ')} {g[k]:.2f}" for k in OTHER_PARTS if g[k]]
        lines.append(f"{'':>15}other: {', '.join(other)}")
    lines += ["", "Time per step, seconds (slowest pipeline rank; TP, DP: exposed, and compute lost beside hidden ones):"]
    for i, e in enumerate(result.plans, 1):
        c = e.cost
        lines.append(f"{i:>2} compute {c.compute_s:>8.3f}  bubble {c.bubble_s:>7.3f}  TP {c.tp_s:>7.3f}  "
                     f"CP {c.cp_s:>7.3f}  PP {c.pp_s:>7.3f}  DP {c.dp_s:>7.3f}  optimizer {c.optimizer_s:>6.3f}")
    if req.tolerate_replica_loss:
        lines += ["", f"Tolerating a replica loss: each step is followed, synchronously, by the optimizer-state snapshot "
                  f"to host memory and (ZeRO) its exchange with the next replica; the last {KEEP} steps kept; "
                  "included in the step times above:"]
        for i, e in enumerate(result.plans, 1):
            lines.append(f"{i:>2} {redundancy_line(e.redundancy)}")
    if result.rejected:
        lines += ["", f"Rejected layout families ({len(result.rejected)}), tightest first:"]
        shown = sorted(result.rejected, key=lambda r: (r.need_bytes == 0, r.need_bytes))[:12]
        for r in shown:
            where = f"TP={r.tp}" if not r.dp else f"TP={r.tp} CP={r.cp} PP={r.pp} DP={r.dp}"
            lines.append(f"  {where:<28} {r.reason}")
        if len(result.rejected) > len(shown):
            lines.append(f"  ... {len(result.rejected) - len(shown)} more (--json lists all)")
    return "\n".join(lines)
