"""docs/benchmarks.md ("gpu") puts each stored H200 run of `hybridpar bench gpu` beside the planner's
prediction for the same plan as the planner makes it today (the files keep what it printed when they ran):
the predicted step and MFU, and the measured median over that prediction."""
import json
import re
from pathlib import Path

import pytest

from hybridpar.benchmarks.gpu import make_plan
from hybridpar.topology.cost import step_cost

REPO = Path(__file__).resolve().parents[2]
RUNS = ("gpu.json", "gpu-seq4096.json")


@pytest.mark.parametrize("name", RUNS)
def test_the_docs_show_todays_prediction_beside_each_stored_run(name):
    run = json.loads((REPO / "benchmarks" / "results" / "h200" / name).read_text())
    plan = run["plan"]
    cost = step_cost(make_plan(run["catalogue_gpu"], plan["seq_len"], plan["micro_batch"], plan["global_batch"]))
    doc = (REPO / "docs" / "benchmarks.md").read_text()
    row = next(line for line in doc.splitlines()
               if line.startswith(f"| seq {plan['seq_len']}, micro-batch {plan['micro_batch']},"))
    assert f"| {cost.step_time_s * 1e3:.0f} ms, {cost.mfu:.1%} |" in row, row
    ratio = run["step_time_s"]["median"] / cost.step_time_s
    assert re.search(rf"\| (\d\.\d\d-)?{ratio:.2f} \|$", row), (ratio, row)
