"""The batch contract (see hybridpar/data/__init__.py) and the synthetic source used by tests."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import torch


class TokenSource(Protocol):
    seq_len: int
    global_batch_size: int
    vocab_size: int

    def rows(self, step: int, start: int, stop: int) -> torch.Tensor: ...

    def global_batch(self, step: int) -> torch.Tensor: ...


def _replica_range(rows: int, dp_rank: int, dp: int) -> tuple[int, int]:
    if rows % dp:
        raise ValueError(f"global batch {rows} not divisible by dp {dp}")
    per = rows // dp
    return dp_rank * per, (dp_rank + 1) * per


def replica_rows(batch: torch.Tensor, dp_rank: int, dp: int) -> torch.Tensor:
    start, stop = _replica_range(batch.shape[0], dp_rank, dp)
    return batch[start:stop]


def replica_batch(source, step: int, dp_rank: int, dp: int) -> torch.Tensor:
    """DP replica ``dp_rank``'s rows of step ``step``, built alone (no other replica's rows)."""
    start, stop = _replica_range(source.global_batch_size, dp_rank, dp)
    return source.rows(step, start, stop)


@dataclass
class SyntheticTokens:
    """Learnable synthetic sequences: each row repeats a short random motif, with a little noise.

    Row ``r`` of step ``s`` is a pure function of (seed, s, r), drawn from a generator seeded by
    all three: any range of rows is built without the others, and it needs no state.
    ``held_out()`` draws from another stream (``stream`` 1): rows training never sees.
    """

    seq_len: int
    global_batch_size: int
    vocab_size: int
    seed: int = 0
    motif_len: int = 8
    noise: float = 0.05
    stream: int = 0  # 0: training rows; 1: held-out rows

    def held_out_source(self) -> "SyntheticTokens":
        return replace(self, stream=1)

    def global_batch(self, step: int) -> torch.Tensor:
        return self.rows(step, 0, self.global_batch_size)

    def rows(self, step: int, start: int, stop: int) -> torch.Tensor:
        return torch.stack([self._row(step, r) for r in range(start, stop)])

    def _row(self, step: int, row: int) -> torch.Tensor:
        key = (self.seed * 1_000_003 + step) * 1_000_033 + row
        gen = torch.Generator().manual_seed(key if self.stream == 0 else -1 - key)  # negative: never a training key
        cols, cpu = self.seq_len + 1, torch.device("cpu")
        motif = torch.randint(0, self.vocab_size, (self.motif_len,), generator=gen, device=cpu)
        tokens = motif.repeat(-(-cols // self.motif_len))[:cols]
        noise = torch.rand(cols, generator=gen, device=cpu) < self.noise
        random_tokens = torch.randint(0, self.vocab_size, (cols,), generator=gen, device=cpu)
        return torch.where(noise, random_tokens, tokens)
