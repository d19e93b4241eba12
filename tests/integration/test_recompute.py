"""Activation recomputation (Plan.recompute / recipe parallel.recompute / --recompute), for real.

One 4-rank torchrun launch (TP2 x PP2, 1F1B, ZeRO-1, fp32, the tiny preset, 4 micro-batches
per step) trains 3 steps with recompute none, selective and full from the same seed. Checks:
- megatron-core's TransformerConfig on the built model says what the plan asked for
  (selective: granularity selective, recompute_modules ["core_attn"]; full: granularity full,
  method uniform, 1 layer per unit), with hybridpar's SDPA core attention in place;
- recomputation really happens: forward hooks count, per layer per micro-batch, 1 call of each
  transformer layer and 1 of its core attention without recompute; 2 core-attention calls with
  selective; 2 layer calls (and so 2 core-attention calls) with full;
- losses, grad norms and final weights (gathered to full tensors) equal the no-recompute run
  within TOL = 1e-6 (measured: bit-identical on CPU);
- megatron's checkpoint rerun restores the (CPU) generators: dropout drawn in the model-parallel
  tracker gives the same input gradient with and without checkpointing (hybridpar/compat/cpu.py, 4).
Plus CLI checks: a bad recompute value is a one-line exit-2 error before any rank starts (that
`--recompute` / `parallel.recompute` reach the Plan: tests/unit/test_recompute_config.py).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from multirank import run_worker

ROOT = Path(__file__).resolve().parents[2]
MODES = ["none", "selective", "full"]
STEPS = 3
TOL = 1e-6
CFG = {"steps": STEPS, "tp": 2, "pp": 2, "micro_batch": 2, "global_batch": 8, "modes": MODES}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("recompute")
    return out, run_worker("recompute_worker.py", 4, CFG, out, timeout=600)


def test_megatron_config_follows_plan(runs):
    _, res = runs
    for mode in MODES:
        assert "error" not in res[mode], res[mode].get("error")
        assert res[mode]["core_attention_class"] == "SDPACoreAttention"
        assert res[mode]["grad_accum"] == 4
    assert res["none"]["recompute_granularity"] is None
    assert res["selective"]["recompute_granularity"] == "selective"
    assert res["selective"]["recompute_modules"] == ["core_attn"]
    assert res["selective"]["recompute_method"] is None
    assert (res["full"]["recompute_granularity"], res["full"]["recompute_method"],
            res["full"]["recompute_num_layers"]) == ("full", "uniform", 1)


@pytest.mark.parametrize("mode, layer_calls, attention_calls",
                         [("none", 1.0, 1.0), ("selective", 1.0, 2.0), ("full", 2.0, 2.0)])
def test_recompute_reruns_forward_in_backward(runs, mode, layer_calls, attention_calls):
    _, res = runs
    assert res[mode]["layer_calls_per_microbatch"] == layer_calls, res[mode]
    assert res[mode]["attention_calls_per_microbatch"] == attention_calls, res[mode]


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recompute_trains_like_no_recompute(runs, mode):
    import torch

    out, res = runs
    got, want = res[mode], res["none"]
    assert len(got["losses"]) == STEPS
    assert max(abs(a - b) for a, b in zip(got["losses"], want["losses"])) <= TOL, (got["losses"], want["losses"])
    assert max(abs(a - b) / b for a, b in zip(got["grad_norms"], want["grad_norms"])) <= TOL
    assert abs(got["eval_loss"] - want["eval_loss"]) <= TOL  # the held-out loss through the forward-only schedule
    a, b = torch.load(out / "none.pt"), torch.load(out / f"{mode}.pt")
    assert set(a) == set(b) and len(a) > 0
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= TOL, worst


def test_checkpoint_rerun_restores_rng(runs):
    _, res = runs
    assert res["rng_rerun_max_diff"] == 0.0


# --- fast checks: recipe, flag, planner pins (no process group) --------------------------------
def _hybridpar(tmp_path, *argv):
    return subprocess.run([sys.executable, "-m", "hybridpar", *argv], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)


def test_bad_recompute_in_recipe_is_one_line_exit_2(tmp_path):
    (tmp_path / "r.yaml").write_text("model: tiny\nparallel: {recompute: sometimes}\n"
                                     "train: {global_batch: 16, seq_len: 32}\n")
    res = _hybridpar(tmp_path, "train", "--recipe", "r.yaml")
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "parallel.recompute" in lines[0] and "none, selective, full" in lines[0] and "sometimes" in lines[0]
    assert res.stdout == ""


def test_bad_recompute_flag_is_one_line_exit_2(tmp_path):
    res = _hybridpar(tmp_path, "train", "--recipe", str(ROOT / "recipes" / "tiny.yaml"), "--recompute", "half")
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--recompute" in lines[0] and "Traceback" not in res.stderr, res.stderr
