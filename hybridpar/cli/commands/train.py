"""`hybridpar train`: train a recipe with DP outermost, TP x PP per replica, ZeRO on DP.

The launching process checks everything and resolves the whole run once: a RunPlan
(config/run.py) from the recipe and the flags. It claims the run directory (no overwrite of
another run, no two runs at once), writes the RunPlan to OUT/plan.json and starts the local
ranks with that file as their only input (``--run-plan``). Each rank trains until the last step
or until the ranks agree to stop early (a signal, --stop-at-step, --exit-after), saves that
step and leaves OUT/status.json saying how the run ended. Under a cluster launcher (torchrun,
SLURM) every rank resolves the RunPlan itself and rank 0 claims the directory. Exit codes: 0
every step trained, 2 bad input, 3 replicas drifted apart, 4 stopped on request, 6 a non-finite
loss or gradient norm, 128+N stopped by signal N.
"""
from __future__ import annotations

import argparse
import os
import sys

from hybridpar.cli import checkpoint_flags, reliability_flags, watch_flags
from hybridpar.errors import UsageError
from hybridpar.reliability.run_dir import STATUS_FILE as STATUS
from hybridpar.topology.software import HYBRIDPAR

HELP = "train a recipe: --nproc N starts N local ranks; under torchrun it runs as one rank"

OVERRIDES = ("tp", "cp", "pp", "dp", "vpp", "zero", "micro_batch", "recompute", "global_batch", "steps", "seed",
             "eval_every")


