"""Gradient accumulation outside the GEMMs (topology/software.py grad_accum_bytes_per_param and
grad_accum_hbm_efficiency, charged in cost.step_cost): the rate of the one add across dtypes is the one
measured on an H200, and each stack's rate goes with its mechanism."""
import json
from pathlib import Path

import pytest

from hybridpar.benchmarks.gpu import MODEL
from hybridpar.topology.hardware import get_gpu
from hybridpar.topology.kernels import HBM_EFFICIENCY, MIXED_ADD_HBM
from hybridpar.topology.software import GRAD_ADD_MIXED, PROFILES

H200_GPU_RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200" / "gpu.json"


def test_the_mixed_dtype_add_rate_is_the_h200_profiles():
    """`hybridpar bench gpu --profile 2` on one H200: PyTorch's unrolled fp32 add (the kernel that casts a bf16
    operand as it loads it) ran once per parameter tensor and micro-batch, 10 bytes per parameter each time."""
    run = json.loads(H200_GPU_RUN.read_text())
    add, = [k for k in run["profile"]["top_kernels"]
            if "unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>" in k["name"]]
    tensors = 4 * MODEL.layers + 2 * MODEL.layers + 3  # qkv, proj, fc1, fc2, two norms; embedding, output, norm
    micro_batches = run["plan"]["grad_accum"]
    assert add["calls_per_step"] == tensors * micro_batches
    moved = GRAD_ADD_MIXED * run["params"] * micro_batches
    rate = moved / add["s_per_step"] / (get_gpu(run["catalogue_gpu"]).hbm_tbps * 1e12)
    assert rate == pytest.approx(MIXED_ADD_HBM, abs=0.01)


def test_each_stacks_accumulation_runs_at_its_mechanisms_rate():
    for name, sw in PROFILES.items():
        mixed = sw.grad_accum_bytes_per_param == GRAD_ADD_MIXED
        assert sw.grad_accum_hbm_efficiency == (MIXED_ADD_HBM if mixed else HBM_EFFICIENCY), name
