"""Out-of-sample check: published runs the planner was not built on (topology/data/validation_runs.json, each row
with its source: NVIDIA's DGX Cloud and NeMo recipes, NeMo Megatron's 2022 runs, Megatron-Core 0.8's and
Megatron-Bridge's tables, MLPerf Training's NeMo submissions, BigScience's three layout sweeps on 384 A100s,
Megatron-Turing NLG, MosaicML's FSDP benchmarks, torchtitan's and FlashAttention's own runs), each evaluated with its
published layout through topology.cases. Timed runs predict MFU within 15% (relative, the tolerance the public cases
get in test_planner_cases.py) of the reported throughput converted to model-FLOPs MFU; memory verdicts match what
happened; every sweep's layouts rank as measured. Misses are xfail(strict) with the reason, as in
test_planner_cases.py; docs/planner.md has the table."""
import statistics

import pytest

from hybridpar.topology.cases import CASES_PATH, VALIDATION_PATH, load_cases, predict_case
from hybridpar.topology.flops import model_flops_per_seq
from hybridpar.topology.hardware import get_gpu
from hybridpar.topology.models import ModelSpec
from hybridpar.topology import validation

TOLERANCE = 0.15  # as for the public cases (test_planner_cases.py)
RUNS = load_cases(VALIDATION_PATH)
TIMED = [r for r in RUNS if r.get("outcome", "ran") == "ran"]

_SWEEP = ("predicted high by 16-25%: costed on the stack the sweep ran (DeepSpeed 0.5's ZeRO-1 on 16-bit weights: "
          "bf16 gradients, reduced in bf16), with CUDA_LAUNCH_BLOCKING=1 and on the bandwidth NCCL measured on Jean "
          "Zay, the sweep's TP=2 rows are within -4 to +2% and TP=4/TP=8 at micro-batch 4 within +3 to +12%, while "
          "the layouts with the most DP traffic (DP=24) and TP=8 at micro-batch 1-2 (and 6) lean +16 to +25%; "
          "docs/planner.md, what is missing")
KNOWN_MISSES = {f"bloom-sweep-{k}": _SWEEP for k in (
    "tp8-pp6-dp8-mb6", "tp8-pp12-dp4-mb2", "tp8-pp4-dp12-mb2", "tp8-pp2-dp24-mb1",
    "tp8-pp2-dp24-mb2", "gbs1568-tp8-pp12-dp4-mb2")}
KNOWN_MISSES["bloom-sweep-gbs1568-tp8-pp6-dp8-mb4"] = (
    "predicted high by 36%: at GBS 1568 this layout took 113.01 s, as long as the 114.11 s it took at GBS 2048 with "
    "31% more samples, where the section's two other GBS 1568 rows took 0.78-0.79 of their GBS 2048 pair's time as the "
    "micro-batch count says; one iteration-2 reading, inconsistent with its own pair (docs/planner.md)")
_SWEEP_0221 = ("predicted high by 16-26%: the 02-21 sweep, TP=8 on every row and both shapes (181B, 196B), before "
               "the 02-25 PCIe/NUMA fix that sped every run 1-5% (its TP=8 PP=12 DP=4 micro-batch 4 took 123.7 s on "
               "02-21 and 117.1 s on 02-25); the planner ranks its layouts at Spearman 0.657 but leans high as on the "
               "02-25 TP=8 rows at micro-batch 1-2; docs/planner.md, what is missing")
KNOWN_MISSES.update({f"bloom-sweep0221-{k}": _SWEEP_0221 for k in (
    "tp8-pp12-dp4-mb1", "tp8-pp12-dp4-mb2", "tp8-pp6-dp8-mb1", "tp8-pp6-dp8-mb2", "tp8-pp6-dp8-mb4",
    "196b-tp8-pp12-dp4-mb2", "196b-tp8-pp6-dp8-mb2", "196b-tp8-pp6-dp8-mb4")})