def add_arguments(p):
    p.add_argument("--recipe", help="recipe YAML file (format: docs/training.md)")
    p.add_argument("--run-plan", help=argparse.SUPPRESS)  # what the launcher hands its local ranks
    p.add_argument("--nproc", type=int, help="start this many local ranks (torch's elastic agent; on CPU forked from this process)")
    p.add_argument("--tp", type=int, help="tensor-parallel size (overrides the recipe)")
    p.add_argument("--cp", type=int, help="context-parallel size (each sequence split over cp ranks)")
    p.add_argument("--pp", type=int, help="pipeline-parallel size")
    p.add_argument("--dp", type=int, help="data-parallel size; derived as world / (tp x cp x pp) when left out")
    p.add_argument("--vpp", type=int, help="virtual pipeline stages per rank (interleaved 1F1B)")
    p.add_argument("--zero", type=int, help="ZeRO stage on the DP axis: 0, 1 or 2")
    p.add_argument("--micro-batch", type=int, help="sequences per micro-batch")
    p.add_argument("--recompute", choices=list(HYBRIDPAR.recompute_modes),
                   help="activation recomputation: none, selective (core attention) or full (whole layers)")
    p.add_argument("--global-batch", type=int, help="sequences per optimizer step, over all replicas")
    p.add_argument("--steps", type=int, help="total optimizer steps of the run (the LR schedule's length)")
    p.add_argument("--seed", type=int, help="seed for weights and data")
    p.add_argument("--eval-every", type=int, metavar="N",
                   help="loss on held-out data after every N steps and after the last (eval.every; 0: never)")
    p.add_argument("--out", help="run directory: metrics.jsonl, plan.json, status.json, ckpt/ (default runs/<recipe name>)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="train a recipe that names a GPU (cluster.gpu) on CPU ranks (gloo) where there is no CUDA")
    p.add_argument("--stop-at-step", type=int, metavar="N",
                   help="save and stop after step N (exit 4); the schedule still runs to --steps")
    p.add_argument("--exit-after", type=float, metavar="MINUTES",
                   help="save and stop (exit 4) before MINUTES have passed: when the next step and a save might not fit")
    checkpoint_flags.add_arguments(p)
    reliability_flags.add_arguments(p)
    watch_flags.add_arguments(p)


def _world(args) -> int:
    from hybridpar.launch.local import launcher_env_problem, launcher_world_size, under_launcher

    if under_launcher():
        problem = launcher_env_problem()
        if problem:
            raise UsageError(f"RANK and WORLD_SIZE are set, as a launcher sets them, but {problem}: start the ranks with "
                             "torchrun (or `hybridpar launch`'s scripts), or unset RANK and WORLD_SIZE and use --nproc N")
        return launcher_world_size()
    if args.nproc is not None:
        if args.nproc < 1:
            raise UsageError(f"--nproc must be a positive integer, got {args.nproc}")
        return args.nproc
    return 1


def checked_recipe(args, world: int):
    """The recipe with every flag applied and validated for ``world`` ranks: the checks that need no
    rank, GPU or data. `hybridpar launch` runs them for the cluster's world before it writes a script."""
    from hybridpar.config.recipe import load_recipe, with_overrides

    if not args.recipe:
        raise UsageError("--recipe is required: the recipe YAML to train (e.g. recipes/default.yaml)")
    recipe = load_recipe(args.recipe)
    flags = {k: getattr(args, k) for k in OVERRIDES}
    for key, value in flags.items():
        if isinstance(value, int) and key in ("zero", "seed", "eval_every") and value < 0:
            raise UsageError(f"--{key.replace('_', '-')} must be 0 or a positive integer, got {value}")
        if isinstance(value, int) and key not in ("zero", "seed", "eval_every") and value < 1:
            raise UsageError(f"--{key.replace('_', '-')} must be a positive integer, got {value}")
    if args.stop_at_step is not None and args.stop_at_step < 1:
        raise UsageError(f"--stop-at-step must be a positive step number, got {args.stop_at_step}")
    if args.exit_after is not None and not 0 < args.exit_after < float("inf"):
        raise UsageError(f"--exit-after must be a positive number of minutes, got {args.exit_after}")
    if args.overwrite and args.resume:
        raise UsageError("--overwrite deletes the run that --resume would continue: give one of them")
    recipe = with_overrides(recipe, **flags)
    recipe = watch_flags.apply(reliability_flags.apply(recipe, args), args)
    recipe = recipe.validate(world)
    watch_flags.profile_settings(args, recipe.train.steps, world)
    if args.stop_at_step is not None and args.stop_at_step > recipe.train.steps:
        raise UsageError(f"--stop-at-step {args.stop_at_step} is beyond the run's last step {recipe.train.steps}: "
                         "it would never stop there; give a step up to --steps")
    return recipe


def prepare(args):
    """Recipe + flags, validated against the world size and resolved into the RunPlan: everything
    checked before any rank starts."""
    from hybridpar.config.run import RunPlan, StopSettings
    from hybridpar.launch.local import under_launcher

    if getattr(args, "tolerate_replica_loss", None) and (under_launcher() or not args.nproc or args.nproc < 2):
        raise UsageError("--tolerate-replica-loss runs its own launcher: use it with --nproc N on one machine, "
                         "not under torchrun or SLURM")
    recipe = checked_recipe(args, _world(args))
    out = args.out or os.path.join("runs", recipe.name)
    recipe, checkpoint = checkpoint_flags.apply(recipe, args, out)
    if args.stop_at_step is not None and checkpoint.resumed_step and args.stop_at_step <= checkpoint.resumed_step:
        raise UsageError(f"--stop-at-step {args.stop_at_step} is not after step {checkpoint.resumed_step}, where this "
                         "run resumes: give a later step")
    cuda = _refuse_silent_cpu(recipe, args)
    if cuda:
        _refuse_more_ranks_than_gpus(args.nproc)
    from hybridpar.data.preflight import check_data_source

    d = recipe.data
    check_data_source(d.source, model_vocab=recipe.model.vocab, path=d.path, tokenizer=d.tokenizer,
                      held_out=d.held_out, seq_len=recipe.train.seq_len, blend=d.blend)
    if os.environ.get("RANK", "0") == "0":  # the launcher, or rank 0 under a cluster launcher
        for line in recipe.warnings():
            print(f"hybridpar train: warning: {line}", file=sys.stderr, flush=True)
    return RunPlan(
        name=recipe.name, plan=recipe.to_plan(cuda), optim=recipe.optim_config(), seed=recipe.train.seed,
        data=recipe.data, out=out, overlap_grad_reduce=recipe.parallel.overlap_grad_reduce,
        overlap_param_gather=recipe.parallel.overlap_param_gather, checkpoint=checkpoint,
        reliability=recipe.reliability, sample=recipe.generate, eval=recipe.eval,
        stop=StopSettings(args.stop_at_step, None if args.exit_after is None else args.exit_after * 60),
        profile=watch_flags.profile_settings(args, recipe.train.steps, recipe.to_plan_unresolved().world_size),
        progress=args.progress, recipe=args.recipe,
    )


def _refuse_silent_cpu(recipe, args) -> bool:
    """Whether this machine has CUDA. A recipe written for GPUs must not quietly train on CPU
    ranks: it would run in another precision, on gloo, orders of magnitude slower, and look like
    it works."""
    import torch

    cuda = torch.cuda.is_available()
    if recipe.cluster.gpu and not args.allow_cpu and not cuda:
        raise UsageError(f"recipe {args.recipe} is for {recipe.cluster.gpu} GPUs, and this machine has no CUDA "
                         f"(torch {torch.__version__}); run it on a GPU machine (scripts/setup.sh installs a CUDA torch "
                         f"there), or pass --allow-cpu to train on CPU ranks anyway")
    return cuda


def _refuse_more_ranks_than_gpus(nproc: int | None) -> None:
    """Each local rank drives the GPU of its local rank: more of them than this machine has GPUs
    would start, and fail one by one on a device that does not exist."""
    import torch

    from hybridpar.launch.local import under_launcher

    gpus = torch.cuda.device_count()
    if under_launcher():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= gpus:
            raise UsageError(f"local rank {local} has no GPU: this machine has {gpus}; start at most {gpus} ranks per node")
    elif nproc is not None and nproc > gpus:
        raise UsageError(f"--nproc {nproc} starts one rank per GPU, and this machine has {gpus}; use --nproc {gpus} or "
                         f"fewer, or spread the ranks over machines with `hybridpar launch`")


def _quiet_libraries() -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)


