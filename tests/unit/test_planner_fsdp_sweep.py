"""Where the FSDP rows' lean comes from: MosaicML's micro-batch sweep of MPT-7B and MPT-13B on one node of
8 A100 80GB (PyTorch FSDP FULL_SHARD, MP mode DEFAULT, no activation checkpointing, gradient accumulation 2,
sequences of 2,048), from a benchmarking branch of llm-foundry (commit beb8dee6922c5e31d27a24a713a1315b4013185d,
scripts/train/benchmarking/larger_mb_1.md, committed 2023-10-03, before Composer 0.16.4 made DEFAULT reduce
in fp32: a bf16 reduction, as the A100 80GB rows; not merged, so not validation rows).

With the micro-batches per step fixed, the step time is a line in the tokens per step: its slope is the
per-token compute, its intercept what every step pays whatever its micro-batch size (FSDP's gathers and
reduce-scatter of every micro-batch, the optimizer). The planner's slope, from its own compute over the same
micro-batch sizes, matches the measured one within SLOPE_TOLERANCE; its intercept falls short (docs/planner.md,
what is missing).
"""
import copy
import statistics

import pytest

from hybridpar.topology.cases import VALIDATION_PATH, load_cases, predict_case

SEQ, GRAD_ACCUM, GPUS = 2048, 2, 8
# (validation row giving the model and stack, micro-batch, reported tokens per second per GPU)
SWEEP = {
    "mosaic-mpt7b-a100-80gb-8": [(6, 4715), (4, 4513), (2, 4044), (1, 3366)],
    "mosaic-mpt13b-a100-80gb-8": [(2, 2228), (1, 1867)],
}
SLOPE_TOLERANCE = 0.05
FIXED_TOLERANCE = 0.15
ROWS = {r["id"]: r for r in load_cases(VALIDATION_PATH)}


def _line(tokens: list[float], seconds: list[float]) -> tuple[float, float]:
    fit = statistics.linear_regression(tokens, seconds)
    return fit.slope, fit.intercept


def _sweep(run_id: str):
    """(tokens per GPU and step, reported step s, predicted step s, predicted compute s) per micro-batch."""
    out = []
    for mb, tokens_per_s in SWEEP[run_id]:
        case = copy.deepcopy(ROWS[run_id])
        case.update(micro_batch=mb, global_batch_seqs=mb * GRAD_ACCUM * GPUS, recompute="none")
        cost = predict_case(case).cost
        tokens = mb * GRAD_ACCUM * SEQ
        out.append((tokens, tokens / tokens_per_s, cost.step_time_s, cost.compute_s))
    return out


@pytest.mark.parametrize("run_id", [r for r in SWEEP if len(SWEEP[r]) >= 3])
def test_the_sweep_is_a_line_in_the_tokens_per_step(run_id):
    """Same micro-batches per step: the reported steps lie on one line (within 1%), so its slope and intercept
    mean what the module says (checked where more than two points make the line)."""
    rows = _sweep(run_id)
    tokens, reported = [r[0] for r in rows], [r[1] for r in rows]
    slope, fixed = _line(tokens, reported)
    assert slope > 0 and fixed > 0
    assert all(abs(slope * t + fixed - s) / s < 0.01 for t, s in zip(tokens, reported))


def _measured_and_predicted(run_id: str, predicted_column: int):
    """The reported steps' line and the line through the predicted column (2: step, 3: compute)."""
    rows = _sweep(run_id)
    tokens = [r[0] for r in rows]
    return _line(tokens, [r[1] for r in rows]), _line(tokens, [r[predicted_column] for r in rows])


@pytest.mark.parametrize("run_id", SWEEP)
def test_per_token_compute_is_the_measured_one(run_id):
    (measured, _), (predicted, _) = _measured_and_predicted(run_id, 3)
    assert abs(predicted / measured - 1) <= SLOPE_TOLERANCE, (predicted, measured)


@pytest.mark.xfail(strict=True, reason="each step pays 0.42 s (MPT-7B) and 0.71 s (MPT-13B) whatever its micro-batch "
                                       "size; the planner 0.25 and 0.41 s (each micro-batch's flat gradient through "
                                       "HBM, the SMs NCCL holds beside FSDP's traffic, Composer's unfused optimizer "
                                       "step): the rest, about 40%, is not modelled; docs/planner.md, what is missing")
@pytest.mark.parametrize("run_id", SWEEP)
def test_what_every_step_pays_is_the_measured_one(run_id):
    (_, measured), (_, predicted) = _measured_and_predicted(run_id, 2)
    assert abs(predicted / measured - 1) <= FIXED_TOLERANCE, (predicted, measured)
