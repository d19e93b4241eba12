"""With torch.distributed initialized, megatron's builder is collective (rank 0 builds the index
cache, the others load it): two gloo ranks must still see exactly the batches of a lone process,
for one dataset and for a blend of two; and a blended run with held-out data trains through the
command line."""
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from hybridpar.data import ByteTokenizer, IndexedTokens, make_token_source, prepare
from hybridpar.data.embedded import corpus_files
from play_datasets import play_dataset

WORKER = r"""
import sys, torch, torch.distributed as dist
from hybridpar.data import IndexedTokens, make_token_source, replica_rows
prefix, store, rank, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
src = IndexedTokens(prefix, 32, 8, seed=3)
blend = make_token_source("indexed", seq_len=32, global_batch_size=8, model_vocab=320, seed=3,
                          blend={prefix: 0.6, prefix + "-b": 0.4})
torch.save({step: replica_rows(src.global_batch(step), rank, 2) for step in (1, 2, 50)}
           | {-step: replica_rows(blend.global_batch(step), rank, 2) for step in (1, 2, 50)}, out)
dist.destroy_process_group()
"""


def test_two_ranks_with_torch_distributed_get_their_slices_of_the_lone_process_batches(tmp_path):
    text = open(corpus_files()[2], encoding="ascii").read()[:20_000]
    (tmp_path / "tempest.txt").write_text(text)
    prefix = str(tmp_path / "ds")
    prepare([str(tmp_path / "tempest.txt")], prefix, ByteTokenizer(), progress=False)
    (tmp_path / "macbeth.txt").write_text(open(corpus_files()[1], encoding="ascii").read()[:20_000])
    prepare([str(tmp_path / "macbeth.txt")], prefix + "-b", ByteTokenizer(), progress=False)
    store = str(tmp_path / "store")
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, prefix, store, str(r), str(tmp_path / f"r{r}.pt")])
        for r in range(2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    lone = IndexedTokens(prefix, 32, 8, seed=3)
    got = [torch.load(tmp_path / f"r{r}.pt") for r in range(2)]
    blend = make_token_source("indexed", seq_len=32, global_batch_size=8, model_vocab=320, seed=3,
                              blend={prefix: 0.6, prefix + "-b": 0.4})
    for step in (1, 2, 50):
        assert torch.equal(torch.cat([got[0][step], got[1][step]]), lone.global_batch(step))
        assert torch.equal(torch.cat([got[0][-step], got[1][-step]]), blend.global_batch(step))
    # megatron's default cache, shared by the ranks: PREFIX/cache/GPTDataset_indices
    assert list((tmp_path / "ds" / "cache" / "GPTDataset_indices").glob("*shuffle_index.npy"))


def test_a_blended_run_with_held_out_data_trains_from_the_command_line(tmp_path):
    """Two datasets of five documents each (Macbeth and The Tempest), mixed 3:1, a fifth of each held
    out; 2 ranks (DP2) for 4 steps, evaluating after steps 2 and 4: every step logged, held-out losses
    where due, and the checkpoint records the blend and the split."""
    prefixes = [play_dataset(tmp_path, f"part{n}", play, 5, 3000, 4000, lambda i: 3000)[0] for n, play in enumerate((1, 2))]
    recipe = tmp_path / "blend.yaml"
    recipe.write_text("name: blend\nmodel: tiny\nparallel: {micro_batch: 2}\n"
                      "train: {global_batch: 8, seq_len: 32, steps: 4, lr: 1.0e-2, min_lr: 1.0e-3}\n"
                      f"data: {{source: indexed, held_out: 0.2, blend: {{{prefixes[0]}: 3, {prefixes[1]}: 1}}}}\n"
                      "eval: {every: 2}\ncheckpoint: {save: true}\n")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(root))
    proc = subprocess.run([sys.executable, "-m", "hybridpar", "train", "--recipe", str(recipe), "--nproc", "2",
                           "--out", str(tmp_path / "run"), "--no-progress"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert ["eval_loss" in r for r in records] == [False, True, False, True]
    manifest = json.loads((tmp_path / "run" / "ckpt" / "step-000004" / "manifest.json").read_text())
    assert manifest["data"] == {"held_out": 0.2, "blend": {prefixes[0]: 3.0, prefixes[1]: 1.0}}
