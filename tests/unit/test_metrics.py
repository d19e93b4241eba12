"""hybridpar.metrics without a GPU: device names to catalogue peaks, MFU, the planner's prediction."""
import pytest

from hybridpar.observe.metrics import Yardstick, describe, step_text, yardstick
from hybridpar.topology.hardware import catalogue_for_device
from hybridpar.topology.flops import model_flops_per_seq
from hybridpar.topology.models import PRESETS
from hybridpar.topology.plan import Plan
from hybridpar.topology.search import evaluate
from hybridpar.topology.validation import step_time_range


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H100 80GB HBM3", "h100-80gb"), ("NVIDIA H200", "h200-141gb"), ("NVIDIA H800", "h800-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("Tesla V100-SXM2-16GB", None),
    ("NVIDIA B200", "b200-180gb"),
])
def test_device_names(name, expected):
    assert catalogue_for_device(name) == expected


def test_an_a100_without_its_size_in_the_name_is_told_by_its_memory():
    assert catalogue_for_device("NVIDIA A100-SXM4", 39.4) == "a100-40gb"
    assert catalogue_for_device("NVIDIA A100-SXM4", 79.1) == "a100-80gb"


def test_mfu_against_the_device_peak_on_a_known_gpu():
    plan = Plan(model=PRESETS["llama3-8b"], seq_len=8192, global_batch=64, dp=8, precision="bf16")
    y = yardstick(plan, cuda=True, device_name="NVIDIA H100 80GB HBM3")
    assert y.device == "h100-80gb" and y.peak_tflops == 989.0
    assert y.flops_per_step == pytest.approx(64 * model_flops_per_seq(plan.model, 8192))
    assert y.predicted_step_time_s == pytest.approx(evaluate(plan).cost.step_time_s)
    r = y.step_record(y.predicted_step_time_s)
    # measured == predicted step time: the planner's own TFLOP/s and MFU come back
    assert r["tflops_per_gpu"] == pytest.approx(evaluate(plan).cost.tflops_per_gpu)
    assert r["mfu"] == pytest.approx(evaluate(plan).cost.mfu)
    assert "MFU" in step_text(r) and "TFLOP/s/gpu" in step_text(r)
    # the prediction carries the validation spread of its GPU, as `hybridpar plan` prints it
    lo, hi = step_time_range(y.predicted_step_time_s, "h100-80gb")
    assert r["predicted_step_time_s_range"] == [lo, hi] and lo < y.predicted_step_time_s < hi
    assert f"predicted {y.predicted_step_time_s:.3g} s ({lo:.3g}-{hi:.3g}) on h100-80gb bf16" in step_text(r)


def test_no_mfu_on_cpu_or_unknown_gpu_and_fp32_predicted_as_bf16():
    plan = Plan(model=PRESETS["tiny"], seq_len=64, global_batch=64, tp=2, pp=2, dp=2, micro_batch=16, precision="fp32")
    for kwargs in (dict(cuda=False), dict(cuda=True, device_name="Tesla V100-SXM2-16GB")):
        y = yardstick(plan, **kwargs)
        assert y.peak_tflops is None and y.step_record(0.5)["mfu"] is None
        assert y.predicted_on == "h100-80gb bf16"
        assert y.predicted_step_time_s == pytest.approx(evaluate(plan.with_(precision="bf16")).cost.step_time_s)
    r = Yardstick(1e9, 8, "cpu", None, None, "h100-80gb bf16").step_record(0.5)
    assert r["flops_per_s"] == 2e9 and r["tflops_per_rank"] == pytest.approx(2e9 / 8 / 1e12)
    assert "tflops_per_gpu" not in r  # a CPU process is not a GPU
    assert r["mfu"] is None and r["predicted_step_time_s"] is None and r["predicted_step_time_s_range"] is None
    assert "MFU" not in step_text(r) and "GFLOP/s/rank" in step_text(r)


def test_cpu_runs_never_show_a_gpu_prediction_beside_their_timings():
    plan = Plan(model=PRESETS["tiny"], seq_len=64, global_batch=64, tp=2, pp=2, dp=2, micro_batch=16, precision="fp32")
    y = yardstick(plan, cuda=False)
    r = y.step_record(0.5)
    assert r["predicted_step_time_s"] is not None and r["predicted_on"] == "h100-80gb bf16"
    assert "predicted" not in step_text(r)
    assert "h100-80gb bf16 (a GPU prediction, not comparable with these CPU timings)" in describe(y)
    lo, hi = y.predicted_range  # the banner carries the range the plan command prints
    assert lo < y.predicted_step_time_s < hi
    assert f"{y.predicted_step_time_s:.4g} s/step ({lo:.4g}-{hi:.4g}) for this layout on h100-80gb bf16" in describe(y)
    gpu = yardstick(plan.with_(precision="bf16"), cuda=True, device_name="NVIDIA H100 80GB HBM3")
    assert "on h100-80gb bf16" in step_text(gpu.step_record(0.5)) and "TFLOP/s/gpu" in step_text(gpu.step_record(1e-6))


def test_a_tiny_models_mfu_keeps_two_digits():
    """The main job's recipe on one H200 ran at about 80 GFLOP/s: MFU 0.0081%, not "MFU 0.0%"."""
    y = Yardstick(8e10 * 0.075, 1, "h200-141gb", 989.0, 0.00686, "h200-141gb bf16")
    text = step_text(y.step_record(0.075))
    assert "MFU 0.0081%" in text and "predicted 0.00686 s on h200-141gb bf16" in text
    assert "MFU 38.1%" in step_text(Yardstick(377e12, 1, "h200-141gb", 989.0, None, "").step_record(1.0))