def run(args) -> int:
    from hybridpar.config.run import RunPlan
    from hybridpar.launch.local import exit_rank, launch_local, under_launcher
    from hybridpar.reliability.run_dir import RunDirs, claim

    if args.run_plan:  # a rank started by `hybridpar train --nproc`: the launcher resolved and claimed the run
        code = _run_rank(RunPlan.load(args.run_plan), claimed=True, launched=True)
        exit_rank(code)
    if args.nproc is not None and args.nproc > 1:
        # what torchrun gives its ranks; set before prepare() imports torch, so that on CPU this
        # process starts no OpenMP workers and can fork the ranks (launch/forked.py)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    run = prepare(args)
    if under_launcher():  # a rank under torchrun or SLURM: rank 0 claims the run for all
        return _run_rank(run, claimed=False, launched=True, overwrite=args.overwrite)
    held = claim(RunDirs(run.out, run.checkpoint.save_dir), resuming=bool(run.checkpoint.resume),
                 overwrite=args.overwrite)
    try:
        if args.nproc is not None and args.nproc > 1:
            plan_file = os.path.join(run.out, "plan.json")
            run.save(plan_file)
            argv = ["train", "--run-plan", plan_file]
            if run.reliability.tolerate_replica_loss:
                from hybridpar.launch.tolerant import TolerantLauncher

                code = TolerantLauncher(args.nproc, argv, run.plan.layout.model_parallel_size,
                                        run.reliability.rejoin_after_s, run.reliability.timeout_s).run()
            else:
                code = launch_local(args.nproc, argv, stop_grace_s=run.reliability.timeout_s)
            return _exit_code(run.out, code)
        return _run_rank(run, claimed=True, launched=False)
    finally:
        held.release()


