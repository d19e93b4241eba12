"""`hybridpar launch`: write the torchrun command for every node and, with --slurm, an sbatch script."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from hybridpar.topology.layout import NodeMap

from hybridpar.errors import UsageError
from hybridpar.files import write_atomic

HELP = "write multi-node torchrun commands (c10d rendezvous) and, with --slurm, an sbatch script"


def add_arguments(p):
    p.add_argument("--recipe", required=True, help="recipe YAML (its layout must fill nodes x gpus-per-node)")
    p.add_argument("--nodes", type=int, required=True, help="number of nodes")
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


def run(args) -> int:
    from hybridpar.launch.scripts import LaunchSpec, SlurmOptions, node_commands, sbatch_script
    from hybridpar.config.recipe import load_recipe

    if args.nodes < 1:
        raise UsageError(f"--nodes must be a positive integer, got {args.nodes}")
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise UsageError(f"--gpus-per-node must be a positive integer, got {args.gpus_per_node}")
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    if args.partition and not args.slurm:
        raise UsageError("--partition only applies with --slurm")
    if args.cpus_per_task < 1:
        raise UsageError(f"--cpus-per-task must be a positive integer, got {args.cpus_per_task}")
    recipe = load_recipe(args.recipe)
    gpus_per_node = args.gpus_per_node or recipe.cluster.gpus_per_node
    world = args.nodes * gpus_per_node
    recipe = recipe.validate(world)
    layout = recipe.to_plan_unresolved().layout
    NodeMap(layout, gpus_per_node)  # raises when the world does not fill whole nodes
    spec = LaunchSpec(
        recipe=args.recipe, nodes=args.nodes, gpus_per_node=gpus_per_node, layout=layout,
        rdzv_port=args.port, job_id=f"hybridpar-{recipe.name}", extra_args=tuple(args.train_args),
    )
    out = Path(args.out or Path("launch") / recipe.name)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create output directory {out}: {err.strerror}; choose another --out") from None
    written = [out / "torchrun.sh"]
    write_atomic(written[0], "#!/usr/bin/env bash\n" + node_commands(spec), permissions=0o755)
    if args.slurm:
        written.append(out / "job.sbatch")
        venv = args.venv or (sys.prefix if sys.prefix != sys.base_prefix else None)
        options = SlurmOptions(run_dir=os.path.abspath(args.run_dir or os.path.join("runs", recipe.name)),
                               workdir=os.getcwd(), venv=venv and os.path.abspath(venv), partition=args.partition,
                               time_limit=args.time, cpus_per_task=args.cpus_per_task)
        write_atomic(written[1], sbatch_script(spec, options))
    print(node_commands(spec), end="")
    print("\nwrote " + ", ".join(map(str, written)))
    return 0
