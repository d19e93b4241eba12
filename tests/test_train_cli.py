"""`hybridpar train`: recipe loading, bad input (one line, exit 2, before any process group),
and the command-line acceptance check: 8 ranks TP2 x PP2 x DP2 == 1 rank, losses within 1e-5."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes" / "tiny.yaml"


# --- the recipe loader ----------------------------------------------------------------------
def test_tiny_recipe_loads_and_maps_to_a_plan():
    from hybridpar.config.recipe import load_recipe

    recipe = load_recipe(str(TINY)).validate(8)
    plan = recipe.to_plan_unresolved()
    assert (plan.tp, plan.pp, plan.dp, plan.cp, plan.vpp) == (2, 2, 2, 1, 1)
    assert plan.grad_accum == 4 and plan.model.name == "tiny" and plan.zero_stage == 1
    assert recipe.optim_config().grad_clip == 1.0


def test_flags_override_and_dp_is_derived():
    from hybridpar.config.recipe import load_recipe, with_overrides

    recipe = with_overrides(load_recipe(str(TINY)), tp=1, pp=2, steps=3).validate(8)
    assert (recipe.parallel.tp, recipe.parallel.pp, recipe.parallel.dp, recipe.train.steps) == (1, 2, 4, 3)


def test_overlaps_are_recipe_switches(tmp_path):
    """On by default (hybridpar.grad_sync, hybridpar.param_gather); ``parallel.overlap_grad_reduce:
    false`` leaves the DP reduction to DeepSpeed after the backward and ``overlap_param_gather:
    false`` the weight gather inside its step (tests/test_runtime.py trains both ways); a
    non-boolean is a one-line recipe error."""
    from hybridpar.errors import USER_ERRORS
    from hybridpar.config.recipe import load_recipe

    on = load_recipe(str(TINY)).parallel
    assert on.overlap_grad_reduce is True and on.overlap_param_gather is True
    off = _write(tmp_path, "off.yaml", "model: tiny\nparallel: {overlap_grad_reduce: false, overlap_param_gather: false}\n"
                                       "train: {global_batch: 8, seq_len: 8}\n")
    parallel = load_recipe(off).parallel
    assert parallel.overlap_grad_reduce is False and parallel.overlap_param_gather is False
    bad = _write(tmp_path, "bad.yaml", "model: tiny\nparallel: {overlap_param_gather: 3}\n"
                                       "train: {global_batch: 8, seq_len: 8}\n")
    with pytest.raises(USER_ERRORS, match="overlap_param_gather"):
        load_recipe(bad)


def test_lr_schedule_warmup_cosine_and_linear_scaling():
    from hybridpar.config.optim import OptimConfig, lr_at

    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=2, total_steps=12)
    assert lr_at(1, cfg, 16) == 0.5 and lr_at(2, cfg, 16) == 1.0
    assert abs(lr_at(7, cfg, 16) - 0.55) < 1e-12 and abs(lr_at(12, cfg, 16) - 0.1) < 1e-12
    scaled = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=0, total_steps=10, lr_scale_base_batch=8)
    assert lr_at(1, scaled, 32) > 3.9  # 4x the batch -> 4x the LR


# --- bad input --------------------------------------------------------------------------------
def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _bad_cases(tmp_path):
    tiny = str(TINY)
    return {
        "world != product": (["--recipe", tiny, "--nproc", "8", "--tp", "2", "--pp", "2", "--dp", "4"], "world size 8"),
        "kv_heads % tp": (["--recipe", tiny, "--nproc", "8", "--tp", "4", "--pp", "2", "--dp", "1"], "kv_heads 2 not divisible by tp 4"),
        "heads % tp": (["--recipe", tiny, "--nproc", "3", "--tp", "3", "--pp", "1", "--dp", "1"], "not divisible by tp 3"),
        "layers % pp": (["--recipe", tiny, "--nproc", "5", "--tp", "1", "--pp", "5"], "layers 4 not divisible by pp x vpp"),
        "layers % pp*vpp": (["--recipe", tiny, "--nproc", "8", "--vpp", "4"], "layers 4 not divisible by pp x vpp = 2 x 4"),
        "global batch": (["--recipe", tiny, "--nproc", "8", "--global-batch", "10"], "global batch 10 not divisible"),
        "zero 3": (["--recipe", tiny, "--nproc", "8", "--zero", "3"], "zero 3 not supported"),
        "no world": (["--recipe", tiny], "world size 1 != tp x cp x pp x dp"),
        "unknown key": ([ "--recipe", _write(tmp_path, "k.yaml", "model: tiny\ntrain: {global_batch: 8, seq_len: 8, stepz: 3}\n")], "unknown key 'train.stepz'"),
        "unknown section": (["--recipe", _write(tmp_path, "s.yaml", "model: tiny\noptimizer: {}\n")], "unknown key 'optimizer'"),
        "wrong type": (["--recipe", _write(tmp_path, "t.yaml", "model: tiny\ntrain: {global_batch: 8, seq_len: 8, lr: fast}\n")], "'train.lr' must be a number"),
        "seq % 2cp": (["--recipe", _write(tmp_path, "c.yaml", "model: tiny\nparallel: {cp: 2}\ntrain: {global_batch: 8, seq_len: 6}\n"), "--nproc", "2"], "seq_len 6 not divisible by 2 x cp = 4"),
        "unknown model": (["--recipe", _write(tmp_path, "m.yaml", "model: giant\ntrain: {global_batch: 8, seq_len: 8}\n")], "unknown model 'giant'"),
        "missing recipe": (["--recipe", str(tmp_path / "nope.yaml")], "not found"),
        "malformed recipe": (["--recipe", _write(tmp_path, "bad.yaml", "model: [tiny\n")], "is malformed"),
        "binary recipe": (["--recipe", str(_binary(tmp_path))], "unreadable"),
        "not a mapping": (["--recipe", _write(tmp_path, "l.yaml", "- tiny\n")], "expected a mapping"),
        "negative steps": (["--recipe", tiny, "--nproc", "8", "--steps", "0"], "--steps must be a positive integer"),
    }


def _binary(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00\x81model")
    return path


def test_bad_input_is_one_line_exit_2_before_any_process_group(tmp_path, capsys, no_ranks_may_start):
    from hybridpar.cli.main import main

    for name, (argv, expected) in _bad_cases(tmp_path).items():
        code = main(["train", *argv])
        err = capsys.readouterr().err
        assert code == 2, (name, code, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hybridpar train: error: "), (name, err)
        assert expected in lines[0], (name, lines[0])


def test_bad_input_from_the_real_command_line(tmp_path):
    """The installed entry point: exit code 2, one line on stderr, no traceback, nothing written."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "hybridpar", "train", "--recipe", str(TINY), "--nproc", "8", "--tp", "3", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not out.exists()


