"""Shared pytest fixtures, and the strict device mode every rank of the suite runs in.

``HYBRIDPAR_STRICT_DEVICE=1`` (hybridpar/compat/cpu.py): every rank the tests start, through hybridpar's
CPU launcher (``hybridpar train --nproc``, multirank.py's workers), torchrun or a one-process worker, computes on the CPU while tensors created
without a device land on ``meta``, so a missing ``device=`` fails here as it would on a GPU.
"""
import os

import pytest

os.environ.setdefault("HYBRIDPAR_STRICT_DEVICE", "1")


@pytest.fixture
def no_ranks_may_start(monkeypatch):
    """Fail the test if anything creates a process group or starts a rank (bad input must not)."""
    import torch.distributed as dist

    from hybridpar.launch import local as launch

    def forbidden(*a, **k):
        raise AssertionError("a process group or a rank was started")

    monkeypatch.setattr(dist, "init_process_group", forbidden)
    monkeypatch.setattr(launch, "launch_local", forbidden)
    monkeypatch.setattr(launch, "init_distributed", forbidden)
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture(scope="session")
def tiny_8_ranks(tmp_path_factory):
    """(run directory, finished process) of tests/tiny_8_ranks.py's run, started once per session."""
    import tiny_8_ranks

    out = tmp_path_factory.mktemp("tiny_8_ranks") / "run"
    return out, tiny_8_ranks.run(out)
