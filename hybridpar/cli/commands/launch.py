"""`hybridpar launch`: write the torchrun command for every node and, with --slurm, an sbatch script."""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from hybridpar.topology.layout import NodeMap

from hybridpar.cli import checkpoint_flags
from hybridpar.errors import UsageError
from hybridpar.files import head_of, write_atomic

HELP = "write multi-node torchrun commands (c10d rendezvous) and, with --slurm, an sbatch script"

# Train flags that launch's own options or its launcher decide, and what to give instead.
OWNED_TRAIN_FLAGS = {
    "recipe": "give the recipe as launch's --recipe",
    "nproc": "torchrun starts --gpus-per-node ranks on each node; drop --nproc",
    "tolerate_replica_loss": "it runs its own launcher on one machine, not under torchrun or SLURM",
}
SLURM_TRAIN_FLAGS = {  # what the sbatch script sets itself, for every requeued attempt
    "out": "the sbatch script trains into --run-dir: give launch --run-dir instead",
    "resume": "the sbatch script resumes with --resume auto on every attempt; drop --resume",
    "overwrite": "every requeued attempt would delete the run it continues; clear the run directory by hand instead",
}


def add_arguments(p):
    p.add_argument("--recipe", required=True, help="recipe YAML (its layout must fill nodes x gpus-per-node)")
    p.add_argument("--nodes", type=int, help="number of nodes (default: the GPUs the recipe states, cluster.gpus or "
                                                     "tp x cp x pp x dp, over --gpus-per-node)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the recipe's cluster.gpus_per_node)")
    p.add_argument("--slurm", action="store_true", help="also write an sbatch script")
    p.add_argument("--partition", help="SLURM partition (with --slurm)")
    p.add_argument("--time", default="48:00:00", help="SLURM time limit (with --slurm)")
    p.add_argument("--cpus-per-task", type=int, default=64, help="CPU cores of each node's one task (with --slurm)")
    p.add_argument("--venv", help="virtualenv the job activates (with --slurm; default: the one running this command)")
    p.add_argument("--run-dir", help="the run's --out, continued by every requeued attempt (default: runs/<recipe name>)")
    p.add_argument("--port", type=int, default=29500, help="rendezvous port on the head node")
    p.add_argument("--out", help="directory for the files (default: launch/<recipe name>)")
    p.add_argument("train_args", nargs="*", help="extra `hybridpar train` flags, after --")


def _planned_nodes(gpus, gpus_per_node) -> int:
    if gpus is None:
        raise UsageError("--nodes N is required: the recipe states no cluster.gpus and leaves parallel.dp to the "
                         "world size")
    if gpus % gpus_per_node:
        raise UsageError(f"the recipe's {gpus} GPUs do not fill whole nodes of {gpus_per_node}; give --nodes")
    return gpus // gpus_per_node


