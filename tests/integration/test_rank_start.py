"""A CPU rank's start (hybridpar/compat/cpu.py ``import_libraries_uncompiled``): megatron-core and
DeepSpeed's Muon module are imported with their import-time ``torch.compile`` left out, so no rank loads
torch's compiler stack for functions the runtime never calls, and ``torch.compile`` is torch's own again
afterwards. In a fresh process, as a rank starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_cpu_rank_imports_megatron_and_deepspeed_without_compiling():
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    for key in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "workers" / "uncompiled_probe.py")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r == {"inductor_loaded": False, "torch_compile_restored": True, "jit_fuser_identity": True,
                 "megatron_fusion_compiled": False, "deepspeed_muon_compiled": False}, r
