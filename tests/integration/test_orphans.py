"""No orphans (issue 16 §3): ranks end when their launcher dies, however it dies.

torch's agent and the CPU launcher start every rank in a session of its own, so a SIGKILLed launcher (OOM killer)
used to leave its 8 ranks training for minutes. hybridpar/launch/launcher_death.py asks the kernel for
SIGKILL when the parent dies. One 8-rank launch, which also checks that a warm-up longer than the
run is said once, by the launching process, not by its ranks.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import descendants, stat

ROOT = Path(__file__).resolve().parents[2]
GONE_WITHIN_S = 30  # the bound; measured 0.1 s (the kernel's signal, then reaping)
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
for _key in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "HYBRIDPAR_LAUNCHER_PID"):
    ENV.pop(_key, None)


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _python(code: str, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], env=dict(ENV, **env), stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize("wrapped", [False, True], ids=["child", "under-a-shell"])
def test_rank_dies_with_its_launcher(wrapped):
    """Without torch: a "launcher" starts a "rank" (directly, or through a shell that stays between
    them: then the rank polls the launcher's pid), then the launcher is SIGKILLed."""
    rank = ("import os, time; from hybridpar.launch.launcher_death import die_with_launcher; die_with_launcher(); "
            "print(os.getpid(), flush=True); time.sleep(120)")
    command = [sys.executable, "-c", rank]
    if wrapped:
        command = ["sh", "-c", " ".join(shlex.quote(word) for word in command) + "; true"]
    launcher = _python(
        "import os, subprocess, sys, time; "
        f"subprocess.Popen({command!r}, start_new_session=True, "
        "env=dict(os.environ, TORCHELASTIC_RUN_ID='t', HYBRIDPAR_LAUNCHER_PID=str(os.getpid()))); time.sleep(120)")
    child = int(launcher.stdout.readline())  # printed once the rank has asked (its stdout is the launcher's)
    try:
        assert stat(child) and (stat(child)[1] == launcher.pid) != wrapped
        launcher.kill()
        launcher.wait()
        _wait_for(lambda: stat(child) is None, 10, "the rank outlived its launcher")
    finally:
        launcher.kill()
        if stat(child):
            os.kill(child, signal.SIGKILL)


def test_rank_whose_launcher_is_already_gone_stops_at_once():
    """The launcher died before the rank could ask the kernel: the rank finds another parent."""
    rank = _python("from hybridpar.launch.launcher_death import die_with_launcher; die_with_launcher(); print('ran on')",
                   TORCHELASTIC_RUN_ID="t", HYBRIDPAR_LAUNCHER_PID=str(os.getpid() + 10**6))
    out, _ = rank.communicate(timeout=60)
    assert (rank.returncode, out) == (-signal.SIGKILL, "")


def test_without_an_elastic_agent_nothing_changes():
    rank = _python("from hybridpar.launch.launcher_death import die_with_launcher; die_with_launcher(); print('ran on')",
                   HYBRIDPAR_LAUNCHER_PID=str(os.getpid() + 10**6))
    assert rank.communicate(timeout=60)[0] == "ran on\n" and rank.returncode == 0


@pytest.mark.parametrize("extra", [[], ["--tolerate-replica-loss"]], ids=["local-launcher", "tolerant-launcher"])
def test_sigkilled_launcher_leaves_no_rank(tmp_path, extra):
    recipe = tmp_path / "long-warmup.yaml"
    recipe.write_text((ROOT / "recipes" / "tiny.yaml").read_text().replace("warmup_steps: 2", "warmup_steps: 1000000"))
    log = tmp_path / "launch.log"
    with open(log, "w") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "hybridpar", "train", "--recipe", str(recipe), "--nproc", "8", "--steps", "100000",
             "--out", str(tmp_path / "run"), *extra], cwd=ROOT, env=ENV, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    ranks: set[int] = set()
    try:
        _wait_for(lambda: "step 2/100000" in log.read_text() or launcher.poll() is not None, 400, "no step 2")
        ranks = descendants(launcher.pid)
        text = log.read_text()
        assert launcher.poll() is None, text[-3000:]
        assert len(ranks) >= 8, ranks
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        killed = time.monotonic()
        _wait_for(lambda: not any(stat(pid) for pid in ranks), GONE_WITHIN_S,
                  f"ranks still alive {GONE_WITHIN_S} s after the launcher's SIGKILL: {[p for p in ranks if stat(p)]}")
        print(f"{len(ranks)} processes of the run gone {time.monotonic() - killed:.2f} s after the launcher's SIGKILL")
        warnings = [line for line in text.splitlines() if "warning" in line]
        assert len(warnings) == 1 and warnings[0].startswith(
            "hybridpar train: warning: train.warmup_steps 1000000 is longer than the run's 100000 steps"), warnings
    finally:
        launcher.kill()
        for pid in ranks:
            if stat(pid):
                os.kill(pid, signal.SIGKILL)
