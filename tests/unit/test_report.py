"""`hybridpar report`: summary of a synthetic metrics.jsonl, PNG curves, one-line errors (the command
as a process: tests/integration/test_report_cli.py)."""
import json
import os

import pytest

from hybridpar.errors import UsageError
from hybridpar.observe.report import format_summary, load_metrics, plot, summarize


def record(step, loss, **extra):
    base = {"step": step, "loss": loss, "grad_norm": 1.0, "lr": 1e-3, "step_time_s": 0.5, "tokens_per_s": 1000.0}
    return {**base, **extra}


def write_metrics(run_dir, records):
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def test_summary_keeps_the_last_record_of_a_step_after_a_resume(tmp_path):
    first = [record(s, 5.0 - s, step_time_s=0.1 * s) for s in range(1, 5)]
    resumed = [record(s, 4.5 - s, step_time_s=1.0, tokens_per_s=2000.0) for s in (3, 4, 5)]  # resumed at step 2
    write_metrics(tmp_path, first + resumed)
    records = load_metrics(str(tmp_path))
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    s = summarize(records)
    assert (s.steps, s.first_loss, s.last_loss, s.min_loss, s.min_loss_step) == (5, 4.0, -0.5, -0.5, 5)
    assert s.median_step_time_s == 1.0 and s.median_tokens_per_s == 2000.0
    assert s.total_time_s == pytest.approx(0.1 + 0.2 + 3 * 1.0)
    assert s.median_mfu is None and s.predicted_step_time_s is None
    text = format_summary(s)
    assert "min -0.5000 (step 5)" in text and "MFU" not in text


def test_optional_columns_show_when_logged(tmp_path):
    records = [record(s, 2.0, tflops_per_gpu=100.0 + s, mfu=0.4, predicted_step_time_s=0.25) for s in range(1, 4)]
    text = format_summary(summarize(records))
    assert "TFLOP/s/GPU  median 102.00" in text
    assert "MFU          median 40.0%" in text
    assert "measured/predicted 2.00" in text


def test_held_out_losses_are_summarized_with_their_steps():
    records = [record(s, 3.0 - 0.1 * s, **({"eval_loss": {2: 3.1, 4: 2.9, 6: 2.95}[s]} if s % 2 == 0 else {}))
               for s in range(1, 7)]
    s = summarize(records)
    assert s.eval_points == ((2, 3.1), (4, 2.9), (6, 2.95))
    assert ("eval loss    first 3.1000 (step 2)   last 2.9500 (step 6)   min 2.9000 (step 4); held-out data, "
            "3 evaluations") in format_summary(s)
    assert "eval loss" not in format_summary(summarize([record(1, 2.0)]))


def test_a_cpu_run_is_per_rank_and_not_compared_with_a_gpu_prediction():
    records = [record(s, 2.0, device="cpu", tflops_per_rank=0.002, predicted_step_time_s=0.005185,
                      predicted_step_time_s_range=[0.004871, 0.005934], predicted_on="h100-80gb bf16")
               for s in range(1, 4)]
    text = format_summary(summarize(records))
    assert "measured/predicted" not in text and "TFLOP/s/GPU" not in text
    assert "TFLOP/s/rank median 0.002" in text
    assert ("0.005185 s per step (0.004871-0.005934 s) on h100-80gb bf16 (a GPU prediction; this run ran on CPU "
            "ranks, so no ratio)") in text
    gpu = [record(s, 2.0, device="h100-80gb", tflops_per_gpu=400.0, predicted_step_time_s=0.25,
                  predicted_on="h100-80gb bf16") for s in range(1, 4)]  # a file from before the range was logged
    assert "0.25 s per step on h100-80gb bf16 (measured/predicted 2.00)" in format_summary(summarize(gpu))


def test_plot_writes_two_pngs_atomically(tmp_path):
    import matplotlib.image

    records = [record(s, 3.0 / s, tflops_per_gpu=1.0) for s in range(1, 30)]
    paths = plot(records, str(tmp_path), loss_baseline=1.5)
    assert sorted(os.listdir(tmp_path)) == ["loss.png", "throughput.png"]  # no temporary files left
    for path in paths:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        height, width, _ = matplotlib.image.imread(path).shape
        assert height > 200 and width > 400


def test_bad_run_directories_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_metrics(str(tmp_path / "nope"))
    with pytest.raises(UsageError, match="no metrics.jsonl"):
        load_metrics(str(tmp_path))
    (tmp_path / "metrics.jsonl").write_text("\n")
    with pytest.raises(UsageError, match="is empty"):
        load_metrics(str(tmp_path))
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record(1, 2.0)) + '\n{"step": 2, "lo\n' + json.dumps(record(3, 1.0)) + "\n")
    with pytest.raises(UsageError, match=r"metrics.jsonl:2: not JSON"):
        load_metrics(str(tmp_path))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    with pytest.raises(UsageError, match="missing step_time_s, tokens_per_s"):
        load_metrics(str(tmp_path))


def test_a_last_line_cut_short_by_a_killed_run_is_left_out_with_a_warning(tmp_path):
    """A run killed while writing its metrics leaves a last line without its newline: the report
    shows the steps before it and names the cut line (a resumed run drops it too)."""
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record(1, 2.0)) + "\n" + json.dumps(record(2, 1.5)) + '\n{"step": 3, "lo')
    warned = []
    records = load_metrics(str(tmp_path), warn=warned.append)
    assert [r["step"] for r in records] == [1, 2]
    assert len(warned) == 1 and "metrics.jsonl:3: the last line is cut short" in warned[0]
