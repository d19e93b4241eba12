"""Each published run of ../shared/cases, evaluated with its published layout, predicts MFU
within 15% (relative) of the reported model-FLOPs MFU. Misses are marked xfail(strict) with the
reason, so that they show up in every run and an improvement that fixes one fails loudly."""
import pytest

from topology.cases import CASES_PATH, load_cases, predict_case

CASES = load_cases() if CASES_PATH.is_file() else []

KNOWN_MISSES = {
    "llama3-405b-t4-3": "predicted high: at 128K, 57% of Megatron-convention FLOPs are attention; no term "
                        "found for the gap (CP K/V all-gather is 4% of the step under GQA)",
    "narayanan21-t1-76.1B": "predicted high by 19%: no physical term found for the gap",
    # Run with torch DDP (run_table_1.sh DDP=torch): the all-reduce hides behind the last backward,
    # so these four are nearly pure compute, and the compute model's lean shows in full (as in the
    # NeMo 8B run on one node, +21%, tests/test_planner_validation.py).
    **{f"narayanan21-t1-{size}": f"predicted high by {err}: torch DDP hides the all-reduce; what remains "
       f"is compute, which the model overestimates here (README, the lean)"
       for size, err in (("1.7B", "22%"), ("3.6B", "20%"), ("7.5B", "19%"), ("18.4B", "17%"))},
}


def test_cases_file_is_there():
    assert len(CASES) == 14, f"expected 14 published runs in {CASES_PATH}"


@pytest.mark.parametrize("case", [
    pytest.param(c, id=c["id"], marks=[pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[c["id"]])]
                 if c["id"] in KNOWN_MISSES else []) for c in CASES])
def test_published_layout_mfu_within_15_percent(case):
    predicted = predict_case(case).cost.mfu
    reported = case["model_flops_mfu"]
    assert abs(predicted / reported - 1) <= 0.15, f"predicted {predicted:.3f}, reported {reported:.3f}"
