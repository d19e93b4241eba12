"""What users watch per step: model FLOP/s per GPU, MFU, the planner's prediction, a progress bar.

``StepMonitor`` is a ``train()`` hook (hybridpar/runtime/loop.py). At the start it works out, once:

- the model FLOPs of one step: ``topology.flops.model_flops_per_seq`` (Megatron-Core's formula,
  the planner's own) x the global batch;
- the device's dense peak for the run's precision (``topology.hardware``): the catalogue GPU whose
  name matches ``torch.cuda.get_device_name()``; on CPU (or an unknown GPU, or fp32) there is no
  peak and MFU is null;
- the planner's predicted step time for this very Plan (``topology.search.evaluate``) on the
  device it runs on, or on the recipe's ``cluster.gpu`` when it runs on CPU; the planner models
  16-bit training, so an fp32 (CPU) run is predicted as bf16.

Per step it adds to metrics.jsonl ``model_flops``, ``flops_per_s`` (whole job), ``device``,
``tflops_per_gpu`` on GPUs or ``tflops_per_rank`` on CPU ranks (a CPU process is not a GPU), ``mfu``
(fraction of the peak, or null), ``predicted_step_time_s`` (null when the planner cannot cost the
layout), ``predicted_step_time_s_range`` (the validation spread around it, as `hybridpar plan` prints it)
and ``predicted_on`` (the GPU and precision the prediction is for). On CPU the prediction is
for a GPU the run does not have: the step line leaves it out and ``describe`` says it is not
comparable with the CPU timings. It appends them to the step line, moves a tqdm bar on rank 0 when stdout is a terminal (lines then go through
``tqdm.write`` so both stay readable) and, when ``torch.utils.tensorboard`` and tensorboard are
importable, writes every number as a TensorBoard scalar under OUT/tensorboard.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Optional

from hybridpar.topology.flops import model_flops_per_seq
from hybridpar.topology.hardware import HardwareError, catalogue_for_device, get_gpu
from hybridpar.topology.validation import step_time_range


@dataclass(frozen=True)
class Yardstick:
    """What a measured step is compared against."""

    flops_per_step: float  # model FLOPs of one optimizer step, whole job
    world: int
    device: str  # "cpu", a catalogue GPU name, or the CUDA device name when unknown
    peak_tflops: Optional[float]  # dense peak of one device at the run's precision; None: no MFU
    predicted_step_time_s: Optional[float]
    predicted_on: str  # "h100-80gb bf16": what the prediction assumes
    # the validation spread around the prediction (topology.validation.step_time_range): how far to trust it
    predicted_range: Optional[tuple[float, float]] = None

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    def step_record(self, step_time_s: float) -> dict:
        flops_per_s = self.flops_per_step / step_time_s if step_time_s > 0 else 0.0
        tflops = flops_per_s / self.world / 1e12
        return {
            "model_flops": self.flops_per_step,
            "flops_per_s": flops_per_s,
            "device": self.device,
            "tflops_per_rank" if self.on_cpu else "tflops_per_gpu": tflops,
            "mfu": tflops / self.peak_tflops if self.peak_tflops else None,
            "predicted_step_time_s": self.predicted_step_time_s,
            "predicted_on": self.predicted_on,
            "predicted_step_time_s_range": list(self.predicted_range) if self.predicted_range else None,
        }


def yardstick(plan, cuda: Optional[bool] = None, device_name: Optional[str] = None) -> Yardstick:
    """The yardstick for ``plan`` (a topology.plan.Plan) on this machine."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
        if cuda and device_name is None:
            device_name = torch.cuda.get_device_name()
    gpu_name = catalogue_for_device(device_name or "") if cuda else None
    device = "cpu" if not cuda else (gpu_name or device_name or "cuda")
    peak = None
    if gpu_name and plan.precision != "fp32":
        try:
            peak = get_gpu(gpu_name).peak_tflops(plan.precision)
        except HardwareError:
            peak = None
    predicted, on = predict_step_time(plan, gpu_name)
    flops = plan.global_batch * model_flops_per_seq(plan.model, plan.seq_len)
    spread = step_time_range(predicted, on.split()[0]) if predicted is not None else None
    return Yardstick(flops, plan.world_size, device, peak, predicted, on, spread)


def predict_step_time(plan, gpu_name: Optional[str] = None) -> tuple[Optional[float], str]:
    """The planner's step time for ``plan`` on ``gpu_name`` (default: the plan's own GPU)."""
    from hybridpar.topology.search import evaluate

    target = plan.with_(gpu=gpu_name or plan.gpu, precision="bf16" if plan.precision == "fp32" else plan.precision)
    on = f"{target.gpu} {target.precision}"
    try:
        return evaluate(target).cost.step_time_s, on
    except (HardwareError, ValueError, ZeroDivisionError):
        return None, on


