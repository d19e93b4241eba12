"""The planner and `hybridpar plan` never import torch, deepspeed or megatron."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODULES = ["topology", "topology.hardware", "topology.models", "topology.layout", "topology.plan",
           "topology.stages", "topology.software", "topology.memory", "topology.cost", "topology.search",
           "topology.cases", "hybridpar.commands.plan", "hybridpar.recipe"]


def test_no_heavy_imports():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in MODULES)
            + "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed', 'megatron'))\n"
            + "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
