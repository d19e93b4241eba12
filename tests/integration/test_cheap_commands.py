"""Commands that do not train stay cheap (issue 16 §7): every --help answers before torch,
deepspeed or megatron is imported (their bad input: test_bad_input.py), and output into a closed
pipe ends quietly with 141 (128 + SIGPIPE), as a tool killed by SIGPIPE would."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridpar.cli.main import command_names
from test_bad_input import heavy_imports

ENV = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
HELPS = [[], *([name] for name in command_names()), ["data", "prepare"], ["data", "info"]]


@pytest.mark.parametrize("words", HELPS, ids=[" ".join(w) or "hybridpar" for w in HELPS])
def test_help_imports_no_heavy_package(words):
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "hybridpar", *words, "--help"],
                         capture_output=True, text=True, timeout=60, env=ENV)
    took = time.monotonic() - start
    assert res.returncode == 0 and res.stdout.startswith("usage: hybridpar"), res.stderr[-2000:]
    assert heavy_imports(res.stderr) == [], f"--help imported {heavy_imports(res.stderr)}"
    print(f"hybridpar {' '.join(words)} --help: {took:.2f} s")  # soft: this machine is shared and loaded


def _into_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    read, write = os.pipe()
    os.close(read)  # the reader (`head -1`) is gone before the command writes its first line
    try:
        return subprocess.run([sys.executable, "-m", "hybridpar", *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120, env=ENV)
    finally:
        os.close(write)


@pytest.mark.parametrize("args", [
    ("plan", "--model", "llama3-8b", "--gpus", "8"),
    ("mesh", "--tp", "2", "--pp", "2", "--dp", "2"),
], ids=["plan", "mesh"])
def test_closed_pipe_ends_quietly(args):
    res = _into_closed_pipe(*args)
    assert (res.returncode, res.stderr) == (141, "")


def test_help_into_closed_pipe_ends_quietly():
    res = _into_closed_pipe("plan", "--help")  # argparse drops the text itself: a plain exit 0
    assert (res.returncode, res.stderr) == (0, "")


def test_head_reads_the_first_line():
    """The pipeline as users type it: the first line arrives whole, nothing on stderr."""
    shell = f"'{sys.executable}' -m hybridpar plan --model llama3-8b --gpus 8 | head -1"
    res = subprocess.run(["bash", "-o", "pipefail", "-c", shell], capture_output=True, text=True, timeout=120, env=ENV)
    assert res.stdout.startswith("llama3-8b on 8 x h100-80gb") and res.stdout.count("\n") == 1
    assert res.stderr == "" and res.returncode in (0, 141)  # 0 when plan wrote everything before head closed
