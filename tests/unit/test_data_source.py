"""The megatron GPTDataset source: real samples, deterministic in (seed, step), disjoint DP slices, exact resume."""
import os

import pytest
import torch

from hybridpar.data import ByteTokenizer, IndexedTokens, SyntheticTokens, make_token_source, prepare, replica_rows
from hybridpar.data.embedded import corpus_files
from hybridpar.errors import UsageError
from hybridpar.topology.layout import RankLayout

SEQ, BATCH = 32, 8


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Eight documents of different lengths cut from Hamlet, prepared with the byte tokenizer."""
    root = tmp_path_factory.mktemp("corpus")
    text = open(corpus_files()[0], encoding="ascii").read()
    docs, start = [], 5000
    for i in range(8):
        docs.append(text[start : start + 300 + 97 * i])
        start += 2000
    paths = []
    for i, doc in enumerate(docs):
        paths.append(str(root / f"doc{i}.txt"))
        open(paths[-1], "w").write(doc)
    prepare(paths, str(root / "ds"), ByteTokenizer(), progress=False)
    return str(root / "ds"), docs


def source(prefix, seed=0, batch=BATCH):
    return IndexedTokens(prefix, SEQ, batch, seed=seed)


def test_rows_are_real_text_spans_with_end_of_document_tokens(corpus):
    prefix, docs = corpus
    src = source(prefix)
    batch = src.global_batch(1)
    assert batch.shape == (BATCH, SEQ + 1) and batch.dtype == torch.long
    for row in batch.tolist():
        pieces = bytes(t if t < 256 else 0 for t in row).split(b"\0")  # split at end-of-document
        assert all(any(p.decode() in d for d in docs) for p in pieces)
    assert src.vocab_size == 257 and src.tokenizer.name == "byte"


def test_batches_are_a_pure_function_of_seed_and_step(corpus):
    prefix, _ = corpus
    a, b = source(prefix), source(prefix)
    for step in (3, 1, 7, 2):  # any order of calls
        assert torch.equal(a.global_batch(step), b.global_batch(step))
    assert not torch.equal(a.global_batch(1), a.global_batch(2))
    assert not torch.equal(a.global_batch(1), source(prefix, seed=1).global_batch(1))


def test_resumed_source_continues_at_the_exact_next_sample(corpus):
    prefix, _ = corpus
    n = 4
    first = source(prefix)
    straight = [first.global_batch(k) for k in range(1, 2 * n + 1)]
    resumed = source(prefix)  # a new process after a checkpoint at step n
    for k in range(n + 1, 2 * n + 1):
        assert torch.equal(resumed.global_batch(k), straight[k - 1])
    # sample i of the stream is row i % B of step i // B + 1: no sample skipped or repeated
    for i in range(n * BATCH, 2 * n * BATCH):
        assert torch.equal(resumed.sample(i), straight[i // BATCH][i % BATCH])


def test_epochs_wrap_with_the_same_samples_in_a_new_order(corpus):
    prefix, _ = corpus
    src = source(prefix)
    n = src.samples_per_epoch
    assert 20 < n < 200  # the corpus is ~4.9k tokens: steps below cross several epochs
    epoch0 = torch.stack([src.sample(i) for i in range(n)])
    epoch1 = torch.stack([src.sample(i) for i in range(n, 2 * n)])
    assert sorted(map(tuple, epoch0.tolist())) == sorted(map(tuple, epoch1.tolist()))
    assert not torch.equal(epoch0, epoch1)
    far = src.global_batch(10 * n // BATCH + 3)
    assert torch.equal(far, source(prefix).global_batch(10 * n // BATCH + 3))


def test_dp_replicas_get_disjoint_slices_and_all_ranks_of_a_replica_agree(corpus):
    prefix, _ = corpus
    layout = RankLayout(tp=2, cp=1, pp=2, dp=2)
    step = 5
    rows_of_rank = {}
    for rank in range(layout.world_size):  # every rank builds its own source, as separate processes do
        dp_rank = layout.coord(rank).dp
        rows_of_rank[rank] = replica_rows(source(prefix).global_batch(step), dp_rank, layout.dp)
    full = source(prefix).global_batch(step)
    per_replica = {}
    for rank, rows in rows_of_rank.items():
        dp_rank = layout.coord(rank).dp
        per_replica.setdefault(dp_rank, rows)
        assert torch.equal(rows, per_replica[dp_rank])  # TP and PP ranks of a replica agree
    assert torch.equal(torch.cat([per_replica[d] for d in range(layout.dp)]), full)
    assert BATCH // layout.dp == per_replica[0].shape[0]
    for dp in (1, 2, 4, 8):
        slices = [replica_rows(full, d, dp) for d in range(dp)]
        assert torch.equal(torch.cat(slices), full)
        assert sum(s.shape[0] for s in slices) == BATCH


def test_make_token_source_kinds(corpus, tmp_path):
    prefix, _ = corpus
    synthetic = make_token_source("synthetic", seq_len=SEQ, global_batch_size=BATCH, model_vocab=320)
    assert isinstance(synthetic, SyntheticTokens) and synthetic.vocab_size == 320
    indexed = make_token_source("indexed", seq_len=SEQ, global_batch_size=BATCH, model_vocab=320, path=prefix)
    assert torch.equal(indexed.global_batch(2), source(prefix).global_batch(2))
    embedded = make_token_source(
        "embedded", seq_len=SEQ, global_batch_size=BATCH, model_vocab=320, data_dir=str(tmp_path)
    )
    again = make_token_source("embedded", seq_len=SEQ, global_batch_size=BATCH, model_vocab=320, data_dir=str(tmp_path))
    assert torch.equal(embedded.global_batch(9), again.global_batch(9))
    assert embedded.samples_per_epoch == (375_814 - 1) // SEQ
    assert len([f for f in tmp_path.iterdir() if f.suffix in (".bin", ".idx")]) == 2  # prepared once
    (cached,) = tmp_path.glob("embedded-*.bin")
    whole = cached.read_bytes()
    damaged = tmp_path / "damaged"
    damaged.write_bytes(whole[:1000])
    os.replace(damaged, cached)  # a new file: the sources above keep their mappings of the old one
    with pytest.raises(UsageError, match="the .bin is truncated"):
        IndexedTokens(str(cached.with_suffix("")), SEQ, BATCH)
    repaired = make_token_source("embedded", seq_len=SEQ, global_batch_size=BATCH, model_vocab=320, data_dir=str(tmp_path))
    assert cached.read_bytes() == whole and torch.equal(repaired.global_batch(9), embedded.global_batch(9))
    with pytest.raises(UsageError, match="tokenizer/vocab mismatch"):
        make_token_source("embedded", seq_len=SEQ, global_batch_size=BATCH, model_vocab=256, data_dir=str(tmp_path))
    with pytest.raises(UsageError, match="unknown data source 'books'"):
        make_token_source("books", seq_len=SEQ, global_batch_size=BATCH, model_vocab=320)
    with pytest.raises(UsageError, match="is missing"):
        make_token_source("indexed", seq_len=SEQ, global_batch_size=BATCH, model_vocab=320, path=str(tmp_path / "nope"))
    with pytest.raises(UsageError, match="fewer than seq_len"):
        IndexedTokens(prefix, 10_000, BATCH)


def test_a_replica_reads_only_its_own_rows(corpus):
    """``rows(step, start, stop)`` equals that slice of the global batch, for both sources, and
    ``replica_batch`` asks its source for its replica's samples and no others."""
    from hybridpar.data import replica_batch

    prefix, _ = corpus
    for src in (source(prefix), SyntheticTokens(SEQ, BATCH, 320, seed=0)):
        full = src.global_batch(3)
        assert torch.equal(src.rows(3, 2, 6), full[2:6])
    indexed, read = source(prefix), []
    real = indexed.sample
    indexed.sample = lambda i: read.append(i) or real(i)
    mine = replica_batch(indexed, 2, dp_rank=1, dp=4)
    assert read == [BATCH + 2, BATCH + 3]  # step 2's samples 2 and 3 of 8: replica 1 of 4
    assert torch.equal(mine, replica_rows(source(prefix).global_batch(2), 1, 4))


def test_the_prefetcher_builds_the_next_step_while_this_one_runs(corpus):
    from hybridpar.data import BatchPrefetcher, replica_batch

    prefix, _ = corpus
    src, built = source(prefix), []
    real = src.rows
    src.rows = lambda step, a, b: built.append(step) or real(step, a, b)
    fetch = BatchPrefetcher(src, dp_rank=0, dp=2, device=torch.device("cpu"))
    try:
        first = fetch.rows(5)
        fetch._pending[1].result()  # step 6, built in the background after step 5 was handed out
        assert built == [5, 6]
        second = fetch.rows(6)  # taken from the prefetch, not rebuilt
        assert built.count(6) == 1  # step 7 may already be under way in the background
        assert torch.equal(first, replica_batch(source(prefix), 5, 0, 2))
        assert torch.equal(second, replica_batch(source(prefix), 6, 0, 2))
        assert torch.equal(fetch.rows(2), replica_batch(source(prefix), 2, 0, 2))  # a jump: built in the foreground
    finally:
        fetch.close()
