"""`hybridpar plan --gpu NAME|FILE`: the catalogue GPUs beyond H100, GPU files (new hardware or measured
fractions) and what a bad one answers."""
import json

import pytest

from plan_cli import REPO, run


BIG_GPU = {"name": "big-gpu", "bf16_tflops": 2250, "fp8_tflops": 4500, "memory_gib": 180, "hbm_tbps": 8.0,
           "nvlink_gbps": 900, "network_gbps": 50, "gpus_per_node": 8, "sms": 148, "gemm_fraction": 0.8,
           "attention_fraction": 0.5}


def test_gpu_file_plans_hardware_the_catalogue_lacks(tmp_path, capsys):
    """--gpu FILE: every field given, no base. Llama 3 70B has no plan on 8 H100s (its model states
    alone exceed 80 GB per GPU); on 8 GPUs of 180 GiB it has one under megatron-core, above 80 and
    within 180 GiB (hybridpar's foreach AdamW would add an 8-byte temporary per parameter at DP=1)."""
    path = tmp_path / "big.json"
    path.write_text(json.dumps(BIG_GPU))
    argv = ["--model", "llama3-70b", "--gpus", "8", "--top", "1", "--software", "megatron-core"]
    code, _, err = run([*argv, "--gpu", "h100-80gb", "--json"], capsys)
    assert code == 2 and "no feasible plan" in err
    code, out, _ = run([*argv, "--gpu", str(path), "--json"], capsys)
    (plan,) = json.loads(out)["plans"]
    assert code == 0 and plan["fits"] and 80 < plan["memory_gib"]["total"] <= 180
    assert "8 x big-gpu" in run([*argv, "--gpu", str(path)], capsys)[1]


