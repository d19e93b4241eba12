"""A run directory held by a live run is refused to a second one, named by the holder's pid, and is
free once that process dies (hybridpar/reliability/run_dir.py; the rest: tests/unit/test_run_dir.py)."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hybridpar.errors import UsageError
from hybridpar.reliability.run_dir import RunDirs, claim

ROOT = Path(__file__).resolve().parents[2]

HOLD = """
import sys, time
from hybridpar.reliability.run_dir import RunDirs, claim
held = claim(RunDirs(sys.argv[1], sys.argv[2]), resuming=False, overwrite=False)
print("held", flush=True)
time.sleep(600)
"""


def test_a_second_run_is_refused_until_the_first_dies(tmp_path):
    out, save = tmp_path / "run", tmp_path / "elsewhere" / "ckpt"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out), str(save)], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert holder.stdout.readline().strip() == "held"
        for dirs in (RunDirs(str(out), None), RunDirs(str(tmp_path / "other"), str(save))):
            with pytest.raises(UsageError, match=rf"in use by another run \(pid {holder.pid} on "):
                claim(dirs, resuming=True, overwrite=False)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    claim(RunDirs(str(out), str(save)), resuming=True, overwrite=False).release()  # a dead run holds nothing
