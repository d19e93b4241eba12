"""`hybridpar bench` as a command: the list of benchmarks, and `bench kernels` without a GPU
(their pure parts: tests/unit/test_bench_kernels.py, tests/unit/test_bench_smoke.py)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NEW = {"comm", "memory", "overhead", "throughput", "gpu", "kernels"}  # each listed with its docstring's first line


def test_without_a_gpu_it_says_so_in_one_line(tmp_path):
    out = tmp_path / "gpu.yaml"
    res = subprocess.run([sys.executable, "-m", "hybridpar", "bench", "kernels", "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "no CUDA GPU" in res.stderr
    assert not out.exists()


def test_bench_list_names_every_benchmark():
    out = subprocess.run([sys.executable, "-m", "hybridpar", "bench", "--list"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    listed = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    assert NEW | {"planner_speed", "scaling"} <= set(listed)
    assert not any(name.startswith("_") for name in listed)
    for name in NEW:  # the docstring's first line is shown
        assert len(listed[name].split(None, 1)[1]) > 20
