"""`hybridpar plan`'s honest figures (issue 15 §4-5): every plan's ranges and validated region, and
`--validate` as the docs carry it."""
import json
import re

import pytest

from plan_cli import REPO, run


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
    h800 = run(["--model", "llama3-405b", "--gpus", "16384", "--gpu", "h800", "--top", "1"], capsys)[1]
    notes = [line for line in h800.splitlines() if line.startswith("outside the validated region")]
    assert len(notes) == 1 and "h800-80gb" in notes[0]


def test_the_out_of_region_line_names_the_plans_it_is_about(capsys, tmp_path):
    """A small model (hidden 384) on A100 80GB, where MosaicML's 125M runs are: its TP1 plans lie inside
    the validated region, its TP2 and TP4 plans (hidden/TP 192, 96) outside; each line says which plans,
    as the JSON says per plan."""
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"layers": 12, "hidden": 384, "ffn_hidden": 1024, "heads": 8, "kv_heads": 8,
                                 "vocab": 32000, "mlp": "swiglu"}))
    argv = ["--model", str(small), "--gpus", "8", "--gpu", "a100-80gb", "--top", "30"]
    plans = json.loads(run([*argv, "--json"], capsys)[1])["plans"]
    outside = [str(i) for i, p in enumerate(plans, 1) if p["validated_region"]]
    assert outside and len(outside) < len(plans)
    assert all((plans[int(i) - 1]["tp"] > 1) == (i in outside) for i in map(str, range(1, len(plans) + 1)))
    notes = {}
    for i in outside:
        notes.setdefault(plans[int(i) - 1]["validated_region"], []).append(i)
    assert len(notes) == 2  # hidden/TP 192 and 96
    lines = [line for line in run(argv, capsys)[1].splitlines() if "outside the validated region" in line]
    assert sorted(lines) == sorted(f"plans {', '.join(which)}: {note}" for note, which in notes.items())


def test_a_plans_range_is_its_gpus_own_spread(capsys):
    """A100 and H100 runs lean differently; a plan takes the spread of its own GPU's runs, a GPU
    with too few (H200: 2) the spread of all, and a software profile with enough runs on the GPU theirs.
    The ranges line quotes the spread, and says so where both its ends lie on one side of 1 (the range
    is then widened to hold the prediction: A100 40GB's runs all came in below it)."""
    from hybridpar.topology import validation
    argv = ["--model", "llama3-70b", "--gpus", "512", "--top", "1", "--json"]
    for gpu in ("a100-80gb", "h100-80gb", "b200-180gb", "h200-141gb"):
        (p,) = json.loads(run([*argv, "--gpu", gpu], capsys)[1])["plans"]
        lo, hi = validation.ratio_range(gpu)
        assert p["mfu_range"] == pytest.approx([p["mfu"] * min(lo, 1.0), p["mfu"] * max(hi, 1.0)], abs=2e-4)
        table = run([*argv[:-1], "--gpu", gpu], capsys)[1]
        assert f"reported/predicted MFU, {lo:.2f}-{hi:.2f}, over " in table
        assert ("both below 1, so each range's top is the prediction itself" in table) == (hi < 1.0)
    assert validation.ratio_range("a100-80gb") != validation.ratio_range("h100-80gb")
    assert validation.ratio_range("h200-141gb") == validation.ratio_range() != validation.ratio_range("b200-180gb")
    assert validation.ratio_range("a100-40gb")[1] < 1.0  # the widened case exists
    (p,) = json.loads(run([*argv, "--gpu", "a100-40gb"], capsys)[1])["plans"]
    assert p["mfu_range"][1] == pytest.approx(p["mfu"], abs=1e-4)
    assert "both below 1" in run([*argv[:-1], "--gpu", "a100-40gb"], capsys)[1]
    # a stack with enough runs of its own on that GPU: their spread, and the table says whose
    ds = ["--gpu", "a100-80gb", "--software", "deepspeed-pipe-zero1"]
    (p,) = json.loads(run([*argv, *ds], capsys)[1])["plans"]
    lo, hi = validation.ratio_range("a100-80gb", "deepspeed-pipe-zero1")
    assert p["mfu_range"] == pytest.approx([p["mfu"] * min(lo, 1.0), p["mfu"] * max(hi, 1.0)], abs=2e-4)
    table = run([*argv[:-1], *ds], capsys)[1]
    assert "costed with deepspeed-pipe-zero1" in table
    # the note names the command that lists the runs behind the range, and that command lists exactly them
    listed = re.search(r"\(`hybridpar plan (--validate --gpu \S+ --software \S+)`\)", table).group(1).split()
    shown = json.loads(run([*listed, "--json"], capsys)[1])
    timed = [r["error"] for r in shown["runs"] if r["error"] is not None]
    assert validation._ratio_range(timed) == pytest.approx((lo, hi), abs=1e-3)  # the JSON rounds each error
    assert shown["timed"] == len(timed) >= validation.OWN_RANGE_MIN_RUNS


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