_SWEEP_0228 = ("predicted high by 17% where the 02-28 sweep's other rows lean -2 to +4% (but TP=8 at micro-batch 2, "
               "+13 to +15%, which the 02-21 and 02-25 sweeps also took longer than the planner costs): 104 heads of "
               "128 dimensions on the 178B model, 18% slower than its "
               "64-head run, as the chronicle's other head-dimension-128 runs (12,288 x 96 heads, 14,336 x 112 heads at "
               "TP=8) were 15-18% slower than their 64-head ones, which the planner costs within 2%: docs/planner.md, "
               "what is missing")
KNOWN_MISSES.update({f"bloom-sweep0228-{k}": _SWEEP_0228 for k in (
    "178b-nh104-tp4-pp12-dp8-mb2",)})
_MTNLG = ("predicted high by 25-30%: Megatron-Turing NLG 530B on DeepSpeed's pipeline engine (TP8 PP35 on Selene), "
          "where Narayanan et al.'s run of the same 530B shape at TP8 PP35 on Selene, on Megatron's own interleaved "
          "schedule, is predicted within 2%: the planner costs the two stacks 1.4 points of MFU apart, they ran 9 "
          "points apart; the lean follows DeepSpeed's pipeline engine at TP=8, as on BigScience's TP=8 rows, not "
          "Jean Zay's network or its blocking launches; docs/planner.md, what is missing")
KNOWN_MISSES.update({f"mtnlg-530b-{n}": _MTNLG for n in (2240, 2800, 3360)})
_FSDP = ("PyTorch FSDP as MosaicML's llm-foundry ran it (Composer, 2023), costed with its own profiles (pytorch-fsdp: "
         "every gather and reduce-scatter hidden behind compute but for the SMs NCCL holds, each micro-batch's flat "
         "gradient moved through HBM) with its Triton attention and its fused 16-bit loss: its rows lean -2 to +44%, "
         "most where FSDP's traffic per micro-batch is largest (13B at micro-batch 4, 70B at 2), at 128 GPUs and on "
         "the 125M model (+15 to +27%, micro-batches of 32-40); docs/planner.md, what is missing")
KNOWN_MISSES.update({run_id: _FSDP for run_id in (
    "mosaic-mpt70b-a100-40gb-64",
    "mosaic-mpt13b-a100-40gb-8",
    "mosaic-mpt125m-a100-40gb-128",
    "mosaic-mpt125m-a100-40gb-8",
    "mosaic-mpt125m-a100-80gb-8-mb40",
    "mosaic-mpt125m-a100-80gb-8-mb32",
    "mosaic-mpt3b-a100-40gb-128",
    "mosaic-mpt760m-a100-40gb-128",
    "mosaic-mpt1b-h100-80gb-64",
    "mosaic-mpt760m-h100-80gb-8",
)})
_SMALL_MCORE = ("predicted high by 16-23%: the two smallest models of Megatron-Core 0.8's weak-scaling table (hidden "
                "2,048 per GPU: 1.7B at TP1, 7.1B at TP2), where the planner leans high on every stack (hidden/TP <= 2048; "
                "MosaicML's 125M-1B +10 to +25%); docs/planner.md, what is missing")
KNOWN_MISSES.update({"mcore08-gpt-1.7b-48": _SMALL_MCORE, "mcore08-gpt-7.1b-96": _SMALL_MCORE})
KNOWN_MISSES["mcore08-gpt-32b-384"] = (
    "predicted low by 22%: TP8 PP1 DP48 with 2 micro-batches per step, where the planner exposes 0.35 s of the "
    "fp32 gradient reduce-scatter over 48 nodes beyond the one backward it can hide behind; the table does not "
    "publish the micro-batch or what else the run overlapped; docs/planner.md, what is missing")
