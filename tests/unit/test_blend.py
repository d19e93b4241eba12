"""A weighted mixture of indexed datasets (hybridpar/data/blend.py, recipe ``data.blend``): exact shares in every
block, each dataset read in its own order without skipping or repeating, a pure function of (seed, step)."""
import pytest
import torch

from hybridpar.config.recipe import recipe_from_dict
from hybridpar.data import IndexedTokens, load_tokenizer, make_token_source, prepare
from hybridpar.data.blend import BLOCK, BlendedTokens, block_counts
from hybridpar.data.embedded import corpus_files
from hybridpar.errors import UsageError
from play_datasets import play_dataset
from test_data_prepare import make_tokenizer_json

SEQ, BATCH = 32, 8


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """Three datasets of ten documents each, cut from the three plays (byte tokenizer)."""
    root = tmp_path_factory.mktemp("blend")
    return [play_dataset(root, f"play{n}", n, 10, 4000, 900, lambda i: 600)[0] for n in range(3)]


def test_block_counts_are_the_shares_rounded_by_largest_remainder():
    assert block_counts([0.7, 0.3]) == [2867, 1229]  # 2867.2 and 1228.8
    assert block_counts([1, 1, 1]) == [1366, 1365, 1365]
    assert block_counts([5, 0.001]) == [4095, 1]  # 4095.18 and 0.82: the larger remainder gets the last sample
    assert block_counts([5, 0.0001]) == [BLOCK, 0]
    assert sum(block_counts([0.13, 0.29, 0.58, 0.001])) == BLOCK


def test_every_block_holds_each_dataset_exactly_its_share_read_in_its_own_order(parts):
    sources = [IndexedTokens(p, SEQ, BATCH, seed=1) for p in parts]
    blend = BlendedTokens(sources, [0.5, 0.3, 0.2], seed=1)
    seen = {0: [], 1: [], 2: []}
    for i in range(2 * BLOCK):
        k, j = blend.origin(i)
        seen[k].append(j)
    for k, count in enumerate(block_counts([0.5, 0.3, 0.2])):
        assert seen[k] == list(range(2 * count))  # no sample skipped or repeated, in each dataset's order
        assert sum(1 for i in range(BLOCK) if blend.origin(i)[0] == k) == count
    for i in (0, 1, 77, BLOCK + 5):
        k, j = blend.origin(i)
        assert torch.equal(blend.sample(i), sources[k].sample(j))


def test_batches_are_a_pure_function_of_seed_and_step(parts):
    def make(seed):
        return make_token_source("indexed", seq_len=SEQ, global_batch_size=BATCH, model_vocab=320, seed=seed,
                                 blend={parts[0]: 2, parts[1]: 1})

    a, b = make(0), make(0)
    for step in (5, 1, 3):
        assert torch.equal(a.global_batch(step), b.global_batch(step))
    assert torch.equal(a.rows(2, 3, 6), a.global_batch(2)[3:6])
    assert not torch.equal(a.global_batch(1), make(1).global_batch(1))
    assert a.global_batch(1).shape == (BATCH, SEQ + 1)


def test_the_held_out_parts_are_mixed_by_the_same_weights(parts):
    blend = make_token_source("indexed", seq_len=SEQ, global_batch_size=BATCH, model_vocab=320, held_out=0.2,
                              blend={parts[0]: 1, parts[1]: 1, parts[2]: 2})
    held = blend.held_out_source()
    assert held.counts == blend.counts
    for k, part in enumerate(held.sources):
        assert list(part.dataset.indices) == [8, 9]  # the last 2 of each dataset's 10 documents
        assert list(blend.sources[k].dataset.indices) == list(range(8))
    assert make_token_source("indexed", seq_len=SEQ, global_batch_size=BATCH, model_vocab=320,
                             blend={parts[0]: 1, parts[1]: 1}).held_out_source() is None


def test_datasets_of_different_tokenizers_are_not_mixed(parts, tmp_path):
    tokenizer = tmp_path / "tokenizer.json"
    make_tokenizer_json(tokenizer)
    (tmp_path / "doc.txt").write_text(open(corpus_files()[0], encoding="ascii").read()[:3000])
    prepare([str(tmp_path / "doc.txt")], str(tmp_path / "bpe"), load_tokenizer(str(tokenizer)), progress=False)
    with pytest.raises(UsageError, match="data.blend mixes datasets of different tokenizers: .*play0 \\(byte, vocab 257\\)"):
        make_token_source("indexed", seq_len=SEQ, global_batch_size=BATCH, model_vocab=320,
                          blend={parts[0]: 1, str(tmp_path / "bpe"): 1})


@pytest.mark.parametrize("data, message", [
    ({"source": "embedded", "blend": {"a": 1}}, "data.blend mixes indexed datasets: set data.source indexed"),
    ({"source": "indexed", "path": "a", "blend": {"b": 1}}, "data.path and data.blend both name the data"),
    ({"source": "indexed", "blend": ["a", "b"]}, "data.blend must map each dataset prefix to its weight"),
    ({"source": "indexed", "blend": {}}, "data.blend must map each dataset prefix to its weight, e.g. {data/web: 0.7"),
    ({"source": "indexed"}, "data.source indexed needs data.path (the .bin/.idx prefix) or data.blend"),
    ({"source": "indexed", "blend": {"a": 0.7, "b": -0.3}}, "data.blend weight of b must be a positive number, got -0.3"),
    ({"source": "indexed", "blend": {"a": 0.7, "b": True}}, "data.blend weight of b must be a positive number"),
    ({"source": "indexed", "blend": {"a": 1, "b": 1e-5}}, "data.blend weight of b is below 1/4096 of the total"),
])
def test_blend_settings_are_checked(data, message):
    recipe = recipe_from_dict({"model": "tiny", "train": {"global_batch": 16, "seq_len": 32}, "data": data})
    assert any(message in p for p in recipe.problems()), recipe.problems()