def describe(y: Yardstick) -> str:
    peak = f"peak {y.peak_tflops:g} TFLOP/s per device" if y.peak_tflops else "no MFU (no known peak)"
    spread = f" ({y.predicted_range[0]:.4g}-{y.predicted_range[1]:.4g})" if y.predicted_range else ""
    pred = (f"planner predicts {y.predicted_step_time_s:.4g} s/step{spread} for this layout on {y.predicted_on}"
            if y.predicted_step_time_s is not None else f"planner cannot cost this layout on {y.predicted_on}")
    if y.on_cpu and y.predicted_step_time_s is not None:
        pred += " (a GPU prediction, not comparable with these CPU timings)"
    return f"metrics: {y.flops_per_step:.4g} model FLOPs per step on {y.world} x {y.device}; {peak}; {pred}"


def per_device_tflops(record: dict) -> tuple[float | None, str]:
    """(TFLOP/s, "gpu" or "rank") of a metrics record: per GPU on GPUs, per process on CPU ranks."""
    if record.get("tflops_per_rank") is not None:
        return record["tflops_per_rank"], "rank"
    return record.get("tflops_per_gpu"), "gpu"


def step_text(record: dict) -> str:
    """The step line's tail: FLOP/s per GPU (or per CPU rank), MFU, and on GPUs the predicted step
    time with the GPU it is for."""
    t, unit = per_device_tflops(record)
    parts = [f"{t:.3g} TFLOP/s/{unit}" if t >= 0.1 else f"{t * 1e3:.3g} GFLOP/s/{unit}"]
    if record.get("mfu") is not None:
        mfu = record["mfu"]  # a tiny model's MFU keeps two digits rather than printing as 0.0%
        parts.append(f"MFU {mfu:.1%}" if mfu >= 0.001 else f"MFU {mfu * 100:.2g}%")
    if record.get("predicted_step_time_s") is not None and record.get("device") != "cpu":
        on = f" on {record['predicted_on']}" if record.get("predicted_on") else ""
        spread = record.get("predicted_step_time_s_range")
        spread = f" ({spread[0]:.3g}-{spread[1]:.3g})" if spread else ""
        parts.append(f"predicted {record['predicted_step_time_s']:.3g} s{spread}{on}")
    return " | " + " | ".join(parts)


def tensorboard_writer(log_dir: str):
    """A SummaryWriter, or None when torch.utils.tensorboard or tensorboard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch.utils.tensorboard imports tensorboard itself
        return None
    return SummaryWriter(log_dir=log_dir)


SCALARS = ("loss", "eval_loss", "lr", "grad_norm", "step_time_s", "tokens_per_s", "tflops_per_gpu", "tflops_per_rank", "mfu",
           "predicted_step_time_s")


class StepMonitor:
    """``train(..., hooks=[..., StepMonitor(out_dir, total_steps)], print_fn=monitor.write)``."""

    def __init__(self, out_dir: Optional[str], total_steps: int, print_fn=None, progress: Optional[bool] = None,
                 tensorboard: bool = True):
        self.out_dir, self.total, self.print_fn = out_dir, total_steps, print_fn
        self.progress, self.tensorboard = progress, tensorboard
        self.yardstick: Optional[Yardstick] = None
        self.bar = self.writer = None
        self.rank0 = True

    # --- output ------------------------------------------------------------------------
    def write(self, line: str) -> None:
        """Print one line (through tqdm when a bar is showing, so the bar stays at the bottom)."""
        if self.print_fn is not None:
            self.print_fn(line)
        elif self.bar is not None:
            from tqdm import tqdm

            tqdm.write(line)
            sys.stdout.flush()
        else:
            print(line, flush=True)

    # --- hooks -------------------------------------------------------------------------
    def on_start(self, job, first_step: int) -> int:
        import torch.distributed as dist

        self.rank0 = not dist.is_initialized() or dist.get_rank() == 0
        self.yardstick = yardstick(job.plan)
        if not self.rank0:
            return first_step
        show_bar = sys.stdout.isatty() if self.progress is None else self.progress
        if show_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, initial=first_step - 1, unit="step", dynamic_ncols=True, leave=True)
        if self.tensorboard and self.out_dir:
            self.writer = tensorboard_writer(os.path.join(self.out_dir, "tensorboard"))
        self.write(describe(self.yardstick))
        return first_step

    def close(self) -> None:
        """Flush and close the TensorBoard file and the progress bar: after the last step, and
        (train.py) on every way out of a run, early stops included."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def on_world_change(self, job) -> None:
        """A DP replica was lost or taken in (or this rank joined): the layout's yardstick, and
        rank 0 may be another process now."""
        import torch.distributed as dist

        self.yardstick = yardstick(job.plan)
        was_rank0, self.rank0 = self.rank0, dist.get_rank() == 0
        if self.rank0 and not was_rank0 and self.tensorboard and self.out_dir:
            self.writer = tensorboard_writer(os.path.join(self.out_dir, "tensorboard"))

    def step_record(self, job, m) -> tuple[dict, str]:
        """Extra metrics.jsonl keys for step ``m`` and the text they add to its line."""
        record = self.yardstick.step_record(m.step_time_s)
        return record, step_text(record)

    def on_step(self, job, m) -> None:
        if not self.rank0:
            return
        if self.writer is not None:
            values = {**m.__dict__, **self.yardstick.step_record(m.step_time_s)}
            for key in SCALARS:
                if values.get(key) is not None:
                    self.writer.add_scalar(key, values[key], m.step)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{m.loss:.4f}", refresh=False)
        if m.step == self.total:
            self.close()