_TORCHTITAN = ("predicted high by 15-19%: torchtitan's FSDP2 on 64 A100s (April 2024), costed op by op as its eager "
               "layer runs (kernels.py, software.TORCHTITAN_2024) with its recomputation policies; its rows lean +13 "
               "to +19% but for the two 70B runs under full recomputation (+6 to +7%); docs/planner.md, what is "
               "missing")
KNOWN_MISSES.update({run_id: _TORCHTITAN for run_id in (
    "torchtitan-l3-8b-opac", "torchtitan-l2-13b-opac", "torchtitan-l2-13b-noac", "torchtitan-l2-13b-layerac")})
_NEMO2403_LONG = ("predicted high by 19-25%: Llama 2 7B in FP8 on NeMo 24.03 at 32K to 1M tokens with context "
                  "parallelism (H100), where the same table's 4K-16K rows lean +10 to +12% and NeMo 24.09's 8K rows +1 "
                  "to +3%: the attention, 56% of the FLOPs at 32K and over 90% from 256K, runs below the planner's rate "
                  "in that release's ring (Transformer Engine 1.4-1.5 and its cuDNN), whose kernels no stored table "
                  "measures; docs/planner.md, what is missing")
KNOWN_MISSES.update({f"nemo2403-llama2-7b-{k}-fp8": _NEMO2403_LONG for k in ("32k", "64k", "128k", "256k", "512k", "1m")})
KNOWN_MISSES["bignlp2208-gpt3-5b-tp2-pp1-32-o1"] = (
    "predicted high by 18%: container 22.08.05 ran this bf16 O1 layout 15% slower than 22.06.10 (23.23 and 20.21 s), where "
    "the other layouts' two containers and the fp16 O1 run of the same layout agree within 4%; at the 22.06.10 time it "
    "is +2.5%; docs/planner.md, NeMo Megatron on DGX A100")
KNOWN_MISSES["bignlp2208-gpt3-5b-tp8-pp4-32-o1"] = (
    "predicted high by 16%, as its O2 row (+14.6%): TP8 PP4 on 4 nodes runs 720 micro-batches of 6 layers a step, the "
    "most of the sweep, and took 4-5 s (6-7 ms a micro-batch) beyond what the planner costs, a cost paid per micro-batch "
    "that no stored trace of apex's schedule times; docs/planner.md, NeMo Megatron on DGX A100")
KNOWN_MISSES.update({f"mlperf51-llama31-8b-cisco-{n}": (
    "predicted high by 22% (TP1 on 64 H100s) and 50% (TP2 on 128), one micro-batch per DP rank a step: the planner "
    "hides the distributed optimizer's reduce-scatter and all-gather (0.05 + 0.025 s at a node's NICs together) behind "
    "that forward and backward, and the runs took 0.13 and 0.16 s longer; NVIDIA's own FP8 runs of the model on 128 "
    "H100s reached 78-81% MFU (Cisco's 67% and 49%) and are predicted within 3%, and Cisco's configs shrink cuBLAS's "
    "workspace against running out of memory (docs/planner.md, what is missing)")
    for n in (64, 128)})
# Memory verdicts that do not match what happened, with what the memory model lacks for them.
KNOWN_WRONG_MEMORY: dict[str, str] = {
    "bloom-sweep0228-206b-nh128-tp4-pp12-dp8-mb2": (
        "published out of memory, predicted to fit at 62.8 GiB: its 14,336 x 7 layers per stage hold within 1% of the "
        "parameters of the 203B's 13,312 x 8, which ran beside it at 67 GB (predicted 62.9 GiB), with fewer checkpointed "
        "activations; no term the planner counts tells the two apart, and the chronicle does not say where it ran out "
        "(docs/planner.md, what is missing)"),
    "bignlp2209-gpt3-5b-tp1-pp1-32": (
        "trained, predicted at 80.06 GiB, 0.06 over the 80 GiB of its A100: GPT-3 5B at TP1 and micro-batch 2 without "
        "recomputation holds 42.8 GiB of activations, on which the planner's assumed 10% allocator reserve is 4.4 GiB; "
        "the same layout on 128 GPUs (12 bytes of optimizer state per parameter over 128 ranks, not 32) is predicted "
        "at 78.7 GiB and fits. No stored reading of that run's caching allocator sizes the reserve "
        "(docs/planner.md, what is missing)"),
}


