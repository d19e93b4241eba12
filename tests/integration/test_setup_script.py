"""scripts/setup.sh: the right torch build for the machine, and no silent pip failure.

The script runs for real, in a copy of the repository's set-up files, against a stand-in
``.venv/bin/python`` that records what it is asked and answers as the case needs (a CPU or CUDA
torch, pip succeeding or failing), and with or without an ``nvidia-smi`` that lists a GPU.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = r"""#!/usr/bin/env bash
echo "$*" >> "$FAKE_LOG"
if [ "$1" = "-c" ]; then
    case "$2" in
        *torch.version.cuda*) echo "${FAKE_TORCH_BUILD:-cpu}"; exit 0 ;;
        *cuda.is_available*) exit "${FAKE_CUDA_USABLE_EXIT:-1}" ;;
        *) exit 0 ;;
    esac
fi
if [ "$1 $2" = "-m pip" ] && [ -n "${FAKE_PIP_FAILS_ON:-}" ] && [[ "$*" == *"$FAKE_PIP_FAILS_ON"* ]]; then
    echo "ERROR: No matching distribution found for $FAKE_PIP_FAILS_ON" >&2
    exit 1
fi
exit 0
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _run(tmp_path: Path, gpu: bool, **fake) -> tuple[subprocess.CompletedProcess, list[str]]:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", repo / "scripts" / "setup.sh")
    shutil.copy(ROOT / "requirements.txt", repo / "requirements.txt")
    (repo / ".venv" / "bin").mkdir(parents=True)
    _executable(repo / ".venv" / "bin" / "python", FAKE_PYTHON)
    _executable(repo / ".venv" / "bin" / "hybridpar", "#!/bin/sh\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if gpu:
        _executable(bin_dir / "nvidia-smi", "#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    log = tmp_path / "calls.log"
    log.touch()
    env = dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin", FAKE_LOG=str(log), **fake)
    proc = subprocess.run(["bash", str(repo / "scripts" / "setup.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    return proc, log.read_text().splitlines()


def _pip_calls(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("-m pip install")]


def test_cpu_machine_keeps_its_torch_and_installs_the_pins(tmp_path):
    proc, calls = _run(tmp_path, gpu=False, FAKE_TORCH_BUILD="cpu")
    assert proc.returncode == 0, proc.stderr
    pips = _pip_calls(calls)
    assert any("-r requirements.txt" in c for c in pips), pips
    assert not any("torch==" in c for c in pips), pips
    assert proc.stdout == "" and proc.stderr == ""  # nothing to read when all went well


def test_a_failing_pip_stops_the_set_up_loudly(tmp_path):
    proc, _ = _run(tmp_path, gpu=False, FAKE_TORCH_BUILD="cpu", FAKE_PIP_FAILS_ON="requirements.txt")
    assert proc.returncode != 0
    assert "No matching distribution found for requirements.txt" in proc.stderr
    assert "scripts/setup.sh: error: pip install -r requirements.txt failed" in proc.stderr


def test_gpu_machine_replaces_a_cpu_torch_with_a_cuda_build(tmp_path):
    proc, calls = _run(tmp_path, gpu=True, FAKE_TORCH_BUILD="cpu", FAKE_CUDA_USABLE_EXIT="0",
                       HYBRIDPAR_TORCH_INDEX="https://example.invalid/cu128")
    assert proc.returncode == 0, proc.stderr
    torch_installs = [c for c in _pip_calls(calls) if "torch==2.13.0" in c]
    assert len(torch_installs) == 1, calls
    assert "--force-reinstall" in torch_installs[0] and "--index-url https://example.invalid/cu128" in torch_installs[0]


def test_gpu_machine_whose_torch_cannot_use_it_fails_in_one_line(tmp_path):
    proc, calls = _run(tmp_path, gpu=True, FAKE_TORCH_BUILD="cuda", FAKE_CUDA_USABLE_EXIT="1")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "has a GPU" in lines[0] and "HYBRIDPAR_TORCH_INDEX" in lines[0], proc.stderr
    assert not any("torch==" in c for c in _pip_calls(calls))  # a CUDA build is not reinstalled
    assert not any("-r requirements.txt" in c for c in _pip_calls(calls))  # stopped before the rest
