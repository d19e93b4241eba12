"""`hybridpar plan` run as a process: its exit codes and one-line errors, and `--recipe FILE --gpus N`
(the recipe gives the model, sequence, batch, cluster and pinned parallel sizes; --gpus and flags
override). In-process checks of the same command: tests/unit/test_planner_cli.py."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

RECIPE = """
name: plan-test
model: llama3-70b
parallel: {tp: 4, pp: 2, cp: 1}
train: {global_batch: 256, seq_len: 4096}
cluster: {gpu: h100-80gb, gpus_per_node: 8}
"""


def plan(*argv):
    return subprocess.run([sys.executable, "-m", "hybridpar", "plan", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_recipe_supplies_model_batch_and_pins(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE)
    out = plan("--recipe", str(path), "--gpus", "64", "--json", "--top", "3")
    assert out.returncode == 0, out.stderr
    plans = json.loads(out.stdout)["plans"]
    assert plans
    for p in plans:
        assert (p["tp"], p["pp"], p["dp"]) == (4, 2, 8)  # dp follows from --gpus
        assert p["dp"] * p["micro_batch"] * p["grad_accum"] == 256
    human = plan("--recipe", str(path), "--gpus", "64", "--top", "1")
    assert "llama3-70b on 64 x h100-80gb" in human.stdout and "seq 4096" in human.stdout


def test_flags_override_the_recipe(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE)
    out = plan("--recipe", str(path), "--gpus", "128", "--tp", "8", "--global-batch", "128",
               "--seq-len", "2048", "--json", "--top", "2")
    assert out.returncode == 0, out.stderr
    for p in json.loads(out.stdout)["plans"]:
        assert (p["tp"], p["pp"]) == (8, 2) and p["tp"] * p["pp"] * p["cp"] * p["dp"] == 128
        assert p["dp"] * p["micro_batch"] * p["grad_accum"] == 128


def test_bad_recipe_is_one_line_exit_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: llama3-70b\nparallel: {tp: 4, bogus: 1}\ntrain: {global_batch: 8, seq_len: 128}\n")
    for argv in (["--recipe", str(path), "--gpus", "8"], ["--recipe", str(tmp_path / "missing.yaml"), "--gpus", "8"],
                 ["--recipe", str(path), "--model", "tiny", "--gpus", "8"]):
        out = plan(*argv)
        assert out.returncode == 2
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_subprocess_exit_code_and_no_traceback():
    bad = subprocess.run([sys.executable, "-m", "hybridpar", "plan", "--model", "nope.json", "--gpus", "8"],
                         cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    good = subprocess.run([sys.executable, "-m", "hybridpar", "plan", "--model", "llama3-405b", "--gpus", "16384",
                           "--json", "--top", "1"], cwd=REPO, capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["plans"][0]["fits"] is True
