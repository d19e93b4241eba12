"""Gradient accumulation outside the GEMMs (topology/software/profile.py grad_accum_bytes_per_param and
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
    operand as it loads it) ran 8 times per parameter tensor a step of 8 micro-batches: 8 gradient adds of 10 bytes
    per parameter, or 7 (the first micro-batch's gradient is cast, not added) and the step's fp32 partition sum
    (12 bytes). The planner's rate is the lower of the two within 0.01."""
    run = json.loads(H200_GPU_RUN.read_text())
    add, = [k for k in run["profile"]["top_kernels"]
            if "unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>" in k["name"]]
    tensors = 4 * MODEL.layers + 2 * MODEL.layers + 3  # qkv, proj, fc1, fc2, two norms; embedding, output, norm
    micro_batches = run["plan"]["grad_accum"]
    assert add["calls_per_step"] == tensors * micro_batches
    hbm = get_gpu(run["catalogue_gpu"]).hbm_tbps * 1e12
    rate = lambda per_param: per_param * run["params"] / add["s_per_step"] / hbm
    all_adds, seven_and_the_step = rate(GRAD_ADD_MIXED * micro_batches), rate(GRAD_ADD_MIXED * (micro_batches - 1) + 12)
    assert all_adds < seven_and_the_step < all_adds + 0.03
    assert MIXED_ADD_HBM == pytest.approx(all_adds, abs=0.01)


def test_each_stacks_accumulation_runs_at_its_mechanisms_rate():
    for name, sw in PROFILES.items():
        mixed = sw.grad_accum_bytes_per_param == GRAD_ADD_MIXED
        assert sw.grad_accum_hbm_efficiency == (MIXED_ADD_HBM if mixed else HBM_EFFICIENCY), name