def _mark(run_id, misses):
    return [pytest.mark.xfail(strict=True, reason=misses[run_id])] if run_id in misses else []


def test_runs_have_sources_and_none_is_a_public_case():
    assert len(TIMED) >= 20 and len(RUNS) - len(TIMED) >= 3
    assert all(r["source"].startswith("https://") and r["precision"] in ("bf16", "fp16", "fp8") for r in RUNS)
    if CASES_PATH.is_file():
        assert not {r["id"] for r in RUNS} & {c["id"] for c in load_cases()}


# NeMo's long-sequence tables publish the layouts, not the recipes: userbuffers are not assumed there.
LONG_SEQUENCE_TABLES = ("nemo2403-llama2-7b-", "nemo2504-llama3-8b-b200-")


def test_userbuffers_only_where_a_run_could_have_them():
    """tp_comm_overlap marks runs whose recipe set up Transformer Engine's userbuffers: every NeMo run with TP > 1
    whose recipe is published, Megatron-Core 0.8's table, Megatron-Bridge's recipes and MLPerf's NeMo submissions
    (GPT-3 and Llama 3.1); each has TP > 1 inside a node and a stack with sequence parallelism and TE."""
    from hybridpar.topology.software import PROFILES

    marked = [r for r in RUNS if r.get("tp_comm_overlap")]
    assert {r["id"] for r in marked} == {r["id"] for r in RUNS
                                         if r["id"].startswith(("nemo", "mcore08", "mbridge", "mlperf")) and r["tp"] > 1
                                         and not r["id"].startswith(LONG_SEQUENCE_TABLES)}
    for r in marked:
        profile = PROFILES[r["software"]]
        assert 1 < r["tp"] <= 8 and profile.sequence_parallel and profile.flash_attention, r["id"]


@pytest.mark.parametrize("run", TIMED, ids=[r["id"] for r in TIMED])
def test_reported_mfu_matches_reported_step_time(run):
    """model_flops_mfu is the published step time restated in the planner's FLOP convention."""
    m = ModelSpec(run["layers"], run["hidden"], run["ffn_hidden"], run["heads"], run["kv_heads"],
                  run["vocab"], run["mlp"], run["id"])
    flops = model_flops_per_seq(m, run["seq_len"]) * run["global_batch_seqs"]
    peak = get_gpu(run["gpu"].lower()).bf16_tflops * 1e12
    mfu = flops / run["reported_step_time_s"] / run["num_gpus"] / peak
    assert mfu == pytest.approx(run["model_flops_mfu"], abs=1e-3)


@pytest.mark.parametrize("run", [pytest.param(r, id=r["id"], marks=_mark(r["id"], KNOWN_MISSES)) for r in TIMED])
def test_published_layout_mfu_within_tolerance(run):
    predicted = validation.check(run).predicted_mfu  # over the 16-bit peak, as model_flops_mfu
    reported = run["model_flops_mfu"]
    assert abs(predicted / reported - 1) <= TOLERANCE, f"predicted {predicted:.3f}, reported {reported:.3f}"


# Published peaks that are not the model's, with why.
KNOWN_WRONG_PEAKS = {
    "bloom-sweep0221-196b-tp8-pp6-dp8-mb2": (
        "read at 65 GB, 9 GB above the same layout's 56 GB at micro-batch 4, which holds twice its activations: a "
        "snapshot of what the caching allocator held, not the model's peak (predicted 40.9 GiB; its micro-batch 4 "
        "twin 53.3 GiB of 56 GB)"),
}


@pytest.mark.parametrize("run", [pytest.param(r, id=r["id"], marks=_mark(r["id"], KNOWN_WRONG_PEAKS))
                                 for r in TIMED if r.get("reported_memory_gb")])
