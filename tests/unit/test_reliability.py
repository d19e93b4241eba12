"""In-process checks of the reliability pieces (no ranks): drift finding, fault specs, the
failed-rank summary, and the reliability flags' bad input (one line, exit 2)."""
from __future__ import annotations

import signal
from contextlib import nullcontext
from pathlib import Path

import pytest

from hybridpar.errors import UsageError
from hybridpar.reliability.faults import Fault, parse
from hybridpar.launch.local import failure_summary, root_cause
from hybridpar.reliability.replicas import Drift, find_drift
from hybridpar.topology.layout import RankLayout

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"
A, B = b"\x00" * 8, b"\x01" * 8


def test_majority_names_the_odd_replica_and_its_tensor():
    names = ["w1", "w2", "w3"]
    gathered = [[A, A, A], [A, A, A], [A, B, A], [A, A, A]]  # DP rank 2 differs in w2
    layout = RankLayout(tp=4, dp=4)  # replica d: ranks 4d..4d+3; rank 1's DP group: 1, 5, 9, 13
    found = find_drift(7, names, gathered, [1, 5, 9, 13], layout)
    assert found == [Drift(7, "w2", 2, 9, (8, 9, 10, 11), (0, 1, 3), None, (1, 5, 13))]
    assert found[0].line() == "replica drift at step 7: DP replica 2 (ranks 8-11) differs from replica(s) 0,1,3 in w2 (held by rank 9)"


def test_identical_replicas_report_nothing_and_a_tie_names_the_replica_without_dp_rank_0():
    layout = RankLayout(tp=4, dp=2)
    assert find_drift(1, ["w"], [[A], [A]], [0, 4], layout) == []
    (drift,) = find_drift(1, ["w"], [[A], [B]], [2, 6], layout)
    assert (drift.replica, drift.rank, drift.agreeing) == (1, 6, (0,))


def test_a_cp_rank_that_differs_from_its_cp_peer_is_named():
    """With CP the ranks holding the same weights are the dp_cp group: TP2 x CP2 x DP2 (order
    tp-cp-pp-dp), rank 0's group is ranks 0 (DP 0, CP 0), 2 (DP 0, CP 1), 4 and 6 (DP 1). Rank 2's
    copy differs from its CP peer in the same DP replica, which a DP-only check never compares."""
    layout = RankLayout(tp=2, cp=2, dp=2)
    assert layout.group_of(0, "dp_cp") == [0, 2, 4, 6] and layout.group_of(0, "dp") == [0, 4]
    (drift,) = find_drift(3, ["w"], [[A], [B], [A], [A]], [0, 2, 4, 6], layout)
    assert drift == Drift(3, "w", 0, 2, (0, 1, 2, 3), (0, 1), 1, (0, 4, 6))
    assert drift.line() == ("replica drift at step 3: rank 2 (DP replica 0, CP rank 1) differs from rank(s) 0,4,6, "
                            "which hold the same weights, in w")


def test_fault_specs_parse_and_bad_ones_are_one_line_errors():
    assert parse("kill-in-step:rank=5:step=3:micro=2; flip:rank=1:step=4") == [
        Fault("kill-in-step", 5, 3, {"micro": "2"}), Fault("flip", 1, 4, {})]
    assert parse("") == []
    assert parse("stall-in-step:rank=2:step=5:seconds=8") == [Fault("stall-in-step", 2, 5, {"seconds": "8"})]
    for bad in ("explode:rank=1:step=2", "flip:rank=1", "flip:rank=x:step=1", "flip:rank=1:step=2:bit",
                "stall-in-step:rank=2:step=5", "stall-in-step:rank=2:step=5:seconds=long"):
        with pytest.raises(UsageError, match="HYBRIDPAR_FAULT"):
            parse(bad)


class _Failure:
    def __init__(self, pid, exitcode, timestamp):
        self.pid, self.exitcode, self.timestamp = pid, exitcode, timestamp

    def signal_name(self):
        return signal.Signals(-self.exitcode).name


def test_summary_names_the_killed_rank_not_the_ones_that_lost_it_or_were_stopped():
    failures = {0: _Failure(100, -signal.SIGTERM, 10), 3: _Failure(103, 1, 10), 5: _Failure(105, -signal.SIGKILL, 11)}
    assert root_cause(failures)[0] == 5
    assert failure_summary(failures, 8).startswith("hybridpar: rank 5 (pid 105) died: signal SIGKILL (2 other rank(s)")
    exited = {2: _Failure(102, 3, 10), 1: _Failure(101, 3, 10)}
    assert failure_summary(exited, 8).startswith("hybridpar: rank 1 (pid 101) failed with exit code 3")


def test_bad_reliability_input_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    from hybridpar.launch import local as launch
    from hybridpar.cli.main import main

    monkeypatch.setattr(launch, "launch_local", lambda *a, **k: pytest.fail("a rank was started"))
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY.read_text() + "reliability: {on_drift: ignore}\n")
    cases = [
        (["--recipe", str(TINY), "--nproc", "8", "--timeout-s", "0"], "--timeout-s must be a positive integer"),
        (["--recipe", str(TINY), "--nproc", "8", "--check-replicas", "-1"], "--check-replicas must be >= 0"),
        (["--recipe", str(TINY), "--nproc", "8", "--on-drift", "ignore"], "invalid choice"),
        (["--recipe", str(recipe), "--nproc", "8"], "reliability.on_drift must be stop or warn, got 'ignore'"),
    ]
    for argv, expected in cases:
        with pytest.raises(SystemExit) if "invalid choice" in expected else nullcontext():
            code = main(["train", *argv])
            assert code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], (argv, err)


def test_a_non_finite_loss_or_gradient_norm_is_named_with_its_step():
    from hybridpar.reliability.nonfinite import NonFiniteError, check_step
    from hybridpar.runtime.job import StepMetrics

    def metrics(loss, norm):
        return StepMetrics(step=7, loss=loss, grad_norm=norm, lr=1e-3, step_time_s=1.0, tokens_per_s=1.0)

    check_step(metrics(2.5, 1.0))
    for loss, norm, said in ((float("nan"), 1.0, "the loss is nan"), (2.5, float("inf"), "the gradient norm is inf"),
                             (float("-inf"), float("nan"), "the loss is -inf")):
        with pytest.raises(NonFiniteError, match=f"step 7: {said} .*weights after step 7 are not saved"):
            check_step(metrics(loss, norm))
