"""`hybridpar train --save-dir/--save-every/--resume`: two real runs and the bad-input cases.

Run 1 (2 ranks, DP2) trains 6 steps and saves at 4 and 6; run 2 (1 rank: a lost replica)
resumes from step 4 with the same --steps 6, trains steps 5 and 6 only, appends them to
metrics.jsonl under those numbers, and matches run 1's losses (1e-5: only the DP reduction
order differs). Bad input: one line, exit 2, no traceback, before any rank starts.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPE = """name: ckpt-cli
model: tiny
parallel: {tp: 1, pp: 1, zero: 1, micro_batch: 2}
train: {global_batch: 8, seq_len: 16, steps: 6, lr: 1.0e-2, min_lr: 1.0e-3, warmup_steps: 1, seed: 0, precision: fp32,
        lr_decay: wsd, wsd_decay_steps: 2, wsd_decay: minus_sqrt}
data: {source: synthetic}
"""
# warmup-stable-decay: 1 step of warm-up, lr until step 4, then 1 - sqrt(progress) down to min_lr at step 6
WSD_LRS = [1e-2, 1e-2, 1e-2, 1e-2, 1e-3 + 9e-3 * (1 - 0.5 ** 0.5), 1e-3]


def hybridpar(*args, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "hybridpar", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("ckpt_cli")
    recipe = base / "recipe.yaml"
    recipe.write_text(RECIPE)
    first = hybridpar("train", "--recipe", str(recipe), "--nproc", "2", "--save-every", "4",
                      "--save-dir", str(base / "ckpt"), "--out", str(base / "run1"))
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-4000:]
    (base / "run2").mkdir()
    straight = metrics(base / "run1" / "metrics.jsonl")
    (base / "run2" / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in straight[:4]))
    second = hybridpar("train", "--recipe", str(recipe), "--resume", str(base / "ckpt" / "step-000004"),
                       "--save-dir", str(base / "ckpt2"), "--out", str(base / "run2"))
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-4000:]
    return base, recipe, straight, second.stdout


def test_first_run_saves_every_n_and_at_the_end(runs):
    base, _, straight, _ = runs
    assert [m["step"] for m in straight] == [1, 2, 3, 4, 5, 6]
    assert [m["lr"] for m in straight] == pytest.approx(WSD_LRS, rel=1e-12)  # the recipe's schedule reached the ranks
    assert sorted(n for n in os.listdir(base / "ckpt") if not n.startswith('.')) == ["latest", "step-000004", "step-000006"]
    assert (base / "ckpt" / "latest").read_text().strip() == "step-000006"
    assert json.loads((base / "ckpt" / "step-000004" / "run.json").read_text())["name"] == "ckpt-cli"


def test_resume_trains_the_remaining_steps_and_appends_them(runs):
    base, _, straight, out = runs
    resumed = metrics(base / "run2" / "metrics.jsonl")
    assert [m["step"] for m in resumed] == [1, 2, 3, 4, 5, 6]
    assert "resuming from" in out and "step 4" in out and "step 1/6" not in out
    for got, want in zip(resumed[4:], straight[4:]):
        assert abs(got["loss"] - want["loss"]) <= 1e-5, (got, want)
        assert got["lr"] == want["lr"]
    assert sorted(n for n in os.listdir(base / "ckpt2") if not n.startswith('.')) == ["latest", "step-000006"]


def test_bad_resume_input_is_one_line_exit_2_before_any_process_group(runs, tmp_path, capsys, no_ranks_may_start):
    from hybridpar.cli.main import main

    base, recipe, _, _ = runs
    other = tmp_path / "other.yaml"
    other.write_text(RECIPE.replace("model: tiny", "model: tiny-deep"))
    cosine = tmp_path / "cosine.yaml"  # the same run with the default schedule
    cosine.write_text(RECIPE.replace("lr_decay: wsd, wsd_decay_steps: 2, wsd_decay: minus_sqrt", "lr_decay: cosine"))
    held_out = tmp_path / "held_out.yaml"  # the same run, but a share of its data kept out of training
    held_out.write_text(RECIPE.replace("data: {source: synthetic}", "data: {source: embedded, held_out: 0.34}"))
    (tmp_path / "empty").mkdir()
    damaged = tmp_path / "damaged"
    shutil.copytree(base / "ckpt" / "step-000004", damaged)
    data = bytearray((damaged / "rank-00001.pt").read_bytes())
    data[len(data) // 3] ^= 0xFF
    (damaged / "rank-00001.pt").write_bytes(bytes(data))
    truncated = tmp_path / "truncated"
    shutil.copytree(base / "ckpt" / "step-000004", truncated)
    with open(truncated / "rank-00000.pt", "r+b") as f:
        f.truncate(100)
    train = ["train", "--recipe", str(recipe), "--nproc", "2"]
    cases = [
        (train + ["--resume", str(tmp_path / "missing")], ["missing", "does not exist"]),
        (train + ["--resume", str(tmp_path / "empty")], ["no complete checkpoint"]),
        (["train", "--recipe", str(other), "--nproc", "2", "--resume", str(base / "ckpt")],
         ["another model", "layers 4 (checkpoint) vs 8 (this run)"]),
        (train + ["--resume", str(base / "ckpt")], ["at step 6", "nothing left"]),
        (train + ["--save-every", "-1"], ["--save-every must be >= 0"]),
        (train + ["--resume", str(damaged)], ["rank-00001.pt", "sha256"]),
        (train + ["--resume", str(truncated)], ["rank-00000.pt has 100 bytes", "truncated"]),
        # resuming with settings that would silently change the run
        (train + ["--resume", str(base / "ckpt" / "step-000004"), "--steps", "8"],
         ["trained with total steps 6, this run has 8 (--steps)", "--allow-changes"]),
        (train + ["--resume", str(base / "ckpt" / "step-000004"), "--seed", "3"], ["seed 0", "--allow-changes"]),
        (["train", "--recipe", str(cosine), "--nproc", "2", "--resume", str(base / "ckpt" / "step-000004")],
         ["trained with LR decay wsd, this run has cosine (train.lr_decay)", "--allow-changes"]),
        (["train", "--recipe", str(held_out), "--nproc", "2", "--resume", str(base / "ckpt" / "step-000004")],
         ["trained with held-out share of the data 0.0, this run has 0.34 (data.held_out)", "--allow-changes"]),
        (train + ["--resume", str(base / "ckpt" / "step-000004"), "--stop-at-step", "4"], ["not after step 4", "resumes"]),
        (train + ["--resume", str(base)], ["no complete checkpoint", f"e.g. {base / 'ckpt'}"]),
        # a fresh run into the first run's directories
        (train + ["--out", str(base / "run1"), "--save-dir", str(base / "ckpt")],
         ["already hold", "a run", "--resume auto", "--overwrite"]),
        (train + ["--resume", "auto", "--overwrite"], ["give one of them"]),
    ]
    for argv, fragments in cases:
        code = main(argv)
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("hybridpar train: error: "), (argv, err)
        for fragment in fragments:
            assert fragment in lines[0], (fragment, lines[0])


def test_a_failed_background_write_stops_the_run_with_its_cause(tmp_path):
    """Periodic saves are written on a thread (checkpoint/hook.py); when one rank's write fails
    (a full disk, injected), the run stops at the commit with that cause in one line, and no
    checkpoint of that step appears."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HYBRIDPAR_FAULT="fail-in-save:rank=1:step=2")
    proc = subprocess.run([sys.executable, "-m", "hybridpar", "train", "--recipe", str(recipe), "--nproc", "2",
                           "--save-every", "2", "--out", str(tmp_path / "run")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [l for l in proc.stderr.splitlines() if l.startswith("hybridpar train: error:")]
    assert errors == ["hybridpar train: error: rank 1: writing its checkpoint file failed: [Errno 28] injected: "
                      "no space left on device"], proc.stderr[-3000:]
    assert not [n for n in os.listdir(tmp_path / "run" / "ckpt") if n.startswith("step-")]
    steps = metrics(tmp_path / "run" / "metrics.jsonl")
    assert 3 <= steps[-1]["step"] < 6  # training went on while the file was being written, then stopped
