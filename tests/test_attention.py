"""hybridpar's core attention (torch SDPA, hybridpar/attention.py) computes megatron's attention.

Same canonical weights, megatron's DotProductAttention (materialised scores) vs SDPA on the tiny
GQA model: fp32 logits within 1e-5 of the largest logit and every gradient within 1e-5 of its
largest element (the two sum in different orders); in bf16 SDPA is no further from the fp32
result than megatron's own bf16 path (+5%). Layout equivalence with SDPA is tests/test_runtime.py's.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def test_sdpa_attention_equals_megatron_attention(tmp_path):
    out = tmp_path / "attention.json"
    run = subprocess.run([sys.executable, str(REPO / "tests/workers/attention_worker.py"), str(out)], cwd=REPO,
                         env=ENV, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    r = json.loads(out.read_text())
    for dtype in ("fp32", "bf16"):
        assert r[dtype]["cores"] == ["DotProductAttention", "SDPACoreAttention"], r[dtype]
        assert r[dtype]["grads_nonzero"], dtype
        assert r[dtype]["max_logit"] > 3.0, dtype  # sharp attention, not a near-uniform average
    assert r["fp32"]["max_logit_diff"] <= 1e-5 * r["fp32"]["max_logit"], r["fp32"]
    assert r["fp32"]["max_grad_rel_diff"] <= 1e-5, r["fp32"]
    assert r["bf16"]["sdpa_err_vs_fp32"] <= 1.05 * r["bf16"]["megatron_err_vs_fp32"], r["bf16"]
    assert r["bf16"]["max_logit_diff"] > 0  # bf16 really ran (rounding differs between the kernels)
