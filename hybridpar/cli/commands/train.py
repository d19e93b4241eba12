"""`hybridpar train`: train a recipe with DP outermost, TP x PP per replica, ZeRO on DP.

The launching process checks everything, claims the run directory (run_dir.py: no overwrite of
another run, no two runs at once) and starts the ranks; each rank trains until the last step or
until the ranks agree to stop early (stopping.py: a signal, --stop-at-step, --exit-after), saves
that step and leaves ``OUT/status.json`` saying how the run ended. Exit codes: 0 every step
trained, 2 bad input, 3 replicas drifted apart, 4 stopped on request, 128+N stopped by signal N.
"""
from __future__ import annotations

import os
import sys

from hybridpar.topology.plan import RECOMPUTE_MODES

from hybridpar.cli import reliability_flags as reliability_cli, watch_flags as watch_cli
from hybridpar.cli import checkpoint_flags as checkpoint_cli
from hybridpar.cli.flags import flags_argv
from hybridpar.errors import UsageError

HELP = "train a recipe: --nproc N starts N local ranks; under torchrun it runs as one rank"

OVERRIDES = ("tp", "cp", "pp", "dp", "vpp", "zero", "micro_batch", "recompute", "global_batch", "steps", "seed")
STOP_FLAGS = ("stop_at_step", "exit_after")
STATUS = "status.json"


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
    p.add_argument("--steps", type=int, help="total optimizer steps of the run (the LR schedule's length)")
    p.add_argument("--seed", type=int, help="seed for weights and data")
    p.add_argument("--out", help="run directory: metrics.jsonl, plan.json, status.json, ckpt/ (default runs/<recipe name>)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="train a recipe that names a GPU (cluster.gpu) on CPU ranks (gloo) where there is no CUDA")
    p.add_argument("--stop-at-step", type=int, metavar="N",
                   help="save and stop after step N (exit 4); the schedule still runs to --steps")
    p.add_argument("--exit-after", type=float, metavar="MINUTES",
                   help="save and stop (exit 4) before MINUTES have passed: when the next step and a save might not fit")
    checkpoint_cli.add_arguments(p)
    reliability_cli.add_arguments(p)
    watch_cli.add_arguments(p)


def _world(args) -> int:
    from hybridpar.launch.local import launcher_world_size, under_launcher

    if under_launcher():
        return launcher_world_size()
    if args.nproc is not None:
        if args.nproc < 1:
            raise UsageError(f"--nproc must be a positive integer, got {args.nproc}")
        return args.nproc
    return 1


def prepare(args):
    """Recipe + flags, validated against the world size: everything checked before any rank
    starts. Returns (recipe, run directory, checkpoint_cli.CheckpointPlan)."""
    from hybridpar.config.recipe import load_recipe, with_overrides

    recipe = load_recipe(args.recipe)
    flags = {k: getattr(args, k) for k in OVERRIDES}
    for key, value in flags.items():
        if isinstance(value, int) and (value < 0 or (value == 0 and key not in ("zero", "seed"))):
            raise UsageError(f"--{key.replace('_', '-')} must be a positive integer, got {value}")
    if args.stop_at_step is not None and args.stop_at_step < 1:
        raise UsageError(f"--stop-at-step must be a positive step number, got {args.stop_at_step}")
    if args.exit_after is not None and not 0 < args.exit_after < float("inf"):
        raise UsageError(f"--exit-after must be a positive number of minutes, got {args.exit_after}")
    if args.overwrite and args.resume:
        raise UsageError("--overwrite deletes the run that --resume would continue: give one of them")
    recipe = with_overrides(recipe, **flags)
    recipe = watch_cli.apply(reliability_cli.apply(recipe, args), args)
    recipe = recipe.validate(_world(args))
    out = args.out or os.path.join("runs", recipe.name)
    recipe, ckpt = checkpoint_cli.apply(recipe, args, out)
    _refuse_silent_cpu(recipe, args)
    from hybridpar.data.preflight import check_data_source

    d = recipe.data
    check_data_source(d.source, model_vocab=recipe.model.vocab, path=d.path, tokenizer=d.tokenizer)
    if _first_to_check():
        for line in recipe.warnings():
            print(f"hybridpar train: warning: {line}", file=sys.stderr, flush=True)
    return recipe, out, ckpt


def _first_to_check() -> bool:
    """Whether this process says what every process finds: the launching process, or rank 0 under
    another launcher (the ranks that `--nproc` starts check again, quietly)."""
    from hybridpar.launch.local import INPUT_CHECKED, under_launcher

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
    from hybridpar.launch.local import launch_local, under_launcher
    from hybridpar.reliability.run_dir import CLAIMED_ENV, RunDirs, claim

    recipe, out, ckpt = prepare(args)
    dirs = RunDirs(out, ckpt.save_dir)
    if under_launcher():
        return _run_rank(args, recipe, out, ckpt, claimed=bool(os.environ.get(CLAIMED_ENV)), launched=True)
    held = claim(dirs, resuming=bool(ckpt.resume), overwrite=args.overwrite)
    try:
        if args.nproc is not None and args.nproc > 1:
            os.environ[CLAIMED_ENV] = "1"  # the ranks inherit it: this process holds the run
            code = launch_local(args.nproc, ["train", *_argv_of(args, out)], stop_grace_s=recipe.reliability.timeout_s)
            return _exit_code(out, code)
        return _run_rank(args, recipe, out, ckpt, claimed=True, launched=False)
    finally:
        held.release()


def _run_rank(args, recipe, out: str, ckpt, claimed: bool, launched: bool) -> int:
    _quiet_libraries()
    from hybridpar.launch.local import init_distributed, is_lost_peer, lost_peer, shutdown
    from hybridpar.reliability.replicas import ReplicaDriftError
    from hybridpar.reliability.stopping import StopConditions
    from hybridpar.runtime.train import train

    stop = StopConditions(args.stop_at_step, None if args.exit_after is None else args.exit_after * 60)
    stop.install()  # before the slow start: a signal from now on stops after the first step
    init_distributed(timeout_s=recipe.reliability.timeout_s)
    import torch.distributed as dist

    rank0 = dist.get_rank() == 0
    held = None
    code = 0
    try:
        if not claimed:  # a cluster launcher started the ranks: rank 0 claims the run for all
            held = _claim_on_rank0(out, ckpt, args.overwrite)
        if rank0:
            plan = recipe.to_plan()
            print(
                f"hybridpar train: {recipe.name}: world {plan.world_size} = tp {plan.tp} x cp {plan.cp} x pp {plan.pp}"
                f" x dp {plan.dp} (order {plan.order}), vpp {plan.vpp}, ZeRO-{plan.zero_stage}, recompute {plan.recompute}, micro-batch"
                f" {plan.micro_batch} x {plan.grad_accum} per replica, {plan.precision}; writing {out}",
                flush=True,
            )
            _write_status(out, {"status": "running", "step": ckpt.resumed_step})
        monitor = watch_cli.monitor(recipe, args, out)
        say = monitor.write  # print(..., flush=True), through tqdm when rank 0 shows a bar
        hooks = reliability_cli.hooks(recipe, say) + checkpoint_cli.hooks(recipe, ckpt, say, stop=stop)
        hooks += watch_cli.hooks(monitor, recipe, out)
        outcome = train(recipe, out, hooks=hooks, print_fn=say, stop=stop)
        if rank0:
            _report_end(out, recipe, outcome, hooks)
        code = outcome.stopped.exit_code if outcome.stopped else 0
    except ReplicaDriftError as err:
        if rank0:
            print(f"hybridpar train: error: {err}", file=sys.stderr, flush=True)
        code = 3
    except UsageError as err:  # found after the ranks started (the run's claim): one line, from rank 0
        if rank0:
            print(f"hybridpar train: error: {err}", file=sys.stderr, flush=True)
        code = 2
    except Exception as err:
        if is_lost_peer(err):
            lost_peer(err)  # does not return: the process group is unusable, a barrier would fail or hang
        raise
    finally:
        shutdown()
        if held is not None:
            held.release()
    # A rank under a launcher ends a clean early stop with 0, so the agent reports no failed
    # ranks; the launcher (or a job script) reads the stop's code from status.json (_exit_code).
    return 0 if launched and code not in (2, 3) else code


def _claim_on_rank0(out: str, ckpt, overwrite: bool):
    """Rank 0 claims the run directory; every rank learns the outcome (a UsageError on all)."""
    import torch.distributed as dist

    from hybridpar.reliability.run_dir import RunDirs, claim

    held, error = None, None
    if dist.get_rank() == 0:
        try:
            held = claim(RunDirs(out, ckpt.save_dir), resuming=bool(ckpt.resume), overwrite=overwrite)
        except UsageError as err:
            error = str(err)
    box = [error]
    dist.broadcast_object_list(box, src=0)
    if box[0]:
        raise UsageError(box[0])
    return held


def _report_end(out: str, recipe, outcome, hooks) -> None:
    """Rank 0: the one line an early stop prints, and OUT/status.json."""
    last = outcome.history[-1].step if outcome.history else None
    saved = next((h.saved[-1] for h in hooks if getattr(h, "saved", None)), None)
    if outcome.stopped is None:
        _write_status(out, {"status": "finished", "step": last, "exit_code": 0, "checkpoint": saved})
        return
    s = outcome.stopped
    where = f"saved {saved}" if saved else "no checkpoint (saving is off)"
    print(f"hybridpar train: stopped at step {s.step} by {s.describe()}; {where}; resume with --resume auto",
          file=sys.stderr, flush=True)
    _write_status(out, {"status": "stopped", "step": s.step, "reason": s.describe(), "exit_code": s.exit_code,
                        "checkpoint": saved})


def _write_status(out: str, status: dict) -> None:
    import json

    from hybridpar.runtime.train import write_atomic

    os.makedirs(out, exist_ok=True)
    write_atomic(os.path.join(out, STATUS), json.dumps(status, sort_keys=True) + "\n")


def _exit_code(out: str, launcher_code: int) -> int:
    """The job's exit code after local ranks ended: a clean early stop's, from status.json."""
    import json

    try:
        with open(os.path.join(out, STATUS)) as f:
            status = json.load(f)
    except (OSError, ValueError):
        return launcher_code
    if status.get("status") == "stopped" and launcher_code in (0,) + tuple(range(128, 160)):
        return int(status["exit_code"])
    return launcher_code


def _argv_of(args, out: str) -> list[str]:
    """The ranks' command line: the same recipe and flags, without --nproc."""
    argv = ["--recipe", args.recipe, *flags_argv(args, OVERRIDES + STOP_FLAGS)]
    argv += ["--allow-cpu"] if args.allow_cpu else []
    return argv + checkpoint_cli.argv(args) + reliability_cli.argv(args) + watch_cli.argv(args) + ["--out", out]