def test_published_peak_memory_is_predicted_within_tolerance(run):
    """Where a run published its peak (BigScience's sweeps: nvidia-smi's maximum, in the chronicle's GB), the
    predicted peak is within TOLERANCE of it (docs/planner.md: the caching allocator's reserve)."""
    assert abs(validation.check(run).memory_gib / run["reported_memory_gb"] - 1) <= TOLERANCE


@pytest.mark.parametrize("run", [pytest.param(r, id=r["id"], marks=_mark(r["id"], KNOWN_WRONG_MEMORY)) for r in RUNS])
def test_memory_verdict_matches_what_happened(run):
    """A layout that trained is predicted to fit; one that ran out of memory is predicted not to."""
    e = predict_case(run)
    assert e.fits == (run.get("outcome", "ran") == "ran"), f"{e.memory.total / 2**30:.1f} GiB predicted"


@pytest.mark.parametrize("sweep", sorted({r["sweep"] for r in TIMED if r.get("sweep")}))
def test_layouts_of_one_sweep_rank_as_measured(sweep):
    assert validation.summary().sweeps[sweep] >= 0.6


def test_issue_goal_median_error_within_10_percent():
    """Over all timed runs."""
    assert validation.summary().median_abs_error <= 0.10


def test_issue_goal_bias_within_5_percent():
    assert abs(validation.summary().signed_bias) <= 0.05


@pytest.mark.xfail(strict=True, reason="the A100 40GB rows (MosaicML's FSDP, all of them) lean +11.3%, the A100 "
                                       "80GB rows +5.5% (MosaicML's FSDP, torchtitan's FSDP2, DeepSpeed's pipeline "
                                       "engine at TP=8) and the B200 rows +6.2% (NeMo 25.04's long sequences, "
                                       "Megatron-Bridge's 405B on 128); H100 +1.4%, H200 +1.5% (docs/planner.md, what "
                                       "is missing)")
def test_each_gpu_alone_meets_the_bias_goal():
    assert all(abs(bias) <= 0.05 for _, _, bias in validation.summary().by_gpu.values())


def test_per_gpu_statistics_and_ranges_are_their_rows():
    rows = [r for r in validation.checks() if r.error is not None]
    s = validation.summary()
    assert sum(n for n, _, _ in s.by_gpu.values()) == s.timed
    for gpu, (n, _, bias) in s.by_gpu.items():
        errors = sorted(r.error for r in rows if r.gpu == gpu)
        assert n == len(errors) and min(errors) <= bias <= max(errors)
        if n >= validation.OWN_RANGE_MIN_RUNS:
            assert validation.ratio_range(gpu) == s.gpu_ranges[gpu] != s.ratio_range
            assert validation.ratio_range(f"{gpu} (mine)") == s.gpu_ranges[gpu]
    # a GPU without enough runs of its own gets the spread of all of them
    assert validation.ratio_range("h200-141gb") == s.ratio_range == validation.ratio_range()


def test_a_software_profiles_range_is_its_own_runs_on_that_gpu():
    """DeepSpeed's pipeline engine and FSDP lean differently from NeMo on the same GPU: a plan for a profile with
    OWN_RANGE_MIN_RUNS timed runs on its GPU takes their spread and says so; others fall back to the GPU's."""
    rows = [r for r in validation.checks() if r.error is not None]
    s = validation.summary()
    assert {("a100-80gb", "deepspeed-pipe-zero1"), ("h100-80gb", "nemo-distributed-fused-adam")} <= set(s.profile_ranges)
    for (gpu, sw), spread in s.profile_ranges.items():
        errors = [r.error for r in rows if r.gpu_software == (gpu, sw)]
        assert len(errors) >= validation.OWN_RANGE_MIN_RUNS and spread == validation._ratio_range(errors)
        assert validation.ratio_range(gpu, sw) == spread
        assert f"the {len(errors)} published runs on {gpu} costed with {sw}" in validation.range_note(gpu, sw)
    # hybridpar's own runtime has no published GPU run: its plans take the GPU's spread over every stack
    assert validation.ratio_range("a100-80gb", "hybridpar") == s.gpu_ranges["a100-80gb"]
    assert "every stack" in validation.range_note("a100-80gb", "hybridpar")
    assert validation.ratio_range("h200-141gb", "megatron-core") == s.ratio_range
    assert "all" in validation.range_note("h200-141gb", "megatron-core")
    assert validation.ratio_range("a100-80gb", "deepspeed-pipe-zero1") != s.gpu_ranges["a100-80gb"]


