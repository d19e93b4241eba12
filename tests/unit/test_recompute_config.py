"""`parallel.recompute` / `--recompute` reach the Plan, the RunPlan the ranks read, and the planner's
pins (recomputation on ranks: tests/integration/test_recompute.py)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_recipe_and_flag_reach_the_plan(tmp_path):
    from hybridpar.config.recipe import recipe_from_dict, with_overrides

    base = {"model": "tiny", "train": {"global_batch": 16, "seq_len": 32}}
    assert recipe_from_dict(base).validate(1).to_plan_unresolved().recompute == "none"
    r = recipe_from_dict({**base, "parallel": {"recompute": "selective"}}).validate(1)
    assert r.to_plan_unresolved().recompute == "selective"
    assert with_overrides(r, recompute="full").validate(1).to_plan_unresolved().recompute == "full"
    assert with_overrides(r, recompute=None).parallel.recompute == "selective"


def test_train_flag_reaches_the_ranks_in_the_run_plan(tmp_path):
    """The launcher resolves --recompute into the RunPlan, which the ranks read from plan.json."""
    from hybridpar.cli.commands.train import prepare
    from hybridpar.cli.main import build_parser
    from hybridpar.config.run import RunPlan

    args = build_parser().parse_args(["train", "--recipe", str(ROOT / "recipes" / "tiny.yaml"), "--nproc", "8",
                                      "--recompute", "full", "--out", str(tmp_path / "run")])
    run = prepare(args)
    run.save(str(tmp_path / "plan.json"))
    assert RunPlan.load(str(tmp_path / "plan.json")) == run and run.plan.recompute == "full"


def test_planner_pins_recipe_recompute(tmp_path):
    from hybridpar.cli.commands.plan import recipe_defaults

    text = "model: tiny\ncluster: {gpu: h100-80gb}\ntrain: {global_batch: 16, seq_len: 32}\n"
    (tmp_path / "unset.yaml").write_text(text)
    (tmp_path / "set.yaml").write_text(text + "parallel: {tp: 2, recompute: full}\n")
    assert "recompute" not in recipe_defaults(str(tmp_path / "unset.yaml"))["pins"]
    pins = recipe_defaults(str(tmp_path / "set.yaml"))["pins"]
    assert pins["recompute"] == "full" and pins["tp"] == 2
