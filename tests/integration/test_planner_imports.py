"""The planner and `hybridpar plan` never import torch, deepspeed or megatron."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODULES = ["hybridpar.topology", "hybridpar.topology.hardware", "hybridpar.topology.models", "hybridpar.topology.layout", "hybridpar.topology.plan",
           "hybridpar.topology.stages", "hybridpar.topology.software", "hybridpar.topology.memory", "hybridpar.topology.flops", "hybridpar.topology.kernels",
           "hybridpar.topology.cost", "hybridpar.topology.search",
           "hybridpar.topology.cases", "hybridpar.topology.redundancy", "hybridpar.cli.commands.plan",
           "hybridpar.config.recipe"]


def test_no_heavy_imports():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in MODULES)
            + "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed', 'megatron'))\n"
            + "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
