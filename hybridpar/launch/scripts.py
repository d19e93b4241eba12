"""Multi-node launch files: one agent command per node (c10d rendezvous) and a SLURM sbatch script.

The agent is torchrun run through ``python3 -m hybridpar.launch.node_agent`` (node_agent.py): the same
arguments and behaviour, plus one line instead of a traceback when the head node, which hosts
the rendezvous store, is lost. ``$PYTHON`` overrides the interpreter.

torchrun gives node k the global ranks [k * gpus_per_node, (k + 1) * gpus_per_node). With DP
outermost each replica is a contiguous block of tp*cp*pp ranks, so when that block is a
multiple of a node every node holds whole replicas' slices and no node is shared by two
replicas; when a replica is smaller than a node, each node holds whole replicas.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from hybridpar.topology.layout import NodeMap, RankLayout

from hybridpar.launch.local import FORWARDED_SIGNALS


# torchrun with a one-line report of a lost head node; the interpreter that has hybridpar.
AGENT = "${PYTHON:-python3} -m hybridpar.launch.node_agent"


@dataclass(frozen=True)
class LaunchSpec:
    recipe: str
    nodes: int
    gpus_per_node: int
    layout: RankLayout
    rdzv_host: str = "$HEAD_NODE"
    rdzv_port: int = 29500
    job_id: str = "hybridpar"
    extra_args: tuple[str, ...] = ()
    stop_grace_s: int = 600  # how long an agent lets its ranks finish a step and save after a signal

    def train_command(self) -> list[str]:
        return ["-m", "hybridpar", "train", "--recipe", self.recipe, *self.extra_args]

    def torchrun_command(self, rdzv_id: str | None = None, host: str | None = None) -> str:
        words = [
            AGENT,
            f"--nnodes={self.nodes}",
            f"--nproc-per-node={self.gpus_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={host or self.rdzv_host}:{self.rdzv_port}",
            f"--rdzv-id={rdzv_id or self.job_id}",
            # A signal (SLURM's at a time limit, preemption) goes on to the ranks, which finish
            # their step and save (hybridpar/stopping.py) within the grace, instead of killing them.
            f"--signals-to-handle={FORWARDED_SIGNALS}",
            f"--shutdown-timeout={self.stop_grace_s}",
            *self.train_command(),
        ]
        # Keep shell variables ($HEAD_NODE, $SLURM_JOB_ID) expandable; quote everything else.
        return " ".join(w if w.startswith("--rdzv") or "$" in w else shlex.quote(w) for w in words)

    def replicas_on_node(self, node: int) -> list[int]:
        per = self.gpus_per_node
        ranks = range(node * per, (node + 1) * per)
        return sorted({self.layout.coord(r).dp for r in ranks})


def gpu_env_exports() -> list[str]:
    """The ranks' GPU environment (launch.GPU_ENV), kept if the user already set it."""
    from hybridpar.launch.local import GPU_ENV

    return [f"export {key}=${{{key}:-{value}}}" for key, value in GPU_ENV.items()]


def node_commands(spec: LaunchSpec) -> str:
    nodes = NodeMap(spec.layout, spec.gpus_per_node)
    lines = [
        f"# hybridpar: {spec.layout.world_size} ranks = tp {spec.layout.tp} x cp {spec.layout.cp} x "
        f"pp {spec.layout.pp} x dp {spec.layout.dp} on {spec.nodes} nodes of {spec.gpus_per_node} GPUs",
        "# Run the same command on every node (any order); set HEAD_NODE to one node's address.",
        "# The agent is torchrun run by hybridpar.launch.node_agent (set PYTHON for another interpreter): it",
        "# stops this node's ranks with one line if the head node, which hosts the store, is lost.",
        "# c10d rendezvous numbers the nodes as they join: node k gets ranks "
        f"k*{spec.gpus_per_node} .. k*{spec.gpus_per_node}+{spec.gpus_per_node - 1}.",
        "export HEAD_NODE=${HEAD_NODE:?set HEAD_NODE to the address of the first node}",
        *gpu_env_exports(),
        spec.torchrun_command(),
        "",
        "# What each node holds (DP outermost):",
    ]
    for node in range(nodes.num_nodes):
        replicas = spec.replicas_on_node(node)
        shown = _ranges(replicas)
        lines.append(f"#   node {node}: DP replica(s) {shown}")
    return "\n".join(lines) + "\n"


# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes,
# days-hours:minutes:seconds, or no limit (sbatch(1)).
SLURM_TIME = re.compile(r"(\d+-\d+(:\d+){0,2}|\d+(:\d+){0,2}|unlimited|infinite)", re.IGNORECASE)


