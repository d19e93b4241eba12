"""Held-out data for evaluation (hybridpar/data/held_out.py): megatron's own train/validation split of an
indexed dataset, predicted before any rank starts, and synthetic held-out rows from a stream of their own."""
import pytest
import torch

from hybridpar.config.recipe import recipe_from_dict
from hybridpar.data import IndexedTokens, SyntheticTokens
from hybridpar.data.held_out import check_split, split_counts, split_weights
from hybridpar.errors import UsageError
from play_datasets import play_dataset

SEQ, BATCH = 32, 4


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    """Twenty documents of 200-390 characters cut from Hamlet, each a sequence of its own."""
    return play_dataset(tmp_path_factory.mktemp("held"), "ds", 0, 20, 3000, 1000, lambda i: 200 + 10 * i)


@pytest.mark.parametrize("share", [0.05, 0.1, 1 / 3, 0.5, 0.74])
def test_the_split_predicted_before_any_rank_is_the_one_megatron_builds(docs, share):
    prefix, _ = docs
    src = IndexedTokens(prefix, SEQ, BATCH, held_out=share)
    train, held = split_counts(20, share)
    assert list(src.dataset.indices) == list(range(train))
    assert list(src.held_out_source().dataset.indices) == list(range(train, train + held))
    assert held >= 1 and train + held == 20


def test_held_out_rows_come_from_the_held_out_documents_only(docs):
    prefix, texts = docs
    src = IndexedTokens(prefix, SEQ, BATCH, held_out=0.1)  # the last 2 documents
    held = src.held_out_source()
    for k in (1, 2):
        for row in held.global_batch(k).tolist():
            for piece in bytes(t if t < 256 else 0 for t in row).split(b"\0"):
                assert any(piece.decode() in t for t in texts[18:]), piece
    for step in range(1, 6):  # and training rows from the others
        for row in src.global_batch(step).tolist():
            for piece in bytes(t if t < 256 else 0 for t in row).split(b"\0"):
                if len(piece) > 8:
                    assert any(piece.decode() in t for t in texts[:18]), piece
    assert torch.equal(held.global_batch(1), IndexedTokens(prefix, SEQ, BATCH, held_out=0.1).held_out_source().global_batch(1))
    assert IndexedTokens(prefix, SEQ, BATCH).held_out_source() is None


def test_split_weights_are_digits_megatron_parses():
    assert split_weights(0) == "1,0,0"
    assert split_weights(0.05) == "950000,50000,0"
    assert split_weights(1e-5) == "999990,10,0"  # no exponent: megatron reads digits and dots only


def test_a_share_that_holds_out_nothing_or_everything_is_refused_in_one_line(docs):
    prefix, _ = docs
    with pytest.raises(UsageError, match="of the 20 sequences in .* holds out none: raise it"):
        check_split(prefix, 0.01, SEQ)
    with pytest.raises(UsageError, match="leaves 0 to train on"):
        check_split(prefix, 0.99, SEQ)
    with pytest.raises(UsageError, match="holds out 1 with fewer than 1001 tokens"):
        check_split(prefix, 0.05, 1000)
    check_split(prefix, 0.05, SEQ)


def test_synthetic_held_out_rows_are_a_stream_of_their_own():
    train = SyntheticTokens(SEQ, 8, 320, seed=0)
    held = train.held_out_source()
    seen = {tuple(r) for step in range(1, 50) for r in train.global_batch(step).tolist()}
    assert not seen & {tuple(r) for r in held.global_batch(1).tolist()}
    assert torch.equal(held.global_batch(1), SyntheticTokens(SEQ, 8, 320, seed=0).held_out_source().global_batch(1))
    assert torch.equal(held.rows(1, 2, 5), held.global_batch(1)[2:5])


@pytest.mark.parametrize("data, eval_, message", [
    ({"source": "embedded"}, {"every": 10}, "eval.every 10 needs held-out data"),
    ({"source": "synthetic", "held_out": 0.1}, {}, "synthetic data draws its held-out rows"),
    ({"source": "embedded", "held_out": -0.1}, {}, "from 0 to below 1"),
    ({"source": "embedded", "held_out": 0.4}, {"every": -1}, "eval.every must be >= 0"),
    ({"source": "synthetic"}, {"every": 5, "batches": 0}, "eval.batches must be a positive integer"),
])
def test_recipe_eval_settings_are_checked(data, eval_, message):
    recipe = recipe_from_dict({"model": "tiny", "train": {"global_batch": 16, "seq_len": 32}, "data": data, "eval": eval_})
    assert any(message in p for p in recipe.problems()), recipe.problems()


def test_recipe_eval_settings_that_run():
    for data, eval_ in (({"source": "synthetic"}, {"every": 5}), ({"source": "embedded", "held_out": 0.34}, {"every": 5}),
                        ({"source": "embedded", "held_out": 0.34}, {})):
        recipe = recipe_from_dict({"model": "tiny", "train": {"global_batch": 16, "seq_len": 32}, "data": data, "eval": eval_})
        assert recipe.problems() == []