def _run_rank(run, claimed: bool, launched: bool, overwrite: bool = False) -> int:
    _quiet_libraries()
    from hybridpar.launch.local import init_distributed, is_lost_peer, lost_peer, shutdown
    from hybridpar.observe.metrics import StepMonitor
    from hybridpar.launch.tolerant import CANNOT_GO_ON
    from hybridpar.reliability.replica_loss import ReplicaLossError, speaks
    from hybridpar.reliability.nonfinite import EXIT_CODE as NONFINITE_EXIT, NonFiniteError
    from hybridpar.reliability.replicas import ReplicaDriftError
    from hybridpar.reliability.stopping import StopConditions
    from hybridpar.runtime.loop import run_hooks, train

    stop = StopConditions(run.stop.stop_at_step, run.stop.exit_after_s)
    stop.install()  # before the slow start: a signal from now on stops after the first step
    init_distributed(timeout_s=run.reliability.timeout_s)
    import torch.distributed as dist

    rank0 = dist.get_rank() == 0
    held = monitor = None
    code, failed = 0, False
    try:
        if not claimed:
            held = _claim_on_rank0(run, overwrite)
        if rank0:
            plan = run.plan
            print(
                f"hybridpar train: {run.name}: world {plan.world_size} = tp {plan.tp} x cp {plan.cp} x pp {plan.pp}"
                f" x dp {plan.dp} (order {plan.order}), vpp {plan.vpp}, ZeRO-{plan.zero_stage}, recompute {plan.recompute}, micro-batch"
                f" {plan.micro_batch} x {plan.grad_accum} per replica, {plan.precision}; writing {run.out}",
                flush=True,
            )
            _write_status(run.out, {"status": "running", "step": run.checkpoint.resumed_step})
        monitor = StepMonitor(run.out, run.steps, progress=run.progress)
        say = monitor.write  # print(..., flush=True), through tqdm when rank 0 shows a bar
        hooks = run_hooks(run, say, stop, monitor)
        outcome = train(run, hooks=hooks, print_fn=say, stop=stop)
        if rank0:
            _report_end(run.out, outcome, hooks)
        code = outcome.stopped.exit_code if outcome.stopped else 0
    except ReplicaDriftError as err:
        if rank0:
            print(f"hybridpar train: error: {err}", file=sys.stderr, flush=True)
        code = 3
    except NonFiniteError as err:  # every rank sees the same loss and norm: one line, from rank 0
        if rank0:
            print(f"hybridpar train: error: {err}", file=sys.stderr, flush=True)
            _write_status(run.out, {"status": "failed", "step": err.step, "reason": f"non-finite loss or gradient "
                                    f"norm at step {err.step}", "exit_code": NONFINITE_EXIT})
        code = NONFINITE_EXIT
    except UsageError as err:  # found after the ranks started (the run's claim): one line, from rank 0
        if rank0:
            print(f"hybridpar train: error: {err}", file=sys.stderr, flush=True)
        code = 2
    except ReplicaLossError as err:  # --tolerate-replica-loss: the replicas left cannot go on
        if speaks():
            print(f"hybridpar train: error: {err}", file=sys.stderr, flush=True)
        code, failed = CANNOT_GO_ON, True
    except Exception as err:
        if is_lost_peer(err):
            lost_peer(err)  # does not return: the process group is unusable, a barrier would fail or hang
        failed = True
        raise
    finally:
        if monitor is not None:
            monitor.close()
        shutdown(barrier=not failed)  # after an error the peers may never come to a barrier
        if held is not None:
            held.release()
    # A rank under a launcher ends a clean early stop with 0, so the agent reports no failed
    # ranks; the launcher (or a job script) reads the stop's code from status.json (_exit_code).
    return 0 if launched and code not in (2, 3, CANNOT_GO_ON, NONFINITE_EXIT) else code


def _claim_on_rank0(run, overwrite: bool):
    """Rank 0 claims the run directory; every rank learns the outcome (a UsageError on all)."""
    import torch.distributed as dist

    from hybridpar.reliability.run_dir import RunDirs, claim

    held, error = None, None
    if dist.get_rank() == 0:
        try:
            held = claim(RunDirs(run.out, run.checkpoint.save_dir), resuming=bool(run.checkpoint.resume), overwrite=overwrite)
        except UsageError as err:
            error = str(err)
    box = [error]
    dist.broadcast_object_list(box, src=0)
    if box[0]:
        raise UsageError(box[0])
    return held


def _report_end(out: str, outcome, hooks) -> None:
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

    from hybridpar.files import write_atomic

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
    if status.get("status") == "running" and launcher_code != 0:  # no rank could say: a rank died, or no way on
        _write_status(out, {**status, "status": "failed", "exit_code": launcher_code})
    return launcher_code
