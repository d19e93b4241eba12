"""The run directory owns its run (hybridpar/reliability/run_dir.py), damaged checkpoints are named, and early
stops are agreed from signals, a step or a clock (hybridpar/reliability/stopping.py). Pure: real files and
locks, no process (a lock held by a live second process: tests/integration/test_run_dir_lock.py)."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from hybridpar.errors import UsageError
from hybridpar.reliability.run_dir import LOCK_NAME, RunDirs, claim, keep_steps_before
from hybridpar.reliability.stopping import AT_STEP, STOP_REASONS, TIME_LIMIT, StopConditions, StopReason


def _previous_run(out: Path) -> None:
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (out / "notes.txt").write_text("mine")  # not hybridpar's: never deleted
    (out / "ckpt" / "step-000002").mkdir(parents=True)
    (out / "ckpt" / "latest").write_text("step-000002\n")
    (out / "profile").mkdir()
    (out / "profile" / "rank-00000-steps-1-2.json").write_text("{}")  # its trace (observe/profile.py)
    (out / "profile" / "mine.json").write_text("{}")


def test_a_fresh_run_never_mixes_with_an_earlier_one(tmp_path):
    out = tmp_path / "run"
    _previous_run(out)
    dirs = RunDirs(str(out), str(out / "ckpt"))
    with pytest.raises(UsageError, match=r"already holds a run .*--resume auto.*--overwrite"):
        claim(dirs, resuming=False, overwrite=False)
    assert (out / "metrics.jsonl").exists() and (out / "ckpt" / "step-000002").exists()  # nothing touched
    claim(dirs, resuming=True, overwrite=False).release()  # continuing it is fine
    claim(dirs, resuming=False, overwrite=True).release()
    assert sorted(os.listdir(out)) == [LOCK_NAME, "ckpt", "notes.txt", "profile"]
    assert os.listdir(out / "ckpt") == [LOCK_NAME] and os.listdir(out / "profile") == ["mine.json"]


def test_a_trace_alone_is_an_earlier_run(tmp_path):
    out = tmp_path / "run"
    (out / "profile").mkdir(parents=True)
    (out / "profile" / "rank-00003-steps-5-7.json").write_text("{}")
    with pytest.raises(UsageError, match="already holds a run"):
        claim(RunDirs(str(out), None), resuming=False, overwrite=False)


def test_a_sample_alone_is_an_earlier_run_and_a_foreign_status_is_never_replaced(tmp_path):
    """sample.txt is a run's file: alone in --out it refuses a fresh run as metrics would. A status.json hybridpar
    did not write (not its object with one of its statuses) refuses every run, --overwrite and --resume included,
    and stays as it was; hybridpar's own, left by a run that failed or was killed while running, does not."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "sample.txt").write_text("my poem\n")
    with pytest.raises(UsageError, match="already holds a run"):
        claim(RunDirs(str(out), None), resuming=False, overwrite=False)
    (out / "sample.txt").unlink()
    for mine in ("notes\n", '{"status": "mine"}\n', "[1, 2]\n"):
        (out / "status.json").write_text(mine)
        for resuming, overwrite in ((False, False), (False, True), (True, False)):
            with pytest.raises(UsageError, match=r"status.json is not a status hybridpar wrote.*another --out"):
                claim(RunDirs(str(out), None), resuming=resuming, overwrite=overwrite)
            assert (out / "status.json").read_text() == mine
    for ours in ({"status": "failed", "exit_code": 1}, {"status": "running", "step": 3}):
        (out / "status.json").write_text(json.dumps(ours) + "\n")
        claim(RunDirs(str(out), None), resuming=False, overwrite=False).release()
        claim(RunDirs(str(out), None), resuming=True, overwrite=False).release()


def test_a_save_dir_holding_another_runs_checkpoints_is_named(tmp_path):
    """A fresh --out with --save-dir on an earlier run's checkpoints: the error names the save directory
    (which --overwrite would empty), not the new, empty run directory."""
    _previous_run(tmp_path / "old")
    dirs = RunDirs(str(tmp_path / "new"), str(tmp_path / "old" / "ckpt"))
    with pytest.raises(UsageError) as err:
        claim(dirs, resuming=False, overwrite=False)
    assert str(err.value).startswith(f"{tmp_path / 'old' / 'ckpt'} already holds a run ({tmp_path / 'old' / 'ckpt' / 'latest'}")
    (tmp_path / "new" / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(UsageError, match=r"new and .*old/ckpt already hold a run"):
        claim(dirs, resuming=False, overwrite=False)


def test_a_resumed_run_rewrites_the_steps_after_its_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3, 4, 5)) + '{"step": 6, "lo')
    assert keep_steps_before(str(path), 4) == 3  # steps 4, 5 and the half-written 6
    assert [json.loads(l)["step"] for l in path.read_text().splitlines()] == [1, 2, 3]
    assert keep_steps_before(str(path), 4) == 0 and keep_steps_before(str(tmp_path / "none"), 1) == 0


def test_an_unusable_latest_is_named_and_the_older_one_used(tmp_path):
    from test_checkpoint_files import MODEL, full_state, write_checkpoint

    from hybridpar.checkpoint import inspect_resume
    from hybridpar.checkpoint.files import CheckpointError
    from hybridpar.topology.plan import Plan

    base = str(tmp_path)
    write_checkpoint(base, 2, full_state())
    write_checkpoint(base, 4, full_state())
    os.remove(os.path.join(base, "step-000004", "manifest.json"))  # latest still names it
    plan = Plan(model=MODEL, seq_len=16, global_batch=4, precision="fp32")
    found = inspect_resume(base, plan)
    assert found.step_dir.endswith("step-000002") and found.manifest.step == 2
    assert [s.step for s in found.skipped] == [4] and "manifest.json is missing" in found.skipped[0].reason
    with pytest.raises(CheckpointError, match="manifest.json is missing"):  # named explicitly: no fallback
        inspect_resume(os.path.join(base, "step-000004"), plan)
    os.remove(os.path.join(base, "step-000002", "manifest.json"))
    with pytest.raises(CheckpointError, match=r"no usable checkpoint .* the newest, .*step-000004, is unusable"):
        inspect_resume(base, plan)


def test_stop_reasons_from_a_signal_a_step_and_the_clock():
    now = [0.0]
    stop = StopConditions(stop_at_step=5, exit_after_s=100.0, clock=lambda: now[0])
    assert stop.local_code(1) == 0
    stop.observe(step_s=10.0, save_s=25.0)
    now[0] = 64.0  # 64 + 10 + 25 < 100: one more step and a save still fit
    assert stop.local_code(2) == 0
    now[0] = 66.0
    assert stop.local_code(3) == TIME_LIMIT
    assert StopConditions(stop_at_step=5).local_code(5) == AT_STEP
    stop._on_signal(signal.SIGUSR1, None)
    stop._on_signal(signal.SIGTERM, None)  # the first signal is the reason
    assert stop.local_code(3) == signal.SIGUSR1
    assert STOP_REASONS.index(int(signal.SIGTERM)) < STOP_REASONS.index(TIME_LIMIT) < STOP_REASONS.index(AT_STEP)
    assert StopReason(int(signal.SIGTERM), 3).exit_code == 143 and StopReason(AT_STEP, 3).exit_code == 4
    assert StopReason(int(signal.SIGINT), 3).describe() == "SIGINT" and StopReason(TIME_LIMIT, 3).describe() == "--exit-after"
