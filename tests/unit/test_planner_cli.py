"""`hybridpar plan`: the exact interface, JSON output, and bad input -> one line, exit 2."""
import json
import re

import pytest

from hybridpar.cli.main import main
from hybridpar.topology.models import PRESETS
from plan_cli import run


def test_json_output(capsys):
    code, out, _ = run(["--model", "llama3-70b", "--gpus", "64", "--top", "3", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert set(data) == {"plans", "rejected", "ranges_from"} and "published runs on h100-80gb" in data["ranges_from"]
    assert 1 <= len(data["plans"]) <= 3
    assert data["plans"][0]["tp"] * data["plans"][0]["pp"] * data["plans"][0]["cp"] * data["plans"][0]["dp"] == 64


def test_json_says_which_plans_are_tight(capsys):
    """The table's `tight` (a plan within TIGHT_MARGIN of the GPU's memory) is in the JSON too, with the
    capacity it is measured against: Llama 3 405B's best plan on 16,384 H100s is one."""
    from hybridpar.topology.hardware import get_gpu
    from hybridpar.topology.memory import TIGHT_MARGIN

    argv = ["--model", "llama3-405b", "--gpus", "16384", "--top", "5"]
    plans = json.loads(run([*argv, "--json"], capsys)[1])["plans"]
    capacity = get_gpu("h100-80gb").memory_gib
    for p in plans:
        assert p["capacity_gib"] == round(capacity, 2)
        assert p["tight"] == (p["fits"] and p["memory_gib"]["total"] > (1 - TIGHT_MARGIN) * capacity)
    assert plans[0]["tight"] and not all(p["tight"] for p in plans)
    table = run(argv, capsys)[1]
    rows = [line for line in table.splitlines() if re.match(r"^ *\d+ +\d+ +\d+", line)][:len(plans)]
    assert [row.rstrip().endswith("tight") for row in rows] == [p["tight"] for p in plans]
    assert f"of {capacity:.1f}  (tight" in table


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
    (["--validate", "--gpus", "8", "--software", "megatron-core"], "--gpus would be ignored"),
    (["--validate", "--gpu", "h800"], "no published run with a throughput on h800-80gb; there are runs on"),
    (["--validate", "--gpu", "my-h100.yaml"], "takes a catalogue GPU name, not the file my-h100.yaml"),
    (["--validate", "--software", "hybridpar"], "costed with hybridpar; there are runs costed with"),
    (["--validate", "--gpu", "a100-40gb", "--software", "megatron-core"], "runs on it costed with pytorch-fsdp"),
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


def _pinned_run_argv(case: dict, software: str, tmp_path) -> list[str]:
    """`hybridpar plan` arguments that pin a validation run's model (written to a file), layout and batch."""
    model = tmp_path / f"{case['id']}.json"
    model.write_text(json.dumps({k: case[k] for k in ("layers", "hidden", "ffn_hidden", "heads", "kv_heads",
                                                       "vocab", "mlp", "tied_embeddings")} | {"name": case["id"]}))
    argv = ["--model", str(model), "--gpus", str(case["num_gpus"]), "--gpu", "a100-80gb", "--seq-len", "2048",
            "--global-batch", str(case["global_batch_seqs"]), "--software", software, "--precision", case["precision"],
            "--json"]
    for flag in ("tp", "pp", "cp", "dp", "micro_batch", "vpp", "zero_stage", "recompute"):
        argv += [f"--{flag.replace('_stage', '').replace('_', '-')}", str(case[flag])]
    return argv


def test_nemo_megatrons_2022_runs_evaluate_from_the_command_line(capsys, tmp_path):
    """Each NeMo Megatron 2022 run (validation_runs.json, bignlp2208-*) pinned on the command line under
    --software nemo-megatron-2022, or nemo-megatron-2022-o1 for the autocast (O1) runs (bf16 and fp16), with
    --no-sequence-parallel where its recipe had sequence parallelism off, gives exactly the step time the validation
    costs it at."""
    from hybridpar.topology.cases import VALIDATION_PATH, load_cases, predict_case

    runs = [c for c in load_cases(VALIDATION_PATH) if c["id"].startswith("bignlp2208-")]
    assert len(runs) == 36 and sum(c["software"] == "nemo-megatron-2022-o1" for c in runs) == 16
    assert sum(c["precision"] == "fp16" for c in runs) == 6
    for case in runs:
        argv = _pinned_run_argv(case, case["software"], tmp_path)
        if not case["sequence_parallel"]:
            argv.append("--no-sequence-parallel")
        code, out, err = run(argv, capsys)
        assert code == 0, err
        (plan,) = json.loads(out)["plans"]
        assert plan["step_time_s"] == pytest.approx(predict_case(case).cost.step_time_s, rel=1e-4, abs=5e-5), case["id"]  # 4 places


def test_flashattentions_own_training_runs_evaluate_from_the_command_line(capsys, tmp_path):
    """Each run of FlashAttention's GPT training README (validation_runs.json, flashattn2211-*) pinned on the command
    line under --software flash-attn-training-2022 gives exactly the step time the validation costs it at; the
    profile is data-parallel only, and a pinned TP is refused in one line."""
    from hybridpar.topology.cases import VALIDATION_PATH, load_cases, predict_case

    runs = [c for c in load_cases(VALIDATION_PATH) if c["id"].startswith("flashattn2211-")]
    assert len(runs) == 5
    for case in runs:
        code, out, err = run(_pinned_run_argv(case, "flash-attn-training-2022", tmp_path), capsys)
        assert code == 0, err
        (plan,) = json.loads(out)["plans"]
        assert plan["step_time_s"] == pytest.approx(predict_case(case).cost.step_time_s, rel=1e-4, abs=5e-5), case["id"]
    code, out, err = run(["--model", "llama3-8b", "--gpus", "8", "--software", "flash-attn-training-2022", "--tp", "2"],
                         capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "whole replica" in err, err
    assert "pin --tp 1" in err


def test_no_sequence_parallel_and_tp_comm_overlap_refuse_each_other(capsys):
    code, out, err = run(["--model", "llama3-8b", "--gpus", "8", "--software", "megatron-core", "--tp-comm-overlap",
                          "--no-sequence-parallel"], capsys)
    assert code == 2 and out == "" and "cannot go with --no-sequence-parallel" in err and len(err.splitlines()) == 1


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
