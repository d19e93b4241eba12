"""`hybridpar train` in-process: recipe loading, the LR schedule, and bad input (one line, exit 2,
before any process group). The command as a process and 8 ranks == 1 rank:
tests/integration/test_train_command.py."""
from __future__ import annotations

import math
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
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
    false`` the weight gather inside its step (tests/integration/test_runtime.py trains both ways); a
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


@pytest.mark.parametrize("decay, wsd, want", [
    # 12 steps, 2 of warm-up to lr 1.0; the decays end at min_lr 0.1 on the last step
    ("linear", {}, [0.5, 1.0, 0.91, 0.82, 0.73, 0.64, 0.55, 0.46, 0.37, 0.28, 0.19, 0.1]),
    ("constant", {}, [0.5] + [1.0] * 11),
    # warmup-stable-decay: lr until the last 4 steps, then each shape from 1.0 to 0.1
    ("wsd", {"wsd_decay": "linear"}, [0.5] + [1.0] * 7 + [0.775, 0.55, 0.325, 0.1]),
    ("wsd", {"wsd_decay": "cosine"}, [0.5] + [1.0] * 7 + [0.1 + 0.9 * (1 + math.cos(math.pi * k / 4)) / 2 for k in (1, 2, 3, 4)]),
    ("wsd", {"wsd_decay": "minus_sqrt"}, [0.5] + [1.0] * 7 + [0.1 + 0.9 * (1 - math.sqrt(k / 4)) for k in (1, 2, 3, 4)]),
    ("wsd", {"wsd_decay": "exponential"}, [0.5] + [1.0] * 7 + [0.1 + 0.9 * (2 * 0.5 ** (k / 4) - 1) for k in (1, 2, 3, 4)]),
])
def test_lr_decay_schedules(decay, wsd, want):
    from hybridpar.config.optim import OptimConfig, lr_at

    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=2, total_steps=12, lr_decay=decay,
                      wsd_decay_steps=4 if decay == "wsd" else 0, **wsd)
    assert [lr_at(s, cfg, 16) for s in range(1, 13)] == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("train, message", [
    ({"lr_decay": "step"}, "train.lr_decay must be one of cosine, linear, constant, wsd, got 'step'"),
    ({"lr_decay": "wsd"}, "train.lr_decay wsd needs train.wsd_decay_steps, the last steps that decay to min_lr, from 1 to "
                          "steps - warmup_steps = 10, got 0 (e.g. 2, a fifth of the run)"),
    ({"lr_decay": "wsd", "wsd_decay_steps": 9, "warmup_steps": 2}, "from 1 to steps - warmup_steps = 8, got 9"),
    ({"lr_decay": "wsd", "wsd_decay_steps": 2, "wsd_decay": "step"}, "train.wsd_decay must be one of linear"),
    ({"wsd_decay_steps": 2}, "applies to train.lr_decay wsd, this recipe decays cosine"),
    ({"lr_decay": "linear", "lr": 1e-3, "min_lr": 1e-2}, "the linear decay would rise instead"),
])
def test_lr_decay_settings_are_checked(train, message):
    from hybridpar.config.recipe import recipe_from_dict

    recipe = recipe_from_dict({"model": "tiny", "train": {"global_batch": 16, "seq_len": 32, "steps": 10, **train}})
    assert message in recipe.problems()[0], recipe.problems()
    constant = recipe_from_dict({"model": "tiny", "train": {"global_batch": 16, "seq_len": 32, "lr": 1e-3, "min_lr": 1e-2,
                                                             "lr_decay": "constant"}})
    assert constant.problems() == []  # min_lr is not used by a constant LR


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
        "wrong type": (["--recipe", _write(tmp_path, "t.yaml", "model: tiny\ntrain: {global_batch: 8, seq_len: 8, lr: fast}\n")], "'train.lr' must be a finite number"),
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


@pytest.mark.parametrize("launcher_env, nproc, message", [
    ({}, 16, "--nproc 16 starts one rank per GPU, and this machine has 8"),
    ({"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "9"}, None, "local rank 9 has no GPU: this machine has 8"),
])
def test_more_local_ranks_than_gpus_is_refused_before_any_starts(monkeypatch, launcher_env, nproc, message):
    """On a GPU machine each local rank drives the GPU of its local rank: a world that needs more GPUs
    than the machine has is a one-line error, not 8 ranks failing on devices that do not exist. (This
    machine has no GPU: CUDA's device count is what a machine with 8 would report.)"""
    import torch

    from hybridpar.cli.commands.train import _refuse_more_ranks_than_gpus
    from hybridpar.errors import UsageError

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in launcher_env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UsageError, match=message):
        _refuse_more_ranks_than_gpus(nproc)
    # one rank per GPU passes
    if launcher_env:
        monkeypatch.setenv("LOCAL_RANK", "7")
        _refuse_more_ranks_than_gpus(None)
    else:
        _refuse_more_ranks_than_gpus(8)


@pytest.mark.parametrize("launcher_env, message", [
    ({"RANK": "0", "WORLD_SIZE": "8"}, "but MASTER_ADDR and MASTER_PORT not set"),
    ({"RANK": "0", "WORLD_SIZE": "eight", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}, "WORLD_SIZE='eight' is not an integer"),
    ({"RANK": "8", "WORLD_SIZE": "8", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}, "RANK=8 is not a rank of WORLD_SIZE=8"),
    ({"RANK": "0", "WORLD_SIZE": "8", "MASTER_ADDR": "h", "MASTER_PORT": "0"}, "MASTER_PORT=0 is not a port"),
])
def test_a_partial_launcher_environment_is_one_line(tmp_path, capsys, monkeypatch, no_ranks_may_start, launcher_env, message):
    """RANK and WORLD_SIZE make train one rank of a launcher's job; without the rest of env://'s
    variables torch would fail in a traceback, after the imports."""
    from hybridpar.cli.main import main

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in launcher_env.items():
        monkeypatch.setenv(key, value)
    code = main(["train", "--recipe", str(TINY), "--out", str(tmp_path / "run")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0] and "torchrun" in lines[0], lines
    assert not (tmp_path / "run").exists()
