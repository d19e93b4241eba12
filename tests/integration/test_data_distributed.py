"""With torch.distributed initialized, megatron's builder is collective (rank 0 builds the index
cache, the others load it): two gloo ranks must still see exactly the batches of a lone process."""
import subprocess
import sys

import torch

from hybridpar.data import ByteTokenizer, IndexedTokens, prepare
from hybridpar.data.embedded import corpus_files

WORKER = r"""
import sys, torch, torch.distributed as dist
from hybridpar.data import IndexedTokens, replica_rows
prefix, store, rank, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
src = IndexedTokens(prefix, 32, 8, seed=3)
torch.save({step: replica_rows(src.global_batch(step), rank, 2) for step in (1, 2, 50)}, out)
dist.destroy_process_group()
"""


def test_two_ranks_with_torch_distributed_get_their_slices_of_the_lone_process_batches(tmp_path):
    text = open(corpus_files()[2], encoding="ascii").read()[:20_000]
    (tmp_path / "tempest.txt").write_text(text)
    prefix = str(tmp_path / "ds")
    prepare([str(tmp_path / "tempest.txt")], prefix, ByteTokenizer(), progress=False)
    store = str(tmp_path / "store")
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, prefix, store, str(r), str(tmp_path / f"r{r}.pt")])
        for r in range(2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    lone = IndexedTokens(prefix, 32, 8, seed=3)
    got = [torch.load(tmp_path / f"r{r}.pt") for r in range(2)]
    for step in (1, 2, 50):
        assert torch.equal(torch.cat([got[0][step], got[1][step]]), lone.global_batch(step))
    # megatron's default cache, shared by the ranks: PREFIX/cache/GPTDataset_indices
    assert list((tmp_path / "ds" / "cache" / "GPTDataset_indices").glob("*shuffle_index.npy"))