def test_validate_selects_the_runs_of_one_gpu_and_one_software_profile(capsys):
    """`--validate --gpu NAME --software NAME`: only those runs, the summary over them, the ranges plans
    get from every run (those of the selection's GPU and profile shown)."""
    from hybridpar.topology.validation import checks, summary

    argv = ["--validate", "--gpu", "a100", "--software", "deepspeed-pipe-bf16"]
    out = run(argv, capsys)[1]
    chosen = [r for r in checks() if r.gpu == "a100-80gb" and r.software == "deepspeed-pipe-bf16"]
    others = [r for r in checks() if r not in chosen]
    assert chosen and any(not r.ran for r in chosen)  # BigScience's out-of-memory layouts are among them
    assert all(r.id in out for r in chosen) and not any(f"\n{r.id} " in out for r in others)
    assert f"Only the {len(chosen)} runs on a100-80gb costed with deepspeed-pipe-bf16, of {len(checks())}" in out
    s, everything = summary(tuple(chosen)), summary()
    assert s.timed < everything.timed and s.median_abs_error != everything.median_abs_error
    assert f"{s.timed} runs with a reported throughput: median |error| {s.median_abs_error:.1%}" in out
    assert f"memory verdicts right: {s.memory_right} of {len(chosen)}" in out
    assert set(s.sweeps) < set(everything.sweeps) and all(f"sweep {name}:" in out for name in s.sweeps)
    lo, hi = everything.profile_ranges["a100-80gb", "deepspeed-pipe-bf16"]
    ranges = out.splitlines()[-1]
    assert f"a100-80gb deepspeed-pipe-bf16 {lo:.2f}-{hi:.2f}" in ranges and "h100-80gb" not in ranges
    data = json.loads(run([*argv, "--json"], capsys)[1])
    assert data["selection"] == {"gpu": "a100-80gb", "software": "deepspeed-pipe-bf16"}
    assert [r["id"] for r in data["runs"]] == [r.id for r in chosen] and data["timed"] == s.timed
    assert data["reported_over_predicted_range"] == [round(x, 4) for x in everything.ratio_range]
    h100 = json.loads(run(["--validate", "--gpu", "h100-80gb", "--json"], capsys)[1])
    assert {r["gpu"] for r in h100["runs"]} == {"h100-80gb"} and set(h100["by_gpu"]) == {"h100-80gb"}
    assert len({r["software"] for r in h100["runs"]}) > 1


def test_validate_json_says_where_each_runs_predicted_step_goes(capsys):
    """Each published run's predicted step, split into the parts the planner costs (they add up to it), beside
    the run's own step time where it publishes one; the MFU error is the ratio of the two."""
    runs = json.loads(run(["--validate", "--json"], capsys)[1])["runs"]
    for r in runs:
        parts = r["predicted_time_s"]
        assert set(parts) == {"compute", "bubble", "tp", "cp", "pp", "dp", "optimizer"} and parts["compute"] > 0
        assert sum(parts.values()) == pytest.approx(r["predicted_step_time_s"], rel=1e-3, abs=1e-3), r["id"]
    stepped = [r for r in runs if r["reported_step_time_s"]]
    assert len(stepped) > 100
    for r in stepped:
        assert r["reported_step_time_s"] / r["predicted_step_time_s"] - 1 == pytest.approx(r["error"], abs=2e-3), r["id"]


def test_the_docs_carry_the_current_validation_table(capsys):
    """docs/planner.md shows `hybridpar plan --validate` as it prints today."""
    doc = (REPO / "docs" / "planner.md").read_text()
    out = run(["--validate"], capsys)[1]
    assert out.strip() in doc, "re-run `hybridpar plan --validate` and paste its output into docs/planner.md"
