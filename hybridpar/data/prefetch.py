"""The next step's rows, built on a worker thread while this step trains.

``BatchPrefetcher.rows(step)`` returns this replica's rows of ``step`` (``replica_batch``) on the
rank's device and starts building ``step + 1`` in the background. Batches are a pure function of
(seed, step), so prefetching changes no number: a step that was not prefetched (the first, or
after a jump) is built in the foreground. On CUDA the rows are staged in pinned host memory and
copied without blocking.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch

from hybridpar.data.batches import replica_batch


class BatchPrefetcher:
    def __init__(self, source, dp_rank: int, dp: int, device: torch.device):
        self.source, self.dp_rank, self.dp, self.device = source, dp_rank, dp, torch.device(device)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hybridpar-data")
        self._pending: tuple[int, Future] | None = None

    def _build(self, step: int) -> torch.Tensor:
        rows = replica_batch(self.source, step, self.dp_rank, self.dp)
        return rows.pin_memory() if self.device.type == "cuda" else rows

    def rows(self, step: int) -> torch.Tensor:
        if self._pending is not None and self._pending[0] == step:
            host = self._pending[1].result()
        else:
            host = self._build(step)
        self._pending = (step + 1, self._pool.submit(self._build, step + 1))
        return host.to(self.device, non_blocking=True)

    def close(self) -> None:
        self._pending = None
        self._pool.shutdown(wait=True, cancel_futures=True)
