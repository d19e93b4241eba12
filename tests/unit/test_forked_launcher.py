"""hybridpar/launch/forked.py: the CPU launcher's forked ranks, on small targets (no process group).

The launcher's real use (8-rank training, a rank SIGKILLed mid-step, signals passed on, a SIGKILLed
launcher) is tested in tests/integration (test_rank_failure.py, test_preemption.py, test_orphans.py,
test_replica_loss.py); here: what a forked rank gets and how its end is read. Each case runs in a
fresh interpreter: the launcher refuses to fork beside another thread, and pytest's process may
hold some (torch's intra-op pool, a progress bar's monitor).
"""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_a_rank_gets_its_environment_name_and_session_and_the_launcher_keeps_its_own():
    proc = _python("""
        import os
        from pathlib import Path
        from hybridpar.launch.forked import ForkedRank, rank_env, rank_name

        def target():
            name = Path(f"/proc/{os.getpid()}/comm").read_text().strip()
            print(os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["MASTER_PORT"], name,
                  os.getsid(0) == os.getpid(), flush=True)
            return 0

        print("code", ForkedRank(target, rank_env(3, 4, 12345), rank_name(3)).wait(60), "RANK" in os.environ)
        """)
    assert proc.stdout.splitlines() == ["3 4 12345 hybridpar r3 True", "code 0 False"], proc.stderr


@pytest.mark.parametrize("body, code", [("raise SystemExit(7)", 7), ("raise ValueError('a bug')", 1),
                                        ("os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL), ("return 2", 2)])
def test_exit_codes_exceptions_and_signals_come_back_as_popen_gives_them(body, code):
    proc = _python(f"""
        import os, signal
        from hybridpar.launch.forked import ForkedRank

        def target():
            {body}

        print(ForkedRank(target, dict(os.environ), "hybridpar r0").wait(60))
        """)
    assert proc.stdout.strip() == str(code), proc.stderr
    assert ("ValueError: a bug" in proc.stderr) == (code == 1)  # a rank's exception: its traceback, exit 1


def test_the_launcher_forks_from_one_thread_only():
    proc = _python("""
        import os, threading
        from hybridpar.launch.forked import ForkedRank

        threading.Thread(target=threading.Event().wait, daemon=True).start()
        try:
            ForkedRank(lambda: 0, dict(os.environ), "hybridpar r0")
        except RuntimeError as err:
            print(err)
        """)
    assert proc.stdout.strip() == "hybridpar's CPU launcher would fork with 2 threads running", proc.stderr


def test_the_first_failure_stops_the_others_and_one_line_names_it():
    """Rank 2 exits 3 at once; the others would sleep 60 s: they are stopped (SIGTERM), the launcher
    names the rank that started it and returns its code."""
    proc = _python("""
        import os, time
        from hybridpar.launch.forked import launch_forked

        def target():
            if os.environ["RANK"] == "2":
                return 3
            time.sleep(60)
            return 0

        started = time.monotonic()
        code = launch_forked(4, target)
        print(code, time.monotonic() - started < 30)
        """)
    assert proc.stdout.strip() == "3 True", proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("hybridpar: rank ")]
    assert len(lines) == 1 and lines[0].startswith("hybridpar: rank 2 (pid ") and "failed with exit code 3" in lines[0], \
        proc.stderr
    assert "3 other rank(s) failed after it" in lines[0]  # the stopped ones, ended by SIGTERM as under torch's agent


def test_a_script_runs_as_main_on_every_rank_and_bad_input_is_one_line_exit_2(tmp_path):
    script = tmp_path / "worker.py"
    (tmp_path / "sibling.py").write_text("WHO = 'sibling'\n")
    script.write_text("import os, sys\nfrom sibling import WHO\n"
                      "if __name__ == '__main__':\n    print(os.environ['RANK'], sys.argv[1:], WHO, flush=True)\n")
    run = subprocess.run([sys.executable, "-m", "hybridpar.launch.forked", "--nproc", "2", str(script), "a", "--b"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and sorted(run.stdout.splitlines()) == [
        "0 ['a', '--b'] sibling", "1 ['a', '--b'] sibling"], run.stderr
    bad = subprocess.run([sys.executable, "-m", "hybridpar.launch.forked", "--nproc", "2", str(tmp_path / "none.py")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.splitlines()) == 1, bad.stderr


@pytest.mark.parametrize("threads, forks", [("1", True), ("2", False)])
def test_a_launcher_whose_torch_started_openmp_workers_spawns_instead(threads, forks):
    proc = _python(f"""
        import os
        os.environ["OMP_NUM_THREADS"] = "{threads}"
        import torch
        from hybridpar.launch.forked import can_fork
        print(can_fork())
        """)
    assert proc.stdout.strip() == str(forks), proc.stderr