def test_an_unpublished_vpp_is_one_the_stack_could_run():
    """Where a run does not publish its virtual stages, the planner costs the ones its stack has: DeepSpeed's
    pipeline engine none (1F1B only), Megatron's interleaved schedule the fastest that fits."""
    run = dict(next(r for r in RUNS if r["id"] == "bloom-sweep-tp8-pp2-dp24-mb2"), vpp=None)  # 42 micro-batches
    assert predict_case(run).plan.vpp == 1
    assert predict_case(dict(run, software="megatron-lm-2021", zero_stage=0)).plan.vpp > 1


def test_per_stack_statistics_are_their_rows():
    """Every run names the software family that ran it; each family's figures are its rows'."""
    rows = [r for r in validation.checks() if r.error is not None]
    assert all(r.get("stack") for r in RUNS)
    s = validation.summary()
    assert sum(n for n, _, _ in s.by_stack.values()) == s.timed
    for stack, (n, mae, bias) in s.by_stack.items():
        errors = [r.error for r in rows if r.stack == stack]
        assert n == len(errors) and mae == statistics.median(abs(e) for e in errors)
        assert bias == statistics.median(errors)
    assert {"NeMo 1", "NeMo 2", "llm-foundry FSDP (MosaicML)", "Megatron-LM 2021"} <= set(s.by_stack)


