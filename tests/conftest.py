"""Shared pytest fixtures."""
import pytest


@pytest.fixture
def no_ranks_may_start(monkeypatch):
    """Fail the test if anything creates a process group or starts a rank (bad input must not)."""
    import torch.distributed as dist

    from hybridpar import launch

    def forbidden(*a, **k):
        raise AssertionError("a process group or a rank was started")

    monkeypatch.setattr(dist, "init_process_group", forbidden)
    monkeypatch.setattr(launch, "launch_local", forbidden)
    monkeypatch.setattr(launch, "init_distributed", forbidden)
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