def run(args) -> int:
    from hybridpar.launch.scripts import LaunchSpec, SlurmOptions, node_commands, sbatch_script
    from hybridpar.cli.commands.train import checked_recipe
    from hybridpar.config.recipe import load_recipe

    if args.nodes is not None and args.nodes < 1:
        raise UsageError(f"--nodes must be a positive integer, got {args.nodes}")
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise UsageError(f"--gpus-per-node must be a positive integer, got {args.gpus_per_node}")
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    for flag, value in (("--partition", args.partition), ("--venv", args.venv), ("--run-dir", args.run_dir)):
        if value and not args.slurm:  # torchrun.sh trains into train's own --out, in the caller's environment
            raise UsageError(f"{flag} only applies with --slurm")
    if args.cpus_per_task < 1:
        raise UsageError(f"--cpus-per-task must be a positive integer, got {args.cpus_per_task}")
    _check_slurm_options(args)
    train_flags = _train_flags(args)
    stated = load_recipe(args.recipe)
    gpus_per_node = args.gpus_per_node or stated.cluster.gpus_per_node
    if args.nodes is None:
        args.nodes = _planned_nodes(stated.planned_world(), gpus_per_node)
    world = args.nodes * gpus_per_node
    recipe = checked_recipe(train_flags, world)  # with the train flags' overrides: the layout torchrun will run
    run_dir = args.run_dir or os.path.join("runs", recipe.name)
    checkpoint_flags.apply(recipe, train_flags, train_flags.out or run_dir)
    layout = recipe.to_plan_unresolved().layout
    NodeMap(layout, gpus_per_node)  # raises when the world does not fill whole nodes
    spec = LaunchSpec(
        recipe=args.recipe, nodes=args.nodes, gpus_per_node=gpus_per_node, layout=layout,
        rdzv_port=args.port, job_id=f"hybridpar-{recipe.name}", extra_args=tuple(args.train_args),
    )
    out = Path(args.out or Path("launch") / recipe.name)
    _refuse_foreign_files(out, ["torchrun.sh", *(["job.sbatch"] if args.slurm else [])])
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create output directory {out}: {err.strerror}; choose another --out") from None
    written = [out / "torchrun.sh"]
    write_atomic(written[0], "#!/usr/bin/env bash\n" + node_commands(spec), permissions=0o755)
    if args.slurm:
        written.append(out / "job.sbatch")
        venv = args.venv or (sys.prefix if sys.prefix != sys.base_prefix else None)
        options = SlurmOptions(run_dir=os.path.abspath(run_dir),
                               workdir=os.getcwd(), venv=venv and os.path.abspath(venv), partition=args.partition,
                               time_limit=args.time, cpus_per_task=args.cpus_per_task)
        write_atomic(written[1], sbatch_script(spec, options))
    print(node_commands(spec), end="")
    print("\nwrote " + ", ".join(map(str, written)))
    return 0


# What the files launch writes begin with (launch/scripts.py): a file at their path without it is someone else's.
OWN_MARKERS = {"torchrun.sh": "#!/usr/bin/env bash\n# hybridpar: ", "job.sbatch": "#!/bin/bash\n#SBATCH --job-name=hybridpar-"}


def _refuse_foreign_files(out: Path, names: list[str]) -> None:
    for name in names:
        path, marker = out / name, OWN_MARKERS[name].encode()
        if path.exists() and head_of(path, len(marker)) != marker:
            raise UsageError(f"{path} exists and was not written by hybridpar launch; choose another --out")


def _check_slurm_options(args) -> None:
    from hybridpar.launch.scripts import SLURM_TIME, SlurmOptions, slurm_seconds

    if not SLURM_TIME.fullmatch(args.time):
        raise UsageError(f"--time {args.time!r} is not a SLURM time limit; give e.g. 48:00:00, 2-00:00:00 or 90 (minutes)")
    seconds, lead = slurm_seconds(args.time), SlurmOptions.signal_lead_s
    if seconds is not None and seconds <= lead:
        raise UsageError(f"--time {args.time} leaves no time to train: the job is told to save and stop {lead} s before "
                         "its limit; give a longer --time")
    if args.venv and not os.path.isfile(os.path.join(args.venv, "bin", "activate")):
        # the script changes to this directory and activates this path: the nodes share this filesystem
        raise UsageError(f"--venv {args.venv} has no bin/activate; give the virtualenv the job should activate")
    if args.partition is not None and not re.fullmatch(r"[^\s#'\"]+", args.partition):
        raise UsageError(f"--partition {args.partition!r} is not a SLURM partition name (a comma-separated list "
                         "without spaces or quotes)")


class _TrainFlagParser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"the train flags after --: {message}")


def _train_flags(args) -> argparse.Namespace:
    """The `hybridpar train` flags after --, parsed by train's own parser: a flag train would refuse
    on every node is refused here, before any job is queued."""
    from hybridpar.cli.commands import train
    from hybridpar.cli.main import unknown_message

    parser = _TrainFlagParser(prog="hybridpar train", add_help=False)
    train.add_arguments(parser)
    flags, unknown = parser.parse_known_args(args.train_args)
    if unknown:
        raise UsageError(f"the train flags after --: {unknown_message(parser, unknown)}")
    owned = {**OWNED_TRAIN_FLAGS, **(SLURM_TRAIN_FLAGS if args.slurm else {})}
    for key, fix in owned.items():
        if getattr(flags, key, None):
            raise UsageError(f"train flag --{key.replace('_', '-')} cannot go through launch: {fix}")
    flags.recipe = args.recipe
    if args.slurm:
        flags.resume = "auto"  # as the sbatch script runs it
    return flags
