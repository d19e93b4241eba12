"""benchmarks/_kernel_profile.py: a profiled step's kernels summed by kind (the GPU run of `hybridpar bench gpu
--profile` needs CUDA; the sorting and sums are checked here on names and intervals as the profiler gives them)."""
import pytest

from hybridpar.benchmarks._kernel_profile import busy_seconds, kind_of, summarise


@pytest.mark.parametrize("name, kind", [
    ("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_TNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1_cga1x1x1_kernel0_0",
     "attention"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128>>", "attention"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "collective"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<TensorListMetadata<4>>", "optimizer"),
    ("Memcpy DtoD (Device -> Device)", "copy"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", "elementwise"),
])
def test_kernels_are_sorted_by_kind(name, kind):
    assert kind_of(name) == kind


def test_busy_time_counts_overlapping_kernels_once():
    """Two streams' kernels overlapping for 1 s and a gap of 2 s: 5 s of wall, 3 busy."""
    assert busy_seconds([(0.0, 2.0), (1.0, 3.0), (5.0, 5.0 + 1e-9), (4.0, 4.0)]) == pytest.approx(3.0 + 1e-9)
    assert busy_seconds([]) == 0.0


def test_a_summary_is_per_step_by_kind_with_the_idle_time():
    kernels = [("nvjet_gemm", 0.0, 0.4), ("flash_fwd", 0.4, 0.5), ("add_kernel", 0.5, 0.6),
               ("nvjet_gemm", 1.0, 1.4), ("flash_fwd", 1.4, 1.5), ("add_kernel", 1.5, 1.6)]
    s = summarise(kernels, wall_s=2.0, steps=2)
    assert s["step_s"] == 1.0 and s["gpu_busy_s"] == pytest.approx(0.6) and s["gpu_idle_s"] == pytest.approx(0.4)
    assert s["by_kind_s"] == pytest.approx({"gemm": 0.4, "attention": 0.1, "elementwise": 0.1})
    assert list(s["by_kind_s"]) == ["gemm", "attention", "elementwise"]
    assert s["top_kernels"][0] == {"name": "nvjet_gemm", "kind": "gemm", "s_per_step": pytest.approx(0.4),
                                   "calls_per_step": 1.0}
