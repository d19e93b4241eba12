"""`hybridpar plan`: the exact interface, JSON output, and bad input -> one line, exit 2."""
import json
import re
from pathlib import Path

import pytest

from hybridpar.cli.main import main
from hybridpar.topology.models import PRESETS

REPO = Path(__file__).resolve().parents[2]


def run(argv, capsys):
    code = main(["plan", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_output(capsys):
    code, out, _ = run(["--model", "llama3-70b", "--gpus", "64", "--top", "3", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert set(data) == {"plans", "rejected", "ranges_from"} and "published runs on h100-80gb" in data["ranges_from"]
    assert 1 <= len(data["plans"]) <= 3
    assert data["plans"][0]["tp"] * data["plans"][0]["pp"] * data["plans"][0]["cp"] * data["plans"][0]["dp"] == 64


def test_software_flag_plans_for_megatron_core(capsys):
    """--software megatron-core plans with that stack's profile (fp32 gradient reduce-scatter and
    weight all-gather, both overlapped; classic ZeRO-2; gradient accumulation fused into the GEMMs):
    its rank order puts DP inside PP (Megatron's tp-cp-dp-pp), so at TP4 two members of a DP x CP
    group share a node and its ring leaves the node over two NICs: its best layout is TP4 CP4 PP16
    DP64, where hybridpar (DP outermost) prefers TP8; Meta's TP8 PP16 DP128 fits there with classic
    ZeRO-2 and no recomputation, each micro-batch's fp32 reduce-scatter largely exposed, and is still
    faster than ZeRO-1, which needs full recomputation (docs/planner.md, worked example)."""
    from hybridpar.topology.models import load_model
    from hybridpar.topology.search import Request, search
    from hybridpar.topology.software import MEGATRON_CORE

    argv = ["--model", "llama3-405b", "--gpus", "16384", "--top", "1", "--json"]
    mine = json.loads(run(argv, capsys)[1])["plans"][0]
    core = json.loads(run([*argv, "--software", "megatron-core"], capsys)[1])["plans"][0]
    want = search(Request(load_model("llama3-405b"), 16384, 2048, software=MEGATRON_CORE), top=1).plans[0]
    assert core["step_time_s"] == pytest.approx(want.cost.step_time_s, abs=1e-4)
    assert core["step_time_s"] < 0.95 * mine["step_time_s"]
    assert (core["tp"], core["cp"], core["pp"], core["dp"]) == (4, 4, 16, 64)
    assert (mine["tp"], mine["cp"], mine["pp"], mine["dp"]) == (8, 2, 16, 64)
    meta_argv = [*argv, "--software", "megatron-core", "--tp", "8", "--pp", "16", "--cp", "1"]
    # Meta's layout: ZeRO-2 fits without recomputation, but its 16 fp32 reduce-scatters per step (one per
    # micro-batch), mostly exposed and holding NCCL's SMs while hidden, cost more than ZeRO-1's one
    # reduction plus full recomputation
    z2 = json.loads(run([*meta_argv, "--zero", "2"], capsys)[1])["plans"][0]
    assert z2["fits"] and z2["recompute"] == "none"
    assert z2["comm_s"]["dp"] > 0.25 * z2["step_time_s"] and z2["step_time_s"] > core["step_time_s"]
    meta = json.loads(run(meta_argv, capsys)[1])["plans"][0]
    assert meta["fits"] and meta["zero_stage"] == 1 and meta["recompute"] == "full"
    assert meta["step_time_s"] < z2["step_time_s"] and z2["comm_s"]["dp"] > 5 * meta["comm_s"]["dp"]
    with pytest.raises(SystemExit) as stop:
        run([*argv, "--software", "deepspeed"], capsys)
    assert stop.value.code == 2 and "--software" in capsys.readouterr().err


def test_human_table_shows_memory_time_and_rejections(capsys):
    code, out, _ = run(["--model", "llama3-8b", "--gpus", "16", "--gpus-per-node", "4", "--seq-len", "4096",
                        "--global-batch", "48"], capsys)
    assert code == 0
    for text in ("Memory per GPU", "Time per step", "Rejected layout families", "beyond a node", "MFU"):
        assert text in out


def test_every_axis_pinned_reports_fits_false(capsys):
    code, out, _ = run(["--model", "llama3-405b", "--gpus", "128", "--tp", "8", "--pp", "1", "--cp", "1",
                        "--dp", "16", "--micro-batch", "1", "--vpp", "1", "--zero", "0", "--recompute", "none",
                        "--global-batch", "64", "--json"], capsys)
    assert code == 0
    (plan,) = json.loads(out)["plans"]
    assert plan["fits"] is False


BAD = [
    (["--model", "nope", "--gpus", "8"], "unknown model"),
    (["--model", "llama3-8b", "--gpus", "8", "--gpu", "tpu-v9"], "unknown GPU"),
    (["--model", "llama3-8b", "--gpus", "12"], "not a multiple of --gpus-per-node"),
    (["--model", "llama3-8b", "--gpus", "0"], "positive"),
    (["--model", "llama3-8b", "--gpus", "-8"], "positive"),
    (["--model", "llama3-8b", "--gpus", "8", "--gpus-per-node", "0"], "--gpus-per-node must be a positive"),
    (["--model", "llama3-8b", "--gpus", "8", "--tp", "3"], "does not divide"),
    (["--model", "llama3-8b", "--gpus", "16", "--tp", "4", "--pp", "2", "--cp", "1", "--dp", "4"], "but --gpus is 16"),
    (["--model", "gpt3-175b", "--gpus", "40", "--tp", "8", "--pp", "5", "--cp", "1", "--dp", "1",
      "--micro-batch", "1", "--vpp", "1", "--zero", "1", "--recompute", "full"], "not divisible by pp"),
    (["--model", "llama3-8b", "--gpus", "8", "--tp", "16"], "does not divide"),
    (["--model", "llama3-8b", "--gpus", "64", "--gpus-per-node", "4", "--tp", "8", "--pp", "1", "--cp", "1",
      "--dp", "8", "--micro-batch", "1", "--vpp", "1", "--zero", "1", "--recompute", "none"], "beyond a node"),
    (["--model", "llama3-8b", "--gpus", "8", "--global-batch", "8", "--global-batch-tokens", "65536"], "not allowed with"),
    (["--model", "llama3-8b", "--gpus", "8", "--global-batch-tokens", "1000"], "not a multiple of --seq-len"),
    (["--model", "llama3-8b", "--gpus", "8", "--zero", "4"], "--zero"),
    (["--model", "llama3-8b", "--gpus", "8", "--gpu", "a100-80gb", "--precision", "fp8"], "fp8"),
    (["--model", "llama3-8b", "--gpus", "8", "--gpu", "h100", "--precision", "fp8"], "no fp8 training"),
    (["--model", "llama3-8b", "--gpus", "8", "--fp8-params"], "needs --precision fp8"),
    (["--model", "llama3-405b", "--gpus", "8"], "no feasible plan"),
    (["--validate", "--gpus", "8", "--software", "megatron-core"], "--gpus, --software would be ignored"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[m for _, m in BAD])
def test_bad_input_is_one_line_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        code = main(["plan", *argv])
        raise SystemExit(code)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("content, suffix, message", [
    ("{not json", ".json", "malformed"),
    ('{"layers": 2, "hidden": 64}', ".json", "missing model key"),
    ("layers: [1, 2\n", ".yaml", "malformed"),
    ('{"layers": 2, "layers": 3}', ".json", "has the key 'layers' twice"),
    ("layers: 2\nhidden: 64\nlayers: 3\n", ".yaml", "has the key 'layers' twice (line 3)"),
    ('{"layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 4, "vocab": 10, "mlp": "swiglu", '
     '"rope_theta": NaN}', ".json", "rope_theta must be a positive number, got nan"),
    ('{"layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 3, "vocab": 10, "mlp": "swiglu"}',
     ".json", "not divisible by kv_heads"),
])
def test_malformed_model_file(tmp_path, content, suffix, message, capsys):
    path = tmp_path / f"model{suffix}"
    path.write_text(content)
    code = main(["plan", "--model", str(path), "--gpus", "8"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_model_file_yaml(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text("layers: 4\nhidden: 1024\nffn_hidden: 2816\nheads: 8\nkv_heads: 8\nvocab: 32000\nmlp: swiglu\n")
    code = main(["plan", "--model", str(path), "--gpus", "8", "--seq-len", "2048", "--global-batch", "16", "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["plans"]


def test_yaml_merge_keys_may_be_overridden_but_a_key_never_given_twice():
    """A key given twice is refused (PyYAML keeps the later silently); a key that overrides one merged in
    with `<<: *anchor` is YAML's own override, kept."""
    from hybridpar.topology.spec_files import DuplicateKey, _load_yaml

    text = "base: &b {layers: 4, hidden: 1024}\nmodel:\n  <<: *b\n  layers: 8\n"
    assert _load_yaml(text)["model"] == {"layers": 8, "hidden": 1024}
    with pytest.raises(DuplicateKey):
        _load_yaml(text + "  layers: 16\n")


def test_published_layouts_evaluate_from_the_command_line_with_their_software(capsys, tmp_path):
    """A user can ask the CLI what a published pre-2022 layout does on the stack it ran on: the
    Narayanan et al. 2021 runs under --software megatron-lm-2021 (no sequence parallelism, no
    ZeRO; megatron-lm-2021-torch-ddp for the four run with torch DDP) and BLOOM under --software
    deepspeed-pipe-bf16 with the network NCCL reached on Jean Zay (cases.JEAN_ZAY_NETWORK_GBPS) and
    --cuda-launch-blocking, as BigScience ran, give exactly what
    tests/unit/test_planner_cases.py checks against the reported throughput."""
    from hybridpar.topology.cases import CASES_PATH, JEAN_ZAY_NETWORK_GBPS, case_software, load_cases, predict_case

    if not CASES_PATH.is_file():
        pytest.skip("no published cases file")
    cases = [c for c in load_cases() if not c["id"].startswith("llama3")]
    assert len(cases) == 11
    for case in cases:
        chosen = predict_case(case).plan
        model = tmp_path / f"{case['id']}.json"
        model.write_text(json.dumps({k: case[k] for k in ("layers", "hidden", "ffn_hidden", "heads", "kv_heads",
                                                           "vocab", "mlp")} | {"name": case["id"], "tied_embeddings": True}))
        bloom = case["id"].startswith("bloom")
        argv = ["--model", str(model), "--gpus", str(case["num_gpus"]), "--gpu", "a100-80gb",
                "--seq-len", str(case["seq_len"]), "--global-batch", str(case["global_batch_seqs"]),
                "--precision", "bf16" if bloom else "fp16", "--json",
                "--software", case_software(case)[0].name]
        for flag, value in [("tp", chosen.tp), ("pp", chosen.pp), ("cp", chosen.cp), ("dp", chosen.dp),
                            ("micro-batch", chosen.micro_batch), ("vpp", chosen.vpp), ("zero", chosen.zero_stage),
                            ("recompute", chosen.recompute)]:
            argv += [f"--{flag}", str(value)]
        if bloom:
            argv += ["--network-gbit", str(JEAN_ZAY_NETWORK_GBPS * 8), "--cuda-launch-blocking"]
        code, out, err = run(argv, capsys)
        assert code == 0, err
        plan = json.loads(out)["plans"][0]
        want = predict_case(case).cost
        assert plan["mfu"] == pytest.approx(want.mfu, abs=5e-5), case["id"]  # the JSON rounds to 4 places
        assert plan["step_time_s"] == pytest.approx(want.step_time_s, rel=1e-4), case["id"]
        if bloom:  # docs/planner.md: unpinned, the planner prefers TP8 PP12 DP4 without recomputation
            free = [a for a in argv if a not in ("--json",)]
            for flag in ("--tp", "--pp", "--cp", "--dp", "--micro-batch", "--vpp", "--zero", "--recompute"):
                i = free.index(flag)
                del free[i:i + 2]
            best = json.loads(run([*free, "--json", "--top", "1"], capsys)[1])["plans"][0]
            assert (best["tp"], best["pp"], best["dp"], best["micro_batch"], best["recompute"]) == (8, 12, 4, 1, "none")
            # half the parameters per GPU, but each node holds one member of each DP ring, not two
            assert best["step_time_s"] < 0.95 * plan["step_time_s"] and best["comm_s"]["dp"] < plan["comm_s"]["dp"]


def test_older_stacks_plan_without_what_they_lacked(capsys):
    """Megatron-LM 2021 has neither ZeRO, sequence parallelism, selective recomputation nor context
    parallelism; DeepSpeed's pipeline engine (over those layers) runs ZeRO 0-1 in bf16 only and 1F1B
    without virtual stages: the search keeps to that, and pins outside it are refused in one line."""
    argv = ["--model", "gpt3-175b", "--gpus", "1024", "--gpu", "a100-80gb", "--seq-len", "2048",
            "--global-batch", "1536", "--json", "--top", "50"]
    code, out, _ = run([*argv, "--software", "megatron-lm-2021"], capsys)
    plans = json.loads(out)["plans"]
    assert code == 0 and plans and all(p["zero_stage"] == 0 and p["recompute"] != "selective" for p in plans)
    mine = json.loads(run(argv, capsys)[1])["plans"]
    assert mine[0]["mfu"] > plans[0]["mfu"]  # FlashAttention, SP and overlap against the 2021 stack
    assert all(p["cp"] == 1 for p in plans)  # context parallelism came with megatron-core
    code, out, _ = run([*argv, "--software", "deepspeed-pipe-bf16"], capsys)
    ds = json.loads(out)["plans"]
    assert code == 0 and {p["zero_stage"] for p in ds} <= {0, 1} and {(p["vpp"], p["cp"]) for p in ds} == {(1, 1)}
    for bad, words in [(["--software", "megatron-lm-2021", "--zero", "1"], "ZeRO-1 is not part of Megatron-LM 2021"),
                       (["--software", "megatron-lm-2021", "--cp", "2"], "cp 2 is not part of Megatron-LM 2021"),
                       (["--software", "deepspeed-pipe-bf16", "--vpp", "2"], "runs 1F1B without virtual stages"),
                       (["--software", "deepspeed-pipe-bf16", "--recompute", "selective"], "recompute selective is not part"),
                       (["--software", "deepspeed-pipe-bf16", "--precision", "fp16"], "use --precision bf16"),
                       (["--network-gbit", "0"], "--network-gbit must be a positive"),
                       (["--network-gbit", "inf"], "--network-gbit must be a positive")]:
        code, out, err = run([*argv, *bad], capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


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


@pytest.mark.parametrize("content, message", [
    ("base: h100-80gb\ngemm_fraction: 1.5\n", "gemm_fraction must be a fraction of the dense peak in (0, 1]"),
    ("base: h100-80gb\nattention_fraction: 0\n", "attention_fraction must be a fraction"),
    ("base: h100-80gb\nsms: 13.5\n", "sms must be a positive integer"),
    ("base: h100-80gb\ngpus_per_node: .inf\n", "gpus_per_node must be a positive integer"),
    ("base: h100-80gb\nnetwork_gbps: .nan\n", "network_gbps must be a positive number"),
    ("base: h100-80gb\nmemory_gib: true\n", "memory_gib must be a positive number"),
    ("base: h100-80gb\nhbm_tbps: .inf\n", "hbm_tbps must be a positive number"),
    ("base: h100-80gb\nclock_mhz: 1980\n", "unknown GPU key(s) clock_mhz"),
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
    layout takes 7.33 s; on 16,384 B200s it plans TP8 CP2 PP32 VPP4 DP32 at 3.26 s."""
    path = tmp_path / "my-h100.yaml"
    path.write_text("base: h100-80gb\ngemm_fraction: 0.68\n")
    argv = ["--model", "llama3-405b", "--gpus", "16384", "--top", "1", "--json"]
    layout = lambda p: (p["tp"], p["cp"], p["pp"], p["vpp"], p["dp"])
    (catalogue,) = json.loads(run(argv, capsys)[1])["plans"]
    (measured,) = json.loads(run([*argv, "--gpu", str(path)], capsys)[1])["plans"]
    (b200,) = json.loads(run([*argv, "--gpu", "b200-180gb"], capsys)[1])["plans"]
    assert layout(catalogue) == (8, 2, 16, 8, 64) and layout(measured) == (8, 2, 16, 8, 64)
    assert round(catalogue["step_time_s"], 2) == 6.62 and round(measured["step_time_s"], 2) == 7.33
    assert layout(b200) == (8, 2, 32, 4, 32) and round(b200["step_time_s"], 2) == 3.26
    # the README quotes the first plan with the ranges of today's validation spread
    (lo, hi), (mlo, mhi) = catalogue["step_time_s_range"], catalogue["mfu_range"]
    quoted = f"6.62 s ({lo:.2f}-{hi:.2f} s), {catalogue['mfu']:.0%} MFU ({mlo * 100:.0f}-{mhi * 100:.0f}%)"
    assert quoted in (REPO / "README.md").read_text(), quoted


def test_every_plan_carries_ranges_and_its_validated_region(capsys):
    """Issue 15 §4: MFU and step time with the validation spread around them (lo <= value <= hi),
    in the JSON and in the table; a plan on hardware no published run used says so in one line."""
    argv = ["--model", "llama3-405b", "--gpus", "16384", "--top", "2"]
    plans = json.loads(run([*argv, "--json"], capsys)[1])["plans"]
    for p in plans:
        lo, hi = p["mfu_range"]
        slo, shi = p["step_time_s_range"]
        assert lo <= p["mfu"] <= hi and lo < hi and slo <= p["step_time_s"] <= shi and slo < shi
        assert p["validated_region"] is None
    table = run(argv, capsys)[1]
    first = plans[0]
    assert f"{first['mfu']:.0%} ({first['mfu_range'][0] * 100:.0f}-{first['mfu_range'][1]:.0%})" in table
    assert "10th-90th percentile of reported/predicted" in table and "outside the validated region" not in table
    # Each step time and its ends in three significant figures, trailing zeros kept: 0.448 (0.408-0.500).
    small = run(["--model", "llama3-8b", "--gpus", "8", "--global-batch", "3", "--top", "5"], capsys)[1]
    steps = re.findall(r"(\d+\.?\d*) \((\d+\.?\d*)-(\d+\.?\d*)\)", small)
    assert steps and all(len(x.replace(".", "").lstrip("0")) == 3 for row in steps for x in row), steps
    h200 = run(["--model", "llama3-405b", "--gpus", "16384", "--gpu", "h200", "--top", "1"], capsys)[1]
    notes = [line for line in h200.splitlines() if line.startswith("outside the validated region")]
    assert len(notes) == 1 and "h200-141gb" in notes[0]


def test_a_plans_range_is_its_gpus_own_spread(capsys):
    """A100 and H100 runs lean differently; a plan takes the spread of its own GPU's runs, a GPU
    with too few (B200) the spread of all, and a software profile with enough runs on the GPU theirs."""
    from hybridpar.topology import validation
    argv = ["--model", "llama3-70b", "--gpus", "512", "--top", "1", "--json"]
    for gpu in ("a100-80gb", "h100-80gb", "b200-180gb"):
        (p,) = json.loads(run([*argv, "--gpu", gpu], capsys)[1])["plans"]
        lo, hi = validation.ratio_range(gpu)
        assert p["mfu_range"] == pytest.approx([p["mfu"] * min(lo, 1.0), p["mfu"] * max(hi, 1.0)], abs=2e-4)
    assert validation.ratio_range("a100-80gb") != validation.ratio_range("h100-80gb")
    # a stack with enough runs of its own on that GPU: their spread, and the table says whose
    ds = ["--gpu", "a100-80gb", "--software", "deepspeed-pipe-zero1"]
    (p,) = json.loads(run([*argv, *ds], capsys)[1])["plans"]
    lo, hi = validation.ratio_range("a100-80gb", "deepspeed-pipe-zero1")
    assert p["mfu_range"] == pytest.approx([p["mfu"] * min(lo, 1.0), p["mfu"] * max(hi, 1.0)], abs=2e-4)
    assert "costed with deepspeed-pipe-zero1" in run([*argv[:-1], *ds], capsys)[1]


def test_validate_prints_every_published_run_and_the_summary(capsys):
    from hybridpar.topology.validation import checks, summary

    code, out, _ = run(["--validate"], capsys)
    assert code == 0
    for r in checks():
        assert r.id in out
    s = summary()
    assert f"median |error| {s.median_abs_error:.1%}, signed bias (median error) {s.signed_bias:+.1%}" in out
    assert "OOM predicted" in out and "Spearman" in out
    data = json.loads(run(["--validate", "--json"], capsys)[1])
    assert len(data["runs"]) == len(checks()) and data["signed_bias"] == round(s.signed_bias, 4)
    for gpu, (n, _, bias) in s.by_gpu.items():
        assert f"{gpu} {n} runs" in out and data["by_gpu"][gpu] == {
            "timed": n, "median_abs_error": round(s.by_gpu[gpu][1], 4), "signed_bias": round(bias, 4)}
    assert set(data["reported_over_predicted_range_by_gpu"]) == set(s.gpu_ranges) and s.gpu_ranges
    assert set(data["reported_over_predicted_range_by_gpu_and_software"]) == {f"{g}/{sw}" for g, sw in s.profile_ranges}
    fp8 = [r for r in checks() if r.precision == "fp8" and r.error is not None]
    assert fp8 and data["by_precision"]["fp8"]["timed"] == len(fp8) == s.by_precision["fp8"][0]
    assert f"by precision: bf16 {s.by_precision['bf16'][0]} runs" in out


def test_the_docs_carry_the_current_validation_table(capsys):
    """docs/planner.md shows `hybridpar plan --validate` as it prints today."""
    doc = (REPO / "docs" / "planner.md").read_text()
    out = run(["--validate"], capsys)[1]
    assert out.strip() in doc, "re-run `hybridpar plan --validate` and paste its output into docs/planner.md"


def test_plan_needs_a_model_and_gpus_unless_validating(capsys):
    for argv, words in ((["--gpus", "8"], "give --model"), (["--model", "llama3-8b"], "--gpus N is required")):
        code, _, err = run(argv, capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1


def test_headroom_leaves_that_share_of_memory_free(capsys):
    """--headroom 10: every plan shown needs at most 90% of the GPU's memory; the layouts that fit
    only without it (Llama 3 8B on one node at micro-batch 1 with TP1 PP2, 78.5 of 79.6 GiB) are gone."""
    from hybridpar.topology.hardware import get_gpu

    capacity = get_gpu("h100-80gb").memory_gib
    argv = ["--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--top", "30"]
    free = json.loads(run(argv + ["--json"], capsys)[1])
    kept = json.loads(run(argv + ["--headroom", "10", "--json"], capsys)[1])
    assert max(p["memory_gib"]["total"] for p in free["plans"]) > 0.9 * capacity  # the case exists without it
    assert all(p["memory_gib"]["total"] <= 0.9 * capacity for p in kept["plans"]), kept["plans"]
    assert kept["plans"] and kept["plans"][0]["step_time_s"] >= free["plans"][0]["step_time_s"]


def test_cross_entropy_flag_costs_the_loss_kernel_it_names(tmp_path, capsys):
    """--cross-entropy fused-16bit: the same pinned layout costs what step_cost and plan_memory give under the
    software with that loss, faster and smaller than megatron's fp32 loss (MPT-1B's shape, 50,368 logits)."""
    from dataclasses import replace

    from hybridpar.topology.cost import step_cost
    from hybridpar.topology.memory import plan_memory
    from hybridpar.topology.models import ModelSpec
    from hybridpar.topology.plan import Plan
    from hybridpar.topology.software import MEGATRON_CORE

    m = ModelSpec(24, 2048, 8192, 16, 16, 50368, "gelu", "mpt-1b", tied_embeddings=True)
    model = tmp_path / "mpt-1b.json"
    model.write_text(json.dumps({"layers": 24, "hidden": 2048, "ffn_hidden": 8192, "heads": 16, "kv_heads": 16,
                                 "vocab": 50368, "mlp": "gelu", "name": "mpt-1b", "tied_embeddings": True}))
    argv = ["--model", str(model), "--gpus", "8", "--gpu", "a100-40gb", "--seq-len", "2048", "--global-batch", "64",
            "--tp", "1", "--pp", "1", "--cp", "1", "--dp", "8", "--micro-batch", "8", "--vpp", "1", "--zero", "3",
            "--recompute", "none", "--software", "megatron-core", "--json"]
    fp32 = json.loads(run(argv, capsys)[1])["plans"][0]
    fused = json.loads(run([*argv, "--cross-entropy", "fused-16bit"], capsys)[1])["plans"][0]
    plan = Plan(m, 2048, 64, tp=1, cp=1, pp=1, dp=8, vpp=1, micro_batch=8, zero_stage=3, recompute="none",
                sequence_parallel=False, gpu="a100-40gb")
    sw = replace(MEGATRON_CORE, cross_entropy="fused-16bit")
    assert fused["step_time_s"] == pytest.approx(step_cost(plan, sw).step_time_s, rel=1e-4)
    assert fused["memory_gib"]["logits"] == pytest.approx(plan_memory(plan, sw).logits / 2**30, abs=0.01)
    assert fused["step_time_s"] < fp32["step_time_s"]
    # 8 x 2,048 tokens x 50,368 logits x 2 bytes fewer at the peak
    assert fp32["memory_gib"]["logits"] - fused["memory_gib"]["logits"] == pytest.approx(8 * 2048 * 50368 * 2 / 2**30,
                                                                                         abs=0.02)


def test_tp_comm_overlap_flag_costs_the_plan_with_userbuffers(capsys):
    """--tp-comm-overlap: the same pinned layout (Llama 3 70B, TP4 PP4 CP2 as NeMo's recipe) costs what step_cost
    gives under megatron-core with userbuffers, less exposed TP time than without, the same compute and memory."""
    from dataclasses import replace

    from hybridpar.topology.cost import step_cost
    from hybridpar.topology.plan import Plan
    from hybridpar.topology.software import MEGATRON_CORE

    argv = ["--model", "llama3-70b", "--gpus", "64", "--global-batch", "128", "--tp", "4", "--pp", "4", "--cp", "2",
            "--dp", "2", "--vpp", "5", "--micro-batch", "1", "--zero", "1", "--recompute", "none",
            "--software", "megatron-core", "--json"]
    plain = json.loads(run(argv, capsys)[1])["plans"][0]
    over = json.loads(run([*argv, "--tp-comm-overlap"], capsys)[1])["plans"][0]
    plan = Plan(PRESETS["llama3-70b"], 8192, 128, tp=4, cp=2, pp=4, dp=2, vpp=5, micro_batch=1, zero_stage=1,
                recompute="none", sequence_parallel=True)
    assert over["step_time_s"] == pytest.approx(step_cost(plan, replace(MEGATRON_CORE, tp_comm_overlap=True)).step_time_s,
                                                rel=1e-4)
    assert over["step_time_s"] < plain["step_time_s"] and over["memory_gib"] == plain["memory_gib"]


def test_attention_kernel_flag_costs_the_plan_with_that_kernel(capsys):
    """--attention-kernel triton plans for FlashAttention in Triton: the same pinned layout costs what
    step_cost gives under the software with that kernel, longer than with FlashAttention-2."""
    from dataclasses import replace

    from hybridpar.topology.cost import step_cost
    from hybridpar.topology.plan import Plan
    from hybridpar.topology.software import MEGATRON_CORE

    argv = ["--model", "llama3-8b", "--gpus", "8", "--gpu", "a100-80gb", "--seq-len", "4096", "--global-batch", "64",
            "--tp", "1", "--pp", "1", "--cp", "1", "--dp", "8", "--micro-batch", "2", "--vpp", "1", "--zero", "3",
            "--recompute", "full", "--software", "megatron-core", "--json"]
    flash2 = json.loads(run(argv, capsys)[1])["plans"][0]
    triton = json.loads(run([*argv, "--attention-kernel", "triton"], capsys)[1])["plans"][0]
    assert triton["step_time_s"] > flash2["step_time_s"] * 1.03
    want = step_cost(Plan(PRESETS["llama3-8b"], 4096, 64, tp=1, cp=1, pp=1, dp=8, vpp=1, micro_batch=2, zero_stage=3,
                          recompute="full", sequence_parallel=False, gpu="a100-80gb"),
                     replace(MEGATRON_CORE, attention_kernel="triton"))
    assert triton["step_time_s"] == pytest.approx(want.step_time_s, rel=1e-4)


def test_torchtitan_2024_splits_a_replica_by_tp_only(capsys):
    """torchtitan of April 2024 had FSDP and TP, no pipeline or context parallelism: the search keeps PP and CP at 1,
    and a pinned PP is refused in one line, before anything is costed."""
    argv = ["--model", "llama3-70b", "--gpus", "512", "--software", "torchtitan-2024", "--top", "30", "--json"]
    plans = json.loads(run(argv, capsys)[1])["plans"]
    assert plans and all(p["pp"] == 1 and p["cp"] == 1 for p in plans)
    assert {p["recompute"] for p in plans} <= {"none", "every-other-block", "op-selective", "full"}
    code, _, err = run(["--model", "llama3-70b", "--gpus", "512", "--software", "torchtitan-2024", "--pp", "4"], capsys)
    assert code == 2 and "pp 4 is not part of torchtitan 2024" in err and len(err.strip().splitlines()) == 1