def test_gpu_file_with_only_a_base_is_that_catalogue_gpu(tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text("base: h100-80gb\n")
    argv = ["--model", "llama3-8b", "--gpus", "64", "--top", "3", "--json"]
    assert run([*argv, "--gpu", str(path)], capsys)[1] == run([*argv, "--gpu", "h100-80gb"], capsys)[1]


def test_measured_gemm_fraction_in_a_gpu_file_slows_the_gemms(tmp_path, capsys):
    """A cluster whose GEMMs reach half the catalogue's achievable fraction (e.g. measured with
    mamf-finder): the same pinned layout, on one node so no network term, is slower, but by less
    than 2x, since attention, memory-bound kernels and the optimizer keep their speed."""
    path = tmp_path / "slow.yaml"
    path.write_text("base: h100-80gb\ngemm_fraction: 0.4005\n")
    argv = ["--model", "llama3-8b", "--gpus", "8", "--tp", "1", "--pp", "1", "--cp", "1", "--dp", "8",
            "--micro-batch", "1", "--vpp", "1", "--zero", "1", "--recompute", "none", "--json"]
    (fast,) = json.loads(run(argv, capsys)[1])["plans"]
    (slow,) = json.loads(run([*argv, "--gpu", str(path)], capsys)[1])["plans"]
    assert 1.5 < slow["step_time_s"] / fast["step_time_s"] < 2.0
    assert slow["memory_gib"] == fast["memory_gib"]


def test_a_ring_cap_in_a_gpu_file_slows_only_rings_with_several_members_on_a_node(tmp_path, capsys):
    """network_ring_gbps (a cluster whose NCCL carries a ring out of a node at no more than 75 GB/s, 1.5 of the
    catalogue H100's NICs): megatron-core's DP ring at TP2 has 4 members on each node and loses the other NICs'
    share; at TP8 (one member per node, one NIC's 50 GB/s) the cap does not bind."""
    path = tmp_path / "one-nic-per-ring.yaml"
    path.write_text("base: h100-80gb\nnetwork_ring_gbps: 75\n")

    def dp_seconds(tp, gpu):
        argv = ["--model", "llama3-8b", "--gpus", "64", "--tp", str(tp), "--pp", "1", "--cp", "1", "--dp", str(64 // tp),
                "--micro-batch", "1", "--vpp", "1", "--zero", "1", "--recompute", "none", "--global-batch", "64",
                "--software", "megatron-core", "--gpu", gpu, "--json"]
        (plan,) = json.loads(run(argv, capsys)[1])["plans"]
        return plan["comm_s"]["dp"]

    assert dp_seconds(2, str(path)) > dp_seconds(2, "h100-80gb")
    assert dp_seconds(8, str(path)) == dp_seconds(8, "h100-80gb")


@pytest.mark.parametrize("content, message", [
    ("base: h100-80gb\ngemm_fraction: 1.5\n", "gemm_fraction must be a fraction of the dense peak in (0, 1]"),
    ("base: h100-80gb\nattention_fraction: 0\n", "attention_fraction must be a fraction"),
    ("base: h100-80gb\nsms: 13.5\n", "sms must be a positive integer"),
    ("base: h100-80gb\ngpus_per_node: .inf\n", "gpus_per_node must be a positive integer"),
    ("base: h100-80gb\nnetwork_gbps: .nan\n", "network_gbps must be a positive number"),
    ("base: a100-80gb\nnetwork_ring_gbps: 0\n", "network_ring_gbps must be a positive number"),
    ("base: h100-80gb\nmemory_gib: true\n", "memory_gib must be a positive number"),
    ("base: h100-80gb\nhbm_tbps: .inf\n", "hbm_tbps must be a positive number"),
    ("base: h100-80gb\nclock_mhz: 1980\n", "unknown GPU key(s) clock_mhz"),
    ("base: b200-180gb\nattention_curve: h100-fa3\n", "attention_curve must name a measured table"),
    ("base: h100-80gb\nattention_curve: [a]\n", "attention_curve must name a measured table"),
    ("base: h100-80gb\nattention_curve: a100-pytorch\n", "attention_curve must name a measured table"),
    ("base: b200-180gb\nunfused_attention: a100-fa2\n", "unfused_attention must name a measured table of unfused"),
    ("base: b200-180gb\nunfused_attention: 1.5\n", "unfused_attention must name a measured table of unfused"),
    ("base: h100-80gb\nnvlink_collectives: {a: 1}\n", "nvlink_collectives must name a measured table"),
    ("base: x100\n", "unknown GPU 'x100'"),
    ("bf16_tflops: 2250\nmemory_gib: 180\n", "missing GPU key(s)"),
    ("- h100\n", "expected a mapping of GPU keys"),
    ("base: [h100\n", "malformed"),
])
def test_bad_gpu_file_is_one_line(tmp_path, content, message, capsys):
    path = tmp_path / "gpu.yaml"
    path.write_text(content)
    code, out, err = run(["--model", "llama3-8b", "--gpus", "8", "--gpu", str(path)], capsys)
    assert code == 2 and out == "" and message in err and len(err.strip().splitlines()) == 1, err


def test_b200_is_in_the_catalogue_and_plans_faster_than_h100(capsys):
    """b200-180gb: 2.27x H100's dense bf16 peak at a lower measured GEMM fraction (0.742 vs 0.801),
    2.4x the HBM bandwidth, twice the NVLink, the same 400 Gbit/s NICs: the same pinned Llama 3 8B
    layout on one node is faster, by less than the peak ratio."""
    argv = ["--model", "llama3-8b", "--gpus", "8", "--tp", "1", "--pp", "1", "--cp", "1", "--dp", "8",
            "--micro-batch", "1", "--vpp", "1", "--zero", "1", "--recompute", "none", "--json"]
    (h100,) = json.loads(run([*argv, "--gpu", "h100-80gb"], capsys)[1])["plans"]
    (b200,) = json.loads(run([*argv, "--gpu", "b200"], capsys)[1])["plans"]
    speedup = h100["step_time_s"] / b200["step_time_s"]
    assert 1.6 < speedup < 2250 / 989
    assert b200["mfu"] < 0.742 and b200["fits"]


def test_readme_figures_for_a_measured_h100_and_for_b200(tmp_path, capsys):
    """README ("Planning a layout"): Llama 3 405B on 16,384 H100s plans TP8 CP2 PP16 VPP8 DP64 at 6.62 s;
    with gemm_fraction 0.68 in a GPU file (a cluster whose GEMMs burst at 0.68 of the peak) the same
    layout takes 7.33 s; on 16,384 B200s it plans TP8 PP32 VPP4 DP64 at 3.33 s (no CP: cuDNN's measured attention
    on B200 runs 4K chunks at three quarters of its 8K rate)."""
    path = tmp_path / "my-h100.yaml"
    path.write_text("base: h100-80gb\ngemm_fraction: 0.68\n")
    argv = ["--model", "llama3-405b", "--gpus", "16384", "--top", "1", "--json"]
    layout = lambda p: (p["tp"], p["cp"], p["pp"], p["vpp"], p["dp"])
    (catalogue,) = json.loads(run(argv, capsys)[1])["plans"]
    (measured,) = json.loads(run([*argv, "--gpu", str(path)], capsys)[1])["plans"]
    (b200,) = json.loads(run([*argv, "--gpu", "b200-180gb"], capsys)[1])["plans"]
    assert layout(catalogue) == (8, 2, 16, 8, 64) and layout(measured) == (8, 2, 16, 8, 64)
    assert round(catalogue["step_time_s"], 2) == 6.62 and round(measured["step_time_s"], 2) == 7.33
    assert layout(b200) == (8, 1, 32, 4, 64) and round(b200["step_time_s"], 2) == 3.33
    # the README quotes the first plan with the ranges of today's validation spread
    (lo, hi), (mlo, mhi) = catalogue["step_time_s_range"], catalogue["mfu_range"]
    quoted = f"6.62 s ({lo:.2f}-{hi:.2f} s), {catalogue['mfu']:.0%} MFU ({mlo * 100:.0f}-{mhi * 100:.0f}%)"
    assert quoted in (REPO / "README.md").read_text(), quoted


def test_a_gpu_file_names_the_unfused_attention_table_it_was_measured_with(tmp_path):
    """A B200 file naming H100's unfused-attention table costs a stack without FlashAttention at that table's
    measured shortfall; the catalogue B200 has no table (its roofline), A100 and H100 theirs, and a file with
    unfused_attention: null drops the base's."""
    from hybridpar.topology.hardware import load_gpu
    from hybridpar.topology.kernels import unfused_attention_slowdown

    named, dropped = tmp_path / "named.yaml", tmp_path / "dropped.yaml"
    named.write_text("base: b200-180gb\nunfused_attention: h100-pytorch\n")
    dropped.write_text("base: a100-80gb\nunfused_attention: null\n")
    assert load_gpu("b200-180gb").unfused_attention is None
    assert (load_gpu("a100-40gb").unfused_attention, load_gpu("h200-141gb").unfused_attention) == (
        "a100-pytorch", "h100-pytorch")
    assert unfused_attention_slowdown(load_gpu(str(named)), 2048, 128) > 1.3
    assert load_gpu(str(dropped)).unfused_attention is None
    assert unfused_attention_slowdown(load_gpu(str(dropped)), 2048, 128) == 1.0
