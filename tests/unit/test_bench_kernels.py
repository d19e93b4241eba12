"""`hybridpar bench kernels`: the timing, the FLOP counts and the GPU file it writes, run on CPU
(the rates are the CPU's; the GPU figures need a GPU, README "kernels")."""
import math
from dataclasses import replace

import pytest
import torch

from hybridpar.benchmarks.kernels import attention_tflops, fraction, gpu_file_text, matmul_tflops, seconds_per_call, sweep
from hybridpar.topology.cost import layer_time
from hybridpar.topology.flops import causal_attention_flops
from hybridpar.topology.kernels import FLASH_BACKWARD_RATIO
from hybridpar.topology.hardware import get_gpu, load_gpu
from hybridpar.topology.models import load_model
from hybridpar.topology.software import HYBRIDPAR


@pytest.fixture
def clock(monkeypatch):
    """The benchmark's clock, advanced only by the calls it times (a loaded machine cannot stretch them):
    returns the function that advances it."""
    import types

    import hybridpar.benchmarks.kernels as kernels

    now = [0.0]
    monkeypatch.setattr(kernels, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    def advance(seconds: float) -> None:
        now[0] += seconds
    return advance


def test_seconds_per_call_times_one_call(clock):
    """A call that takes 4 ms is timed at 4 ms, over blocks of calls until the time asked for has passed."""
    calls = []
    t = seconds_per_call(lambda: (clock(0.004), calls.append(1)), 0.1, lambda: None)
    assert t == pytest.approx(0.004) and 0.1 / 0.004 <= len(calls) <= 0.1 / 0.004 + 6


def test_a_soak_times_the_calls_after_the_device_settled(clock):
    """A call that takes 6 ms for the first 0.15 s and 2 ms after (as a GPU's clock drops under
    its power limit, in reverse): timed over 0.6 s leaving out the first half, it is the later 2 ms."""
    elapsed = [0.0]

    def call():
        step = 0.006 if elapsed[0] < 0.15 else 0.002
        elapsed[0] += step
        clock(step)

    assert seconds_per_call(call, 0.6, lambda: None, settle=0.5) == pytest.approx(0.002)


def test_matmul_rate_is_its_flops_over_its_time(clock, monkeypatch):
    """The rate of a 256 x 512 x 1024 product is 2 m k n FLOPs over the time one torch.mm takes: here 1 ms on
    the benchmark's clock (a wall-clock comparison failed on this 2-core machine under load)."""
    real_mm, shapes = torch.mm, []

    def mm(a, b, out=None):
        shapes.append((tuple(a.shape), tuple(b.shape)))
        clock(0.001)
        return real_mm(a, b, out=out)

    monkeypatch.setattr(torch, "mm", mm)
    rate = matmul_tflops(256, 512, 1024, "cpu", torch.float32, 0.05)
    assert rate == pytest.approx(2 * 256 * 512 * 1024 / 0.001 / 1e12)
    assert set(shapes) == {((256, 512), (512, 1024))}


def test_sweep_covers_every_shape_fastest_first():
    rows = sweep((32, 64), "cpu", torch.float32, 0.01)
    assert {(r["m"], r["k"], r["n"]) for r in rows} == {(m, k, n) for m in (32, 64) for k in (32, 64) for n in (32, 64)}
    assert [r["tflops"] for r in rows] == sorted((r["tflops"] for r in rows), reverse=True)
    assert all(r["tflops"] > 0 and math.isfinite(r["tflops"]) for r in rows)


def test_attention_is_counted_as_the_planner_counts_it(monkeypatch):
    """The measured attention rate uses the planner's causal FLOPs (half the square) and backward
    ratio, so a fraction measured this way, put in a GPU file, gives back the measured time in
    cost.layer_time's attention term."""
    import hybridpar.benchmarks.kernels as kernels

    monkeypatch.setattr(kernels, "seconds_per_call", lambda fn, seconds, sync: (fn(), 0.5)[1])
    seq, heads, dim = 64, 2, 16
    rate = attention_tflops(seq, heads, dim, "cpu", torch.float32, 0.01)
    assert rate == pytest.approx(causal_attention_flops(1, seq, seq, heads, dim) * (1 + FLASH_BACKWARD_RATIO) / 0.5 / 1e12)
    # a GPU on which the attention of one Llama 3 8B layer at 8K runs at this fraction ...
    h100 = get_gpu("h100-80gb")
    m = load_model("llama3-8b")
    flops = causal_attention_flops(1, 8192, 8192, m.heads, m.head_dim) * (1 + FLASH_BACKWARD_RATIO)
    slow = replace(h100, attention_fraction=h100.attention_fraction / 2)
    args = ("bf16", 8192, 1, 1, 1, True, "none", HYBRIDPAR, 8)
    base, halved = layer_time(m, h100, *args), layer_time(m, slow, *args)
    # ... takes exactly the attention's time again at half the fraction
    attention_s = flops / (h100.bf16_tflops * 1e12 * h100.attention_fraction * h100.sustained_clock)
    assert (halved.fwd + halved.bwd) - (base.fwd + base.bwd) == pytest.approx(attention_s)


def test_the_gpu_file_it_writes_is_the_planners(tmp_path):
    path = tmp_path / "measured.yaml"
    path.write_text(gpu_file_text("h200-141gb", 0.8234, 0.4611, 0.8567, "measured by a test"))
    gpu = load_gpu(str(path))
    h200 = get_gpu("h200-141gb")
    assert (gpu.gemm_fraction, gpu.attention_fraction, gpu.sustained_clock) == (0.823, 0.461, 0.857)
    assert gpu.memory_gib == h200.memory_gib and gpu.bf16_tflops == h200.bf16_tflops and gpu.sms == h200.sms


def test_a_rate_above_the_catalogue_peak_is_written_as_one_with_a_note(capsys):
    assert fraction(800.0, 989.0, "matmul") == pytest.approx(800 / 989) and capsys.readouterr().err == ""
    assert fraction(1100.0, 989.0, "matmul") == 1.0
    assert "matmul measured 1100 TFLOP/s, above the catalogue's 989; written as 1.0" in capsys.readouterr().err


def test_it_never_replaces_a_gpu_file_it_did_not_write(tmp_path, capsys):
    """--out over a hand-written GPU file is refused before anything is measured; its own file is
    recognised by the comment gpu_file_text puts first, and may be measured again."""
    from hybridpar.benchmarks.kernels import MARKER, _written_here, main

    mine = tmp_path / "my-gpu.yaml"
    mine.write_text("base: h100-80gb\ngemm_fraction: 0.7\n")
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(mine)])
    assert exc.value.code == 2 and "was not written by this benchmark" in capsys.readouterr().err
    assert mine.read_text() == "base: h100-80gb\ngemm_fraction: 0.7\n"
    ours = tmp_path / "measured.yaml"
    ours.write_text(gpu_file_text("h100-80gb", 0.8, 0.45, 0.85, f"{MARKER[2:]} on a test GPU"))
    assert _written_here(ours) and not _written_here(mine)