def slurm_seconds(limit: str) -> int | None:
    """Seconds in a SLURM time limit (a SLURM_TIME), None for no limit."""
    if limit.lower() in ("unlimited", "infinite"):
        return None
    days, _, clock = limit.rpartition("-")
    parts = [int(x) for x in clock.split(":")]
    if days:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = (parts + [0, 0])[:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(parts) == 3:  # hours:minutes:seconds
        return (parts[0] * 60 + parts[1]) * 60 + parts[2]
    return parts[0] * 60 + (parts[1] if len(parts) == 2 else 0)  # minutes[:seconds]


@dataclass(frozen=True)
class SlurmOptions:
    run_dir: str  # the run's --out: every requeued attempt continues it (--resume auto)
    workdir: str  # where the job changes to: the project, so relative recipe and data paths hold
    venv: str | None = None  # a virtualenv to activate (its bin/activate), or None
    partition: str | None = None
    time_limit: str = "48:00:00"
    cpus_per_task: int = 64  # the node's cores for its one task (the agent and its ranks)
    signal_lead_s: int = 300  # SIGUSR1 this long before the limit: time to finish a step and save


NCCL_SETTINGS = """\
# NCCL and network settings: uncomment what your cluster needs (defaults are usually right).
# export NCCL_DEBUG=WARN                 # INFO names the transport (IB, sockets) each ring uses
# export NCCL_SOCKET_IFNAME=^lo,docker0  # the interface for NCCL's bootstrap and socket transport
# export NCCL_IB_HCA=mlx5               # which InfiniBand adapters to use
# export NCCL_NET_GDR_LEVEL=PHB          # GPUDirect RDMA up to the PCIe host bridge
# export NCCL_IB_TIMEOUT=22              # fewer spurious IB timeouts on large clusters
# export NCCL_ASYNC_ERROR_HANDLING=1     # a failed collective ends the job instead of hanging it"""


def sbatch_script(spec: LaunchSpec, options: SlurmOptions) -> str:
    header = [
        "#!/bin/bash",
        f"#SBATCH --job-name={spec.job_id}",
        f"#SBATCH --nodes={spec.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={spec.gpus_per_node}",
        f"#SBATCH --cpus-per-task={options.cpus_per_task}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={options.time_limit}",
        # SIGUSR1 to every process of the job step ahead of the limit: the ranks save and stop.
        f"#SBATCH --signal=USR1@{options.signal_lead_s}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        "#SBATCH --output=%x-%j.out",
    ]
    if options.partition:
        header.append(f"#SBATCH --partition={options.partition}")
    run_dir = shlex.quote(options.run_dir)
    resumable = LaunchSpec(**{**spec.__dict__, "extra_args": (*spec.extra_args, "--resume", "auto", "--out", options.run_dir)})
    body = [
        "set -euo pipefail",
        f"cd {shlex.quote(options.workdir)}",
        *([f"source {shlex.quote(options.venv)}/bin/activate"] if options.venv else []),
        'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export HEAD_NODE",
        *gpu_env_exports(),
        NCCL_SETTINGS,
        "# One agent (torchrun, via hybridpar.launch.node_agent) per node; each starts gpus-per-node ranks.",
        "# Every attempt continues the run: --resume auto starts fresh only when there is no checkpoint yet.",
        "rc=0",
        f"status={run_dir}/status.json",
        'before=$(stat -c %Y "$status" 2>/dev/null || echo none)',
        "srun --kill-on-bad-exit=1 " + resumable.torchrun_command(rdzv_id="$SLURM_JOB_ID") + " || rc=$?",
        "# Stopped by a signal or a time limit after saving (this attempt's status.json says so): queue the job",
        "# again. An attempt that ended before writing it (bad input) leaves an earlier one: no requeue loop.",
        'after=$(stat -c %Y "$status" 2>/dev/null || echo none)',
        'if [ "$after" != "$before" ] && grep -q \'"status": "stopped"\' "$status"; then',
        '    echo "hybridpar: stopped early; requeueing job $SLURM_JOB_ID to resume"',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "    exit 0",
        "fi",
        "exit $rc",
    ]
    return "\n".join(header + [""] + body) + "\n"


def _ranges(values: list[int]) -> str:
    if not values:
        return "-"
    if values == list(range(values[0], values[-1] + 1)) and len(values) > 1:
        return f"{values[0]}-{values[-1]}"
    return ",".join(map(str, values))
