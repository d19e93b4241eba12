"""The `hybridpar` command line in one form, run as a process: every error one line that starts with
``hybridpar <command>: error:``, an unknown option answered with the closest real one (every option
explained: tests/unit/test_cli_help.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv, line", [
    (["train", "--recipe", "recipes/tiny.yaml", "--stepz", "3"],
     "hybridpar train: error: unrecognized arguments --stepz 3; did you mean --steps?"),
    (["plan", "--model", "llama3-8b", "--gpus", "8", "--hedroom", "10"],
     "hybridpar plan: error: unrecognized arguments --hedroom 10; did you mean --headroom?"),
    (["mesh", "--zzz"], "hybridpar mesh: error: unrecognized argument --zzz (see `hybridpar mesh --help`)"),
])
def test_an_unknown_option_names_the_closest_one(argv, line):
    proc = subprocess.run([sys.executable, "-m", "hybridpar", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [line], proc.stderr


def test_a_malformed_recipe_names_its_line_and_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: tiny\ntrain: {global_batch: 16, seq_len: 3\n")
    proc = subprocess.run([sys.executable, "-m", "hybridpar", "train", "--recipe", str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"hybridpar train: error: recipe file {bad}:3:1 is malformed: expected ',' or '}}', but got '<stream end>' "
        "(while parsing a flow mapping)"], proc.stderr
