"""`hybridpar report` as the installed command: the table and the PNGs, or one line and exit 2."""
import json
import os
import subprocess
import sys

HYBRIDPAR = os.path.join(os.path.dirname(sys.executable), "hybridpar")


def test_cli_prints_the_table_and_writes_pngs_or_exits_2(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(
        {"step": s, "loss": 4.0 - 0.01 * s, "grad_norm": 1.0, "lr": 1e-3, "step_time_s": 0.5, "tokens_per_s": 1000.0})
        + "\n" for s in range(1, 101)))
    result = subprocess.run(
        [HYBRIDPAR, "report", str(tmp_path / "run"), "--out", str(tmp_path / "plots")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "steps        100 (steps 1..100)" in result.stdout
    assert sorted(os.listdir(tmp_path / "plots")) == ["loss.png", "throughput.png"]
    result = subprocess.run(
        [HYBRIDPAR, "report", str(tmp_path / "missing")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"hybridpar report: error: run directory {tmp_path / 'missing'} does not exist: " \
        "give the --out directory of a training run\n"
    # again into the same --out: its own plots are replaced; a loss.png it did not write never is
    again = subprocess.run([HYBRIDPAR, "report", str(tmp_path / "run"), "--out", str(tmp_path / "plots")],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "loss.png").write_bytes(b"someone else's figure")
    refused = subprocess.run([HYBRIDPAR, "report", str(tmp_path / "run"), "--out", str(tmp_path / "mine")],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stdout == "" and "hybridpar report did not write it" in refused.stderr
    assert (tmp_path / "mine" / "loss.png").read_bytes() == b"someone else's figure"
    assert sorted(os.listdir(tmp_path / "mine")) == ["loss.png"]
