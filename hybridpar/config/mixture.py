"""A data mixture's shares as whole samples: what the recipe's checks (a weight too small to be
sampled) and the mixed source (hybridpar/data/blend.py) both need, without torch or numpy."""
from __future__ import annotations

BLOCK = 4096  # samples per block; each dataset's share is exact to 1/BLOCK in every block


def block_counts(weights: list[float], block: int = BLOCK) -> list[int]:
    """Each dataset's samples in a block: weight share x block, by largest remainder (sums to block)."""
    total = sum(weights)
    exact = [w / total * block for w in weights]
    counts = [int(e) for e in exact]
    by_remainder = sorted(range(len(weights)), key=lambda k: (counts[k] - exact[k], k))
    for k in by_remainder[: block - sum(counts)]:
        counts[k] += 1
    return counts
