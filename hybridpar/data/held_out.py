"""Held-out data for evaluation: which sequences of an indexed dataset are kept out of training.

It is megatron's own split (Megatron-LM's ``--split 98,2,0``, GPTDatasetConfig.split): the
dataset's sequences are cut in file order, the first part trains and the last ``data.held_out``
share is the validation part, so data prepared here or for Megatron-LM/NeMo splits alike. Both
parts are then shuffled and cut into samples on their own by GPTDataset. Turning a held-out share
on therefore changes the training stream too (it no longer sees those sequences): a resumed run
must keep it (checkpoint_flags). Synthetic data needs no split: its held-out rows come from a
stream of their own (batches.SyntheticTokens.held_out).

Torch-free: the launcher checks a split before any rank starts.
"""
from __future__ import annotations

from hybridpar.errors import UsageError

# The share is handed to megatron as integer weights in millionths: its split parser reads digits
# and dots only (no exponent), so "0.00001" would be the shortest safe form and 1e-05 would break.
SCALE = 1_000_000


def split_weights(share: float) -> str:
    """megatron's ``split`` string: train, validation and test weights."""
    held = round(share * SCALE)
    return "1,0,0" if held == 0 else f"{SCALE - held},{held},0"


def split_counts(sequences: int, share: float) -> tuple[int, int]:
    """(training sequences, held-out sequences) as megatron's builder cuts them: each part's
    bounds are the normalised cumulative weights times the count, rounded
    (blended_megatron_dataset_builder._build_megatron_dataset_splits)."""
    held = round(share * SCALE)
    if held == 0:
        return sequences, 0
    weights = [(SCALE - held) / SCALE, held / SCALE]
    total = sum(weights)
    train_end = weights[0] / total
    held_end = train_end + weights[1] / total
    cut, end = int(round(train_end * float(sequences))), int(round(held_end * float(sequences)))
    return cut, end - cut


def check_split(prefix: str, share: float, seq_len: int) -> None:
    """One-line UsageError when ``share`` of PREFIX's sequences leaves either part unable to give
    a single sample of seq_len + 1 tokens."""
    from hybridpar.data.index_check import check_index, sequence_lengths

    check_index(prefix)
    check_parts(prefix, [int(n) for n in sequence_lengths(prefix)], share, seq_len)


def check_parts(where: str, lengths: list[int], share: float, seq_len: int) -> None:
    """The same check on the token counts of the sequences of ``where``, in file order."""
    n, need = len(lengths), seq_len + 1
    train, held = split_counts(n, share)
    if held == 0 or sum(lengths[train:train + held]) < need:
        least = 1 / n if n else 1.0
        raise UsageError(f"data.held_out {share:g} of the {n} sequences in {where} holds out "
                         f"{'none' if held == 0 else f'{held} with fewer than {need} tokens'}: raise it (one sequence "
                         f"is {least:.3g} of them) or prepare the data as more documents")
    if train == 0 or sum(lengths[:train]) < need:
        raise UsageError(f"data.held_out {share:g} of the {n} sequences in {where} leaves {train} to train on, "
                         f"fewer than {need} tokens: lower it")
