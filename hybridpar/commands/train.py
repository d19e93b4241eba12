"""`hybridpar train`: train a recipe with DP outermost, TP x PP per replica, ZeRO on DP."""
from __future__ import annotations

import os
import sys

from topology.plan import RECOMPUTE_MODES

from .. import reliability_cli, watch_cli
from ..checkpoint import cli as checkpoint_cli
from ..cli_flags import flags_argv
from ..errors import UsageError

HELP = "train a recipe: --nproc N starts N local ranks; under torchrun it runs as one rank"

OVERRIDES = ("tp", "cp", "pp", "dp", "vpp", "zero", "micro_batch", "recompute", "global_batch", "steps", "seed")


def add_arguments(p):
    p.add_argument("--recipe", required=True, help="recipe YAML file (format: README, 'Training')")
    p.add_argument("--nproc", type=int, help="start this many local ranks (torch's elastic launcher)")
    p.add_argument("--tp", type=int, help="tensor-parallel size (overrides the recipe)")
    p.add_argument("--cp", type=int, help="context-parallel size (each sequence split over cp ranks)")
    p.add_argument("--pp", type=int, help="pipeline-parallel size")
    p.add_argument("--dp", type=int, help="data-parallel size; derived as world / (tp x cp x pp) when left out")
    p.add_argument("--vpp", type=int, help="virtual pipeline stages per rank (interleaved 1F1B)")
    p.add_argument("--zero", type=int, help="ZeRO stage on the DP axis: 0, 1 or 2")
    p.add_argument("--micro-batch", type=int, help="sequences per micro-batch")
    p.add_argument("--recompute", choices=list(RECOMPUTE_MODES),
                   help="activation recomputation: none, selective (core attention) or full (whole layers)")
    p.add_argument("--global-batch", type=int, help="sequences per optimizer step, over all replicas")
    p.add_argument("--steps", type=int, help="total optimizer steps of the run")
    p.add_argument("--seed", type=int, help="seed for weights and data")
    p.add_argument("--out", help="run directory for metrics.jsonl and plan.json (default runs/<recipe name>)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="train a recipe that names a GPU (cluster.gpu) on CPU ranks (gloo) where there is no CUDA")
    checkpoint_cli.add_arguments(p)
    reliability_cli.add_arguments(p)
    watch_cli.add_arguments(p)


def _world(args) -> int:
    from ..launch import launcher_world_size, under_launcher

    if under_launcher():
        return launcher_world_size()
    if args.nproc is not None:
        if args.nproc < 1:
            raise UsageError(f"--nproc must be a positive integer, got {args.nproc}")
        return args.nproc
    return 1


def prepare(args):
    """Recipe + flags, validated against the world size: everything checked before any rank starts."""
    from ..recipe import load_recipe, with_overrides

    recipe = load_recipe(args.recipe)
    flags = {k: getattr(args, k) for k in OVERRIDES}
    for key, value in flags.items():
        if isinstance(value, int) and (value < 0 or (value == 0 and key not in ("zero", "seed"))):
            raise UsageError(f"--{key.replace('_', '-')} must be a positive integer, got {value}")
    recipe = with_overrides(recipe, **flags)
    recipe = watch_cli.apply(reliability_cli.apply(recipe, args), args)
    recipe = checkpoint_cli.apply(recipe.validate(_world(args)), args)
    _refuse_silent_cpu(recipe, args)
    from ..data.preflight import check_data_source

    d = recipe.data
    check_data_source(d.source, model_vocab=recipe.model.vocab, path=d.path, tokenizer=d.tokenizer)
    if _first_to_check():
        for line in recipe.warnings():
            print(f"hybridpar train: warning: {line}", file=sys.stderr, flush=True)
    return recipe


def _first_to_check() -> bool:
    """Whether this process says what every process finds: the launching process, or rank 0 under
    another launcher (the ranks that `--nproc` starts check again, quietly)."""
    from ..launch import INPUT_CHECKED, under_launcher

    return not under_launcher() or (os.environ.get("RANK") == "0" and INPUT_CHECKED not in os.environ)


def _refuse_silent_cpu(recipe, args) -> None:
    """A recipe written for GPUs must not quietly train on CPU ranks: it would run in another
    precision, on gloo, orders of magnitude slower, and look like it works."""
    if not recipe.cluster.gpu or args.allow_cpu:
        return
    import torch

    if not torch.cuda.is_available():
        raise UsageError(f"recipe {args.recipe} is for {recipe.cluster.gpu} GPUs, and this machine has no CUDA "
                         f"(torch {torch.__version__}); run it on a GPU machine (scripts/setup.sh installs a CUDA torch "
                         f"there), or pass --allow-cpu to train on CPU ranks anyway")


def _quiet_libraries() -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)


def run(args) -> int:
    from ..launch import launch_local, under_launcher

    recipe = prepare(args)
    out = args.out or os.path.join("runs", recipe.name)
    if args.nproc is not None and args.nproc > 1 and not under_launcher():
        return launch_local(args.nproc, ["train", *_argv_of(args, out)])
    _quiet_libraries()
    from ..launch import init_distributed, is_lost_peer, lost_peer, shutdown
    from ..replicas import ReplicaDriftError
    from ..train import train

    init_distributed(timeout_s=recipe.reliability.timeout_s)
    code = 0
    try:
        import torch.distributed as dist

        if dist.get_rank() == 0:
            plan = recipe.to_plan()
            print(
                f"hybridpar train: {recipe.name}: world {plan.world_size} = tp {plan.tp} x cp {plan.cp} x pp {plan.pp}"
                f" x dp {plan.dp} (order {plan.order}), vpp {plan.vpp}, ZeRO-{plan.zero_stage}, recompute {plan.recompute}, micro-batch"
                f" {plan.micro_batch} x {plan.grad_accum} per replica, {plan.precision}; writing {out}",
                flush=True,
            )
        monitor = watch_cli.monitor(recipe, args, out)
        say = monitor.write  # print(..., flush=True), through tqdm when rank 0 shows a bar
        hooks = reliability_cli.hooks(recipe, say) + checkpoint_cli.hooks(recipe, args, say)
        hooks += watch_cli.hooks(monitor, recipe, out)
        train(recipe, out, hooks=hooks, print_fn=say)
    except ReplicaDriftError as err:
        if dist.get_rank() == 0:
            print(f"hybridpar train: error: {err}", file=sys.stderr, flush=True)
        code = 3
    except Exception as err:
        if is_lost_peer(err):
            lost_peer(err)  # does not return: the process group is unusable, a barrier would fail or hang
        raise
    finally:
        shutdown()
    return code


def _argv_of(args, out: str) -> list[str]:
    """The ranks' command line: the same recipe and flags, without --nproc."""
    argv = ["--recipe", args.recipe, *flags_argv(args, OVERRIDES)] + (["--allow-cpu"] if args.allow_cpu else [])
    return argv + checkpoint_cli.argv(args) + reliability_cli.argv(args) + watch_cli.argv(args) + ["--out", out]
