"""`hybridpar launch`: per-node torchrun commands and the sbatch script, from a recipe."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _launch(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "hybridpar", "launch", *args], cwd=cwd,
                          capture_output=True, text=True)


def test_launch_takes_the_nodes_a_recipe_states(tmp_path):
    """Without --nodes: the recipe's cluster.gpus over its gpus_per_node (Llama 3 8B: 128 H100 = 16 nodes)."""
    res = _launch("--recipe", "recipes/llama3-8b.yaml", "--slurm", "--out", str(tmp_path / "job"))
    assert res.returncode == 0, res.stderr
    sbatch = (tmp_path / "job" / "job.sbatch").read_text()
    assert "#SBATCH --nodes=16" in sbatch and "--nproc-per-node=8" in sbatch
    assert "128 ranks = tp 2 x cp 1 x pp 1 x dp 64" in (tmp_path / "job" / "torchrun.sh").read_text()


def test_launch_writes_torchrun_and_sbatch(tmp_path):
    out = tmp_path / "job"
    res = _launch("--recipe", "recipes/tiny.yaml", "--nodes", "2", "--gpus-per-node", "4", "--slurm",
                  "--out", str(out), "--", "--steps", "3")
    assert res.returncode == 0, res.stderr
    torchrun = (out / "torchrun.sh").read_text()
    sbatch = (out / "job.sbatch").read_text()
    for text in (torchrun, sbatch):
        assert "--nnodes=2" in text and "--nproc-per-node=4" in text and "--rdzv-backend=c10d" in text
        assert "-m hybridpar train --recipe recipes/tiny.yaml --steps 3" in text
    assert "#SBATCH --nodes=2" in sbatch and "--rdzv-id=$SLURM_JOB_ID" in sbatch
    for text in (torchrun, sbatch):  # megatron's async TP collectives need one queue per GPU
        assert text.index("export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}") < text.index(
            "${PYTHON:-python3} -m hybridpar.launch.node_agent --nnodes=2")  # torchrun, via hybridpar's node agent
    assert "node 0: DP replica(s) 0" in torchrun and "node 1: DP replica(s) 1" in torchrun
    assert not list(out.glob(".*tmp"))
    # A layout flag after -- is the layout the ranks will run, and the node map says so.
    res = _launch("--recipe", "recipes/tiny.yaml", "--nodes", "2", "--gpus-per-node", "4", "--out", str(out),
                  "--", "--pp", "1", "--tp", "2", "--steps", "3")
    assert res.returncode == 0, res.stderr
    assert "8 ranks = tp 2 x cp 1 x pp 1 x dp 4" in (out / "torchrun.sh").read_text()
    assert "node 0: DP replica(s) 0-1" in res.stdout and "node 1: DP replica(s) 2-3" in res.stdout


@pytest.mark.parametrize("args, message", [
    (["--nodes", "3", "--gpus-per-node", "4"], "world size 12 != tp x cp x pp x dp"),
    (["--nodes", "0"], "--nodes must be a positive integer"),
    (["--nodes", "2", "--gpus-per-node", "4", "--partition", "x"], "--partition only applies with --slurm"),
    (["--nodes", "2", "--gpus-per-node", "4", "--run-dir", "r"], "--run-dir only applies with --slurm"),
    (["--nodes", "2", "--gpus-per-node", "4", "--slurm", "--time", "two days"], "is not a SLURM time limit"),
    (["--nodes", "2", "--gpus-per-node", "4", "--slurm", "--partition", "gpu a100"], "is not a SLURM partition name"),
    (["--nodes", "2", "--gpus-per-node", "4", "--slurm", "--time", "0:05:00"], "save and stop 300 s before its limit"),
    (["--nodes", "2", "--gpus-per-node", "4", "--slurm", "--venv", "/nonexistent-venv"], "has no bin/activate"),
    # train flags after -- are parsed and checked as train would on every node
    (["--nodes", "2", "--gpus-per-node", "4", "--", "--stpes", "3"], "the train flags after --: unrecognized arguments --stpes 3; did you mean --steps?"),
    (["--nodes", "2", "--gpus-per-node", "4", "--", "--steps", "0"], "--steps must be a positive integer"),
    (["--nodes", "2", "--gpus-per-node", "4", "--", "--tp", "3"], "not divisible by tp x cp x pp = 3"),
    (["--nodes", "2", "--gpus-per-node", "4", "--", "--save-every", "-1"], "--save-every must be >= 0"),
    (["--nodes", "2", "--gpus-per-node", "4", "--", "--nproc", "4"], "train flag --nproc cannot go through launch"),
    (["--nodes", "2", "--gpus-per-node", "4", "--slurm", "--", "--out", "x"], "give launch --run-dir instead"),
    (["--nodes", "2", "--gpus-per-node", "4", "--slurm", "--", "--overwrite"], "train flag --overwrite cannot go through launch"),
])
def test_launch_bad_input_is_one_line_exit_2(tmp_path, args, message):
    res = _launch("--recipe", "recipes/tiny.yaml", "--out", str(tmp_path / "o"), *args)
    assert res.returncode == 2
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_train_flags_are_checked_as_the_script_runs_them(tmp_path):
    """The sbatch script adds --resume auto, so --allow-changes is a flag it can use; torchrun.sh alone
    resumes nothing, so there it is refused."""
    slurm = _launch("--recipe", "recipes/tiny.yaml", "--nodes", "2", "--gpus-per-node", "4", "--slurm",
                    "--out", str(tmp_path / "s"), "--", "--allow-changes")
    assert slurm.returncode == 0, slurm.stderr
    assert "--allow-changes --resume auto --out" in (tmp_path / "s" / "job.sbatch").read_text()
    plain = _launch("--recipe", "recipes/tiny.yaml", "--nodes", "2", "--gpus-per-node", "4",
                    "--out", str(tmp_path / "p"), "--", "--allow-changes")
    assert plain.returncode == 2 and "add --resume" in plain.stderr and not (tmp_path / "p").exists()


