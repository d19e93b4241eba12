"""The batch contract (see hybridpar/data/__init__.py) and the synthetic source used by tests."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class TokenSource(Protocol):
    seq_len: int
    global_batch_size: int
    vocab_size: int

    def global_batch(self, step: int) -> torch.Tensor: ...


def replica_rows(batch: torch.Tensor, dp_rank: int, dp: int) -> torch.Tensor:
    rows = batch.shape[0]
    if rows % dp:
        raise ValueError(f"global batch {rows} not divisible by dp {dp}")
    per = rows // dp
    return batch[dp_rank * per : (dp_rank + 1) * per]


@dataclass
class SyntheticTokens:
    """Learnable synthetic sequences: each row repeats a short random motif, with a little noise.

    Deterministic in (seed, step) through a generator seeded per step, so it needs no state.
    """

    seq_len: int
    global_batch_size: int
    vocab_size: int
    seed: int = 0
    motif_len: int = 8
    noise: float = 0.05

    def global_batch(self, step: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        rows, cols = self.global_batch_size, self.seq_len + 1
        motifs = torch.randint(0, self.vocab_size, (rows, self.motif_len), generator=gen)
        reps = -(-cols // self.motif_len)
        tokens = motifs.repeat(1, reps)[:, :cols]
        noise = torch.rand(rows, cols, generator=gen) < self.noise
        random_tokens = torch.randint(0, self.vocab_size, (rows, cols), generator=gen)
        return torch.where(noise, random_tokens, tokens)