# --- 8 ranks == 1 rank, through the command line --------------------------------------------------
def _train(tmp_path, name, *flags, recipe=TINY):
    out = tmp_path / name
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "hybridpar", "train", "--recipe", str(recipe), "--steps", "5", "--seed", "0", "--out", str(out), *flags]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return proc, rows, json.loads((out / "plan.json").read_text())["plan"]  # the RunPlan's layout


def test_eight_ranks_tp2_pp2_dp2_match_one_rank(tmp_path):
    """The one-rank run is of the same recipe written for GPUs (cluster.gpu), which trains on this
    CPU-only machine only with --allow-cpu (without it: tests/test_bad_input.py)."""
    gpu_recipe = tmp_path / "tiny-for-gpus.yaml"
    gpu_recipe.write_text(TINY.read_text() + "cluster: {gpu: h100-80gb, gpus_per_node: 8}\n")
    proc_a, a, plan_a = _train(tmp_path, "A", "--nproc", "8", "--tp", "2", "--pp", "2", "--dp", "2")
    proc_b, b, plan_b = _train(tmp_path, "B", "--nproc", "1", "--tp", "1", "--pp", "1", "--dp", "1", "--allow-cpu",
                               recipe=gpu_recipe)
    assert [r["step"] for r in a] == [1, 2, 3, 4, 5] == [r["step"] for r in b]
    for row in a + b:
        assert {"step", "loss", "grad_norm", "lr", "step_time_s", "tokens_per_s"} <= set(row)
    diffs = [abs(x["loss"] - y["loss"]) for x, y in zip(a, b)]
    assert max(diffs) <= 1e-5, diffs
    assert [r["lr"] for r in a] == [r["lr"] for r in b]
    assert (plan_a["tp"], plan_a["pp"], plan_a["dp"], plan_a["world_size"]) == (2, 2, 2, 8)
    assert (plan_b["tp"], plan_b["pp"], plan_b["dp"], plan_b["world_size"]) == (1, 1, 1, 1)
    step_lines = [l for l in proc_a.stdout.splitlines() if l.startswith("step ")]
    assert len(step_lines) == 5, proc_a.stdout  # rank 0 only, one line per step
    for key in ("loss", "grad norm", "lr", "tokens/s"):
        assert key in step_lines[0]