def test_launch_replaces_its_own_files_never_anothers(tmp_path):
    """Running launch again regenerates its scripts; a file of the same name that launch did not write
    (a hand-made job script in the chosen --out) is left as it is and the command refused."""
    args = ("--recipe", "recipes/tiny.yaml", "--nodes", "2", "--gpus-per-node", "4", "--slurm", "--out", str(tmp_path))
    assert _launch(*args).returncode == 0
    again = _launch(*args, "--", "--steps", "7")
    assert again.returncode == 0, again.stderr
    assert "--steps 7" in (tmp_path / "job.sbatch").read_text() and "--steps 7" in (tmp_path / "torchrun.sh").read_text()
    (tmp_path / "job.sbatch").write_text("#!/bin/bash\n#SBATCH --job-name=mine\nsrun my_job\n")
    refused = _launch(*args)
    assert refused.returncode == 2 and "job.sbatch exists and was not written by hybridpar launch" in refused.stderr
    assert (tmp_path / "job.sbatch").read_text().endswith("srun my_job\n")


def test_the_sbatch_script_requeues_only_after_a_stop_of_its_own_attempt(tmp_path):
    """job.sbatch run by bash with srun and scontrol stand-ins: an attempt whose ranks saved and stopped
    (status.json written "stopped" by this attempt) requeues the job and exits 0; an attempt that failed
    before writing status.json (bad input after an edit) leaves the earlier "stopped" and must not requeue,
    or the job would loop; a finished run is not requeued."""
    run_dir = tmp_path / "run"
    res = _launch("--recipe", "recipes/tiny.yaml", "--nodes", "2", "--gpus-per-node", "4", "--slurm",
                  "--out", str(tmp_path / "job"), "--run-dir", str(run_dir))
    assert res.returncode == 0, res.stderr
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text('#!/bin/bash\nif [ -n "$FAKE_STATUS" ]; then mkdir -p "$RUN"\n'
                               '  echo "{\\"status\\": \\"$FAKE_STATUS\\"}" > "$RUN/status.json"; fi\nexit "${FAKE_RC:-0}"\n')
    (fake / "scontrol").write_text('#!/bin/bash\necho "$@" >> "$CALLS"\n[ "$1" = show ] && echo node1\nexit 0\n')
    for tool in ("srun", "scontrol"):
        (fake / tool).chmod(0o755)
    calls = tmp_path / "calls"

    def attempt(status: str, rc: int = 0):
        calls.write_text("")
        env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", SLURM_JOB_ID="42", SLURM_JOB_NODELIST="node[1-2]",
                   RUN=str(run_dir), CALLS=str(calls), FAKE_STATUS=status, FAKE_RC=str(rc))
        done = subprocess.run(["bash", str(tmp_path / "job" / "job.sbatch")], env=env, capture_output=True, text=True,
                              timeout=60)
        return done.returncode, "requeue 42" in calls.read_text()

    assert attempt("stopped") == (0, True)
    assert attempt("", rc=2) == (2, False)  # the earlier "stopped" is still there: not this attempt's
    os.utime(run_dir / "status.json", (1, 1))  # a later attempt, long after the last write
    assert attempt("stopped") == (0, True)
    os.utime(run_dir / "status.json", (1, 1))
    assert attempt("finished") == (0, False)