def test_summary_is_the_rows_statistics():
    rows = validation.checks()
    errors = sorted(r.error for r in rows if r.error is not None)
    s = validation.summary()
    assert s.timed == len(errors) and s.signed_bias == pytest.approx(errors[len(errors) // 2] if len(errors) % 2
                                                                     else (errors[len(errors) // 2 - 1] + errors[len(errors) // 2]) / 2)
    assert s.memory_right == sum(r.fits == r.ran for r in rows)
    lo, hi = s.ratio_range
    ratios = sorted(1 / (1 + e) for e in errors)
    assert ratios[0] <= lo <= hi <= ratios[-1]


def test_spearman():
    assert validation.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1)
    assert validation.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1)


@pytest.mark.parametrize("mfu, step", [(0.47, 5.0), (0.9, 1.0), (0.05, 100.0)])
def test_ranges_hold_the_prediction(mfu, step):
    for gpu in (None, "a100-80gb", "h100-80gb", "b200-180gb"):
        lo, hi = validation.mfu_range(mfu, gpu)
        assert lo <= mfu <= hi and lo < hi
        slo, shi = validation.step_time_range(step, gpu)
        assert slo <= step <= shi and slo < shi


def test_outside_the_validated_region_says_which_axis():
    inside = validation.outside_validated_region(405e9, "h100-80gb", 2048, 8192)
    assert inside is None
    note = validation.outside_validated_region(405e9, "h800-80gb", 2048, 8192)
    assert note.startswith("outside the validated region") and "h800-80gb" in note and "model size" not in note
    assert validation.outside_validated_region(405e9, "h200-141gb", 4096, 8192) is None  # MLPerf v5.0 on H200
    assert "model size" in validation.outside_validated_region(5e12, "h100-80gb", 2048, 8192)
    assert validation.outside_validated_region(8e9, "b200-180gb", 1024, 1_048_576) is None
    # each dimension among the runs on the plan's GPU: H200's runs are MLPerf's 405B, not an 8B
    note = validation.outside_validated_region(8e9, "h200-141gb", 4096, 8192)
    assert note == "outside the validated region: no published run on h200-141gb near its model size 8B"
    assert "sequence length" in validation.outside_validated_region(405e9, "h100-80gb", 2048, 4_194_304)
    assert "hidden/TP" in validation.outside_validated_region(405e9, "h100-80gb", 64, 8192)
    assert validation.outside_validated_region(405e9, "h100-80gb (mine)", 2048, 8192) is None


def test_the_readme_quotes_the_current_validation():
    from pathlib import Path

    s = validation.summary()
    fsdp = s.by_stack["llm-foundry FSDP (MosaicML)"][2]
    torchtitan = s.by_stack["torchtitan (PyTorch)"][2]
    eos = {r["id"] for r in TIMED if r.get("sweep") == "mlperf-v5.0-llama31-405b-eos"}
    llama405b_worst = max(abs(c.error) for c in validation.checks() if c.id in eos)
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    for quoted in (f"over {s.timed} published runs", f"median |error| {s.median_abs_error:.1%}",
                   f"lean {s.signed_bias:+.1%} high", f"{s.memory_right} of {s.memory_checked} memory verdicts right",
                   f"Spearman {s.sweeps['bloom-tr11-2022-02-21']:.3f}, {s.sweeps['bloom-tr11-2022-02-25']:.3f} and "
                   f"{s.sweeps['bloom-tr11-2022-02-28']:.3f}, NeMo Megatron's nine of GPT-3 5B at "
                   f"{s.sweeps['bignlp-2208-gpt3-5b-32']:.3f} and seven more under autocast (O1) at "
                   f"{s.sweeps['bignlp-2208-gpt3-5b-o1-32']:.3f}, NVIDIA's MLPerf GPT-3 175B from 512 to 10,752 H100s at "
                   f"{s.sweeps['mlperf-v3.1-gpt3-eos']:.3f} and its Llama 3.1 405B from 512 to 8,192 H100s at "
                   f"{s.sweeps['mlperf-v5.0-llama31-405b-eos']:.3f}, each within {llama405b_worst:.1%})",
                   f"{s.by_gpu['h100-80gb'][2]:+.1%} on H100, {s.by_gpu['h200-141gb'][2]:+.1%} on H200 "
                   f"({s.by_gpu['h200-141gb'][0]} runs), {s.by_gpu['a100-80gb'][2]:+.1%} on A100 80GB (NeMo "
                   f"Megatron's own 2022 runs there, {s.by_stack['NeMo Megatron 2022 (NVIDIA)'][2]:+.0%}) and "
                   f"{s.by_gpu['a100-40gb'][2]:+.1%} on A100 40GB",
                   f"{s.by_gpu['b200-180gb'][2]:+.1%} on B200 ({s.by_gpu['b200-180gb'][0]} runs, 8K to 1M tokens)",
                   f"{s.by_stack['NeMo 1'][2]:+.1%} on NeMo 1 and {s.by_stack['NeMo 2'][2]:+.1%} on NeMo 2 "
                   f"({sum(r['precision'] == 'fp8' and r['stack'].startswith('NeMo') for r in TIMED)} of their "
                   f"{s.by_stack['NeMo 1'][0] + s.by_stack['NeMo 2'][0]} runs trained in FP8)",
                   f"{s.by_stack['FlashAttention training (HazyResearch)'][2]:+.1%} on FlashAttention's own GPT training "
                   f"({s.by_stack['FlashAttention training (HazyResearch)'][0]} runs on one A100 node)",
                   f"the PyTorch FSDP runs, costed with their own profile, lean {fsdp:+.0%} and torchtitan's FSDP2 "
                   f"runs (all on A100) {torchtitan:+.0%}"):
        assert quoted in readme, quoted
