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


def test_several_runs_are_compared_in_one_pair_of_plots(tmp_path):
    """Two runs of different batch sizes: a table each, headed by its directory, and their curves in one
    loss.png and throughput.png under --out, against tokens seen with --by-tokens (from each plan.json)."""
    for name, batch in (("small", 8), ("large", 32)):
        run = tmp_path / name
        run.mkdir()
        run.joinpath("metrics.jsonl").write_text("".join(json.dumps(
            {"step": s, "loss": 4.0 - 0.01 * s, "grad_norm": 1.0, "lr": 1e-3, "step_time_s": 0.5, "tokens_per_s": 1000.0}
            | ({} if s % 10 else {"eval_loss": 4.2 - 0.01 * s}))
            + "\n" for s in range(1, 51)))
        run.joinpath("plan.json").write_text(json.dumps({"plan": {"global_batch": batch, "seq_len": 64}}))
    runs = [str(tmp_path / "small"), str(tmp_path / "large")]
    result = subprocess.run([HYBRIDPAR, "report", *runs, "--out", str(tmp_path / "cmp"), "--by-tokens"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"== {runs[0]}\nsteps        50") and f"\n== {runs[1]}\nsteps        50" in result.stdout
    assert sorted(os.listdir(tmp_path / "cmp")) == ["loss.png", "throughput.png"]
    for argv, error in (
        ([*runs], "2 runs are compared in one pair of plots: give --out DIR for them (or --no-plots)"),
        ([runs[0], runs[0] + "/", "--no-plots"], f"{runs[0]}/ is given twice: name each run once"),
        ([runs[0], str(tmp_path), "--out", str(tmp_path / "x"), "--by-tokens"], "no metrics.jsonl in"),
    ):
        refused = subprocess.run([HYBRIDPAR, "report", *argv], capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and refused.stdout == "" and error in refused.stderr, refused.stderr
    (tmp_path / "large" / "plan.json").unlink()
    refused = subprocess.run([HYBRIDPAR, "report", *runs, "--out", str(tmp_path / "cmp"), "--by-tokens"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--by-tokens needs the run's plan.json" in refused.stderr
