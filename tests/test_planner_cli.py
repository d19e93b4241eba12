"""`hybridpar plan`: the exact interface, JSON output, and bad input -> one line, exit 2."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybridpar.cli import main

REPO = Path(__file__).resolve().parents[1]


def run(argv, capsys):
    code = main(["plan", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_output(capsys):
    code, out, _ = run(["--model", "llama3-70b", "--gpus", "64", "--top", "3", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert set(data) == {"plans", "rejected"}
    assert 1 <= len(data["plans"]) <= 3
    assert data["plans"][0]["tp"] * data["plans"][0]["pp"] * data["plans"][0]["cp"] * data["plans"][0]["dp"] == 64


def test_software_flag_plans_for_megatron_core(capsys):
    """--software megatron-core plans with that stack's profile (fp32 gradient reduce-scatter and
    weight all-gather, both overlapped; classic ZeRO-2; gradient accumulation fused into the GEMMs):
    its best layout is hybridpar's own (a ZeRO-1 plan, where the two runtimes move and overlap the
    same bytes), faster by the fused accumulation; Meta's TP8 PP16 DP128 needs full recomputation
    with ZeRO-1 there, and classic ZeRO-2 fits it without recomputation but exposes each
    micro-batch's fp32 reduce-scatter, so it is slower (README "Llama 3 405B")."""
    from topology.models import load_model
    from topology.search import Request, search
    from topology.software import MEGATRON_CORE

    argv = ["--model", "llama3-405b", "--gpus", "16384", "--top", "1", "--json"]
    mine = json.loads(run(argv, capsys)[1])["plans"][0]
    core = json.loads(run([*argv, "--software", "megatron-core"], capsys)[1])["plans"][0]
    want = search(Request(load_model("llama3-405b"), 16384, 2048, software=MEGATRON_CORE), top=1).plans[0]
    assert core["step_time_s"] == pytest.approx(want.cost.step_time_s, abs=1e-4)
    # Both reduce-scatter the gradients and overlap the weight gather at ZeRO-1: the same best
    # layout; megatron-core's GEMMs accumulate the fp32 gradients, hybridpar adds them in place.
    assert core["step_time_s"] < 0.95 * mine["step_time_s"]
    assert (core["tp"], core["cp"], core["pp"], core["dp"]) == (mine["tp"], mine["cp"], mine["pp"], mine["dp"])
    meta_argv = [*argv, "--software", "megatron-core", "--tp", "8", "--pp", "16", "--cp", "1"]
    meta = json.loads(run(meta_argv, capsys)[1])["plans"][0]
    assert meta["fits"] and meta["recompute"] == "full" and meta["zero_stage"] == 1
    z2 = json.loads(run([*meta_argv, "--zero", "2", "--recompute", "none"], capsys)[1])["plans"][0]
    assert z2["fits"] and z2["step_time_s"] > meta["step_time_s"] > core["step_time_s"]
    assert z2["comm_s"]["dp"] > 10 * meta["comm_s"]["dp"]  # 16 fp32 reduce-scatters, mostly exposed, vs one
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
    (["--model", "llama3-405b", "--gpus", "8"], "no feasible plan"),
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
    ('{"layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 3, "vocab": 10, "mlp": "swiglu"}',
     ".json", "not divisible by kv_heads"),
])
def test_malformed_model_file(tmp_path, content, suffix, message, capsys):
    path = tmp_path / f"model{suffix}"
    path.write_text(content)
    code = main(["plan", "--model", str(path), "--gpus", "8"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_subprocess_exit_code_and_no_traceback():
    bad = subprocess.run([sys.executable, "-m", "hybridpar", "plan", "--model", "nope.json", "--gpus", "8"],
                         cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    good = subprocess.run([sys.executable, "-m", "hybridpar", "plan", "--model", "llama3-405b", "--gpus", "16384",
                           "--json", "--top", "1"], cwd=REPO, capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["plans"][0]["fits"] is True


def test_model_file_yaml(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text("layers: 4\nhidden: 1024\nffn_hidden: 2816\nheads: 8\nkv_heads: 8\nvocab: 32000\nmlp: swiglu\n")
    code = main(["plan", "--model", str(path), "--gpus", "8", "--seq-len", "2048", "--global-batch", "16", "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["plans"]


def test_published_layouts_evaluate_from_the_command_line_with_their_software(capsys, tmp_path):
    """A user can ask the CLI what a published pre-2022 layout does on the stack it ran on: the
    Narayanan et al. 2021 runs under --software megatron-lm-2021 (no sequence parallelism, no
    ZeRO; megatron-lm-2021-torch-ddp for the four run with torch DDP) and BLOOM under --software
    deepspeed-pipe-bf16 with Jean Zay's 50 Gbit/s per GPU give exactly what
    tests/test_planner_cases.py checks against the reported throughput."""
    from topology.cases import CASES_PATH, case_software, load_cases, predict_case

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
            argv += ["--network-gbit", "50"]
        code, out, err = run(argv, capsys)
        assert code == 0, err
        plan = json.loads(out)["plans"][0]
        want = predict_case(case).cost
        assert plan["mfu"] == pytest.approx(want.mfu, abs=5e-5), case["id"]  # the JSON rounds to 4 places
        assert plan["step_time_s"] == pytest.approx(want.step_time_s, rel=1e-4), case["id"]
        if bloom:  # README: unpinned, the planner prefers TP8 PP12 DP4, half the fp32 all-reduce per GPU
            free = [a for a in argv if a not in ("--json",)]
            for flag in ("--tp", "--pp", "--cp", "--dp", "--micro-batch", "--vpp", "--zero", "--recompute"):
                i = free.index(flag)
                del free[i:i + 2]
            best = json.loads(run([*free, "--json", "--top", "1"], capsys)[1])["plans"][0]
            assert (best["tp"], best["pp"], best["dp"], best["micro_batch"], best["recompute"]) == (8, 12, 4, 1, "none")
            assert best["step_time_s"] < 0.9 * plan["step_time_s"] and best["comm_s"]["dp"] < 0.5 * plan["comm_s"]["dp"]


def test_older_stacks_plan_without_what_they_lacked(capsys):
    """Megatron-LM 2021 has neither ZeRO, sequence parallelism nor selective recomputation;
    DeepSpeed's pipeline engine (over those layers) runs ZeRO 0-1 in bf16 only: the search keeps to
    that, and pins outside it are refused in one line."""
    argv = ["--model", "gpt3-175b", "--gpus", "1024", "--gpu", "a100-80gb", "--seq-len", "2048",
            "--global-batch", "1536", "--json", "--top", "50"]
    code, out, _ = run([*argv, "--software", "megatron-lm-2021"], capsys)
    plans = json.loads(out)["plans"]
    assert code == 0 and plans and all(p["zero_stage"] == 0 and p["recompute"] != "selective" for p in plans)
    mine = json.loads(run(argv, capsys)[1])["plans"]
    assert mine[0]["mfu"] > plans[0]["mfu"]  # FlashAttention, SP and overlap against the 2021 stack
    code, out, _ = run([*argv, "--software", "deepspeed-pipe-bf16"], capsys)
    assert code == 0 and {p["zero_stage"] for p in json.loads(out)["plans"]} <= {0, 1}
    for bad, words in [(["--software", "megatron-lm-2021", "--zero", "1"], "ZeRO-1 is not part of Megatron-LM 2021"),
                       (["--software", "deepspeed-pipe-bf16", "--recompute", "selective"], "recompute selective is not part"),
                       (["--software", "deepspeed-pipe-bf16", "--precision", "fp16"], "use --precision bf16"),
                       (["--network-gbit", "0"], "--network-gbit must be a positive"),
                       (["--network-gbit", "inf"], "--network-gbit must be a positive")]:
        code, out, err = run([*argv, *bad], capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
