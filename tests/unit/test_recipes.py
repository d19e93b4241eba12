"""Every recipe in recipes/ loads and validates, and `hybridpar plan --recipe` accepts it (issue 4 §3).

The Llama 3 recipes state the cluster they were planned for and the command that chose their
layout (`hybridpar plan --recipe recipes/X.yaml --gpus N [pins]`, in a comment). Each must validate
at world size N, and re-running that command on the recipe *without* its parallel: section must
rank first exactly the layout the file writes (so a planner change that would pick another
layout, or an edited recipe, fails here).
"""
from pathlib import Path

import pytest
import yaml

from hybridpar.cli.main import main
from hybridpar.config.recipe import load_recipe
from recipe_commands import stated_command

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
LLAMA = [p for p in RECIPES if p.stem.startswith("llama3-")]
CPU = [p for p in RECIPES if p not in LLAMA]
HEADROOM = 0.10  # every GPU recipe leaves at least this share of each GPU's memory free


def plan_json(capsys, argv) -> dict:
    import json

    code = main(["plan", *argv, "--json", "--top", "1"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)["plans"][0]


def test_recipes_exist():
    names = {p.stem for p in RECIPES}
    assert {"tiny", "small-cpu", "default", "llama3-8b", "llama3-8b-1node", "llama3-70b", "llama3-405b"} <= names


@pytest.mark.parametrize("path", LLAMA, ids=lambda p: p.stem)
def test_gpu_recipe_fits_its_gpus_with_headroom(path, capsys):
    """The recipe's pinned layout, on the GPU count it states, needs at most 90% of each GPU's memory
    (every memory term of topology/memory.py, the largest pipeline stage)."""
    from hybridpar.topology.hardware import get_gpu

    gpus, pins = stated_command(path)
    assert pins[pins.index("--headroom") + 1] == "10", pins  # the plan that chose it kept the headroom
    plan = plan_json(capsys, ["--recipe", str(path), "--gpus", str(gpus)])
    capacity = get_gpu(load_recipe(str(path)).cluster.gpu).memory_gib
    assert plan["fits"] and plan["memory_gib"]["total"] <= (1 - HEADROOM) * capacity, (plan["memory_gib"], capacity)


def without_layout(path: Path, tmp_path: Path) -> Path:
    """The recipe as given to the planner: the same file without its parallel: section."""
    data = yaml.safe_load(path.read_text())
    data.pop("parallel")
    bare = tmp_path / path.name
    bare.write_text(yaml.safe_dump(data))
    return bare


LAYOUT_KEYS = ("tp", "cp", "pp", "dp", "vpp", "micro_batch", "zero_stage")


@pytest.mark.parametrize("path", CPU, ids=lambda p: p.stem)
def test_cpu_recipe_validates_on_8_ranks_and_plans_its_own_layout(path, tmp_path, capsys):
    """A CPU recipe's layout is chosen to exercise TP x PP x DP on 8 CPU ranks, not by the planner:
    `plan --recipe` takes every size it writes as a pin. Without them the planner chooses another
    layout (TP1 x PP2 x DP4 for tiny, DP8 for the others), so it is the pins that decide here."""
    recipe = load_recipe(str(path)).validate(8)
    assert recipe.parallel.dp * recipe.model_parallel_size() == 8
    p = recipe.parallel
    written = (p.tp, p.cp, p.pp, p.dp, p.vpp, p.micro_batch, p.zero)
    pinned = plan_json(capsys, ["--recipe", str(path)])  # the world its pinned dp states: 8
    assert tuple(pinned[k] for k in LAYOUT_KEYS) == written
    free = plan_json(capsys, ["--recipe", str(without_layout(path, tmp_path)), "--gpus", "8"])
    assert tuple(free[k] for k in LAYOUT_KEYS[:4]) != written[:4]


@pytest.mark.parametrize("path", LLAMA, ids=lambda p: p.stem)
def test_llama_recipe_is_the_planners_choice(path, tmp_path, capsys):
    gpus, pins = stated_command(path)
    recipe = load_recipe(str(path)).validate(gpus)  # world size, divisibility, ZeRO <= 2
    t, p = recipe.train, recipe.parallel
    assert (t.seq_len, t.precision, recipe.cluster.gpu) == (8192, "bf16", "h100-80gb")
    assert t.global_batch * t.seq_len in (4 * 2**20, 8 * 2**20, 16 * 2**20)  # Llama 3's batches in tokens
    assert t.warmup_steps == 8000 and t.steps == 1_200_000 and t.min_lr == pytest.approx(t.lr / 100)
    assert path.stem.startswith(recipe.model.name) and recipe.data.source == "indexed"
    assert recipe.data.tokenizer.endswith("tokenizer.json") and recipe.data.path

    best = plan_json(capsys, ["--recipe", str(without_layout(path, tmp_path)), "--gpus", str(gpus), *pins])
    chosen = {k: best[k] for k in ("tp", "cp", "pp", "dp", "vpp", "micro_batch", "zero_stage", "recompute")}
    written = {"tp": p.tp, "cp": p.cp, "pp": p.pp, "dp": p.dp, "vpp": p.vpp, "micro_batch": p.micro_batch,
               "zero_stage": p.zero, "recompute": p.recompute}
    assert chosen == written and best["fits"]
    # and `plan --recipe` accepts the recipe as written (its sizes become pins), at the GPU count it states
    assert recipe.cluster.gpus == gpus
    again = plan_json(capsys, ["--recipe", str(path)])
    layout = again["tp"] * again["cp"] * again["pp"] * again["dp"]
    assert layout == gpus and again["step_time_s"] == pytest.approx(best["step_time_s"])


@pytest.mark.parametrize("path", LLAMA, ids=[p.stem for p in LLAMA])
def test_readme_quotes_each_gpu_recipes_prediction(path, capsys):
    """README's recipe table quotes each Llama recipe's predicted step time and MFU with their ranges
    and its memory, as `hybridpar plan --recipe recipes/X.yaml --gpus N` prints them today."""
    import re

    gpus, _ = stated_command(path)
    p = plan_json(capsys, ["--recipe", str(path), "--gpus", str(gpus)])
    fig = lambda x: f"{x:.1f}" if x >= 10 else f"{x:.2f}"  # the README's digits: 54.7, 6.68
    (lo, hi), (mlo, mhi) = p["step_time_s_range"], p["mfu_range"]
    quoted = (f"predicted {fig(p['step_time_s'])} s/step ({fig(lo)}-{fig(hi)} s), "
              f"{p['mfu']:.0%} MFU ({mlo * 100:.0f}-{mhi:.0%}), {p['memory_gib']['total']:.1f}")
    row = next(line for line in (REPO / "README.md").read_text().splitlines()
               if line.startswith(f"| `recipes/{path.name}` |"))
    assert quoted in row, (quoted, row)
    assert re.search(rf"\| {gpus:,} H100", row)


def test_a_number_written_with_an_exponent_is_the_number(tmp_path):
    """PyYAML (YAML 1.1) reads `3e-4` without a dot as text; a recipe means the number. An integer key
    still refuses it, and infinity stays refused."""
    from hybridpar.errors import UsageError

    path = tmp_path / "r.yaml"
    path.write_text("model: tiny\ntrain: {global_batch: 16, seq_len: 32, lr: 3e-3, min_lr: 3E-4, eps: 1.0e-8}\n")
    t = load_recipe(str(path)).train
    assert (t.lr, t.min_lr, t.eps) == (3e-3, 3e-4, 1e-8) and isinstance(t.lr, float)
    for text, words in (("steps: 1e3", "'train.steps' must be an integer, got '1e3'"),
                        ("lr: 1e999", "'train.lr' must be a finite number, got inf")):
        path.write_text(f"model: tiny\ntrain: {{global_batch: 16, seq_len: 32, {text}}}\n")
        with pytest.raises(UsageError, match=words):
            load_recipe(str(path))
