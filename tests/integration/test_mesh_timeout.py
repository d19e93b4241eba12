"""The world's --timeout-s reaches every group the Mesh builds, megatron's included (one process,
a world of one)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_mesh_group_gets_the_world_timeout():
    """--timeout-s must reach megatron's groups too (they default to 30 minutes): a rank stuck
    in a TP or PP exchange then fails after the timeout (measured: README "Reliability")."""
    code = (
        "import os, torch, torch.distributed as dist\n"
        "from hybridpar.launch.local import init_distributed\n"
        "from hybridpar.runtime.mesh import Mesh\n"
        "from hybridpar.topology.layout import RankLayout\n"
        "init_distributed(timeout_s=7)\n"
        "from megatron.core import parallel_state as ps\n"
        "Mesh.build(RankLayout(tp=1, pp=1, dp=1))\n"
        "for g in (ps.get_tensor_model_parallel_group(), ps.get_pipeline_model_parallel_group(), ps.get_data_parallel_group()):\n"
        "    print(g._get_backend(torch.device('cpu')).options._timeout.total_seconds())\n"
    )
    root = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["7.0", "7.0", "7.0"], proc.stdout
