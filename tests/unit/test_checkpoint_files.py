"""Checkpoint files without processes: finding, verifying, damage, resharding math, safe loading.

A helper writes checkpoints in the on-disk format from known full tensors, split over TP and
DP the way a job would be; the multi-rank tests (test_checkpoint_resume.py) cover the real save
path through DeepSpeed.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from hybridpar.checkpoint import CheckpointError, check_compatible, read_full_state, resolve, verify
from hybridpar.checkpoint.files import Manifest, commit, load_tensors, prune, rank_file_name, remove_partials, step_dir_name, write_tensors
from hybridpar.checkpoint.reshard import CheckpointReader, param_like
from hybridpar.runtime.model import shard_of_full
from hybridpar.topology.models import ModelSpec
from hybridpar.topology.plan import Plan

MODEL = ModelSpec(layers=1, hidden=8, ffn_hidden=12, heads=2, kv_heads=2, vocab=16, name="unit")
# canonical name -> (full shape, TP split dim or -1, gated)
PARAMS = {
    "embedding.word_embeddings.weight": ([16, 8], 0, False),
    "decoder.layers.0.mlp.linear_fc1.weight": ([24, 8], 0, True),
    "decoder.layers.0.mlp.linear_fc2.weight": ([8, 12], 1, False),
    "decoder.final_layernorm.weight": ([8], -1, False),
}
KEYS = ("param", "exp_avg", "exp_avg_sq")


def full_state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {c: {k: torch.randn(shape, generator=g) for k in KEYS} for c, (shape, _, _) in PARAMS.items()}


def meta(cname):
    shape, split, gated = PARAMS[cname]
    return {"full_shape": shape, "split": split, "gated": gated}


def write_checkpoint(save_dir: str, step: int, state: dict, tp: int = 1, dp: int = 1, model=MODEL, save_id=None) -> str:
    """A checkpoint as a tp x dp job would write it: each TP shard's flat elements split into dp
    contiguous ranges, one rank file per (dp, tp)."""
    save_id = save_id or f"id{step}"
    tmp_name = f"{step_dir_name(step)}.tmp-{save_id}"
    tmp = os.path.join(save_dir, tmp_name)
    os.makedirs(tmp)
    files = {}
    for d in range(dp):
        for t in range(tp):
            rank = d * tp + t
            fragments, index = {}, []
            for cname, tensors in state.items():
                if meta(cname)["split"] < 0 and t > 0:
                    continue
                shard = {k: shard_of_full(cname, param_like(meta(cname)), v, t, tp).reshape(-1) for k, v in tensors.items()}
                n = shard["param"].numel()
                lo, hi = n * d // dp, n * (d + 1) // dp
                if hi > lo:
                    fragments[cname] = {"start": lo, **{k: v[lo:hi].clone() for k, v in shard.items()}}
                    index.append([cname, t, 0, lo, hi - lo])
            header = {"step": step, "save_id": save_id, "rank": rank, "coord": {"dp": d, "pp": 0, "tp": t}}
            rec = write_tensors(os.path.join(tmp, rank_file_name(rank)), {"header": header, "fragments": fragments, "adam_step": step, "rng": {}})
            files[rank_file_name(rank)] = {"bytes": rec.bytes, "sha256": rec.sha256, "rank": rank,
                                           "coord": header["coord"], "fragments": index}
    plan = Plan(model=model, seq_len=8, global_batch=dp, tp=tp, dp=dp, precision="fp32")
    manifest = Manifest(step=step, save_id=save_id, plan=plan.to_dict(), files=files,
                        params={c: meta(c) for c in state}, adam_step=step)
    with open(os.path.join(tmp, "manifest.json"), "w") as f:
        f.write(manifest.to_json())
    return commit(save_dir, tmp_name, step, save_id)


def assert_same(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for c in a:
        for k in KEYS:
            assert torch.equal(a[c][k], b[c][k]), (c, k)


# --- layout independence ---------------------------------------------------------------------
@pytest.mark.parametrize("tp,dp", [(1, 1), (1, 3), (2, 2), (4, 1)])
def test_full_state_is_reassembled_exactly_from_any_layout(tmp_path, tp, dp):
    state = full_state()
    step_dir = write_checkpoint(str(tmp_path), 5, state, tp=tp, dp=dp)
    assert_same(read_full_state(step_dir), state)


@pytest.mark.parametrize("saved_tp,new_tp", [(2, 4), (4, 2), (1, 2), (2, 1)])
def test_tp_reshard_gives_the_new_layouts_shards(tmp_path, saved_tp, new_tp):
    state = full_state(1)
    reader = CheckpointReader(write_checkpoint(str(tmp_path), 3, state, tp=saved_tp, dp=2))
    for cname in PARAMS:
        for t in range(new_tp):
            want = shard_of_full(cname, param_like(meta(cname)), state[cname]["exp_avg"], t, new_tp)
            assert torch.equal(reader.tensor(cname, "exp_avg", new_tp, t), want), (cname, t)
            flat = want.reshape(-1)
            lo, hi = flat.numel() // 3, flat.numel() - 1
            assert torch.equal(reader.flat_range(cname, "exp_avg", new_tp, t, lo, hi), flat[lo:hi])


def test_gated_fc1_keeps_gate_and_up_halves_apart():
    """SwiGLU's fc1 shard is [gate part; up part]: a plain row split would mix them."""
    full = torch.arange(24 * 8, dtype=torch.float32).view(24, 8)
    shard = shard_of_full("fc1", param_like(meta("decoder.layers.0.mlp.linear_fc1.weight")), full, 1, 2)
    assert torch.equal(shard, torch.cat([full[6:12], full[18:24]]))


# --- finding -------------------------------------------------------------------------------
def test_resolve_follows_latest_and_ignores_partial_dirs(tmp_path):
    base = str(tmp_path)
    write_checkpoint(base, 2, full_state())
    write_checkpoint(base, 4, full_state())
    assert open(os.path.join(base, "latest")).read().strip() == "step-000004"
    os.makedirs(os.path.join(base, "step-000006.tmp-dead"))  # a save killed mid-write
    open(os.path.join(base, "step-000006.tmp-dead", rank_file_name(0)), "wb").write(b"partial")
    assert resolve(base) == os.path.join(base, "step-000004")
    assert resolve(os.path.join(base, "step-000002")) == os.path.join(base, "step-000002")
    os.remove(os.path.join(base, "latest"))  # killed between the rename and the pointer update
    assert resolve(base) == os.path.join(base, "step-000004")
    with open(os.path.join(base, "latest"), "w") as f:
        f.write("step-000099\n")  # a pointer to nothing: fall back to the newest complete one
    assert resolve(base) == os.path.join(base, "step-000004")
    assert remove_partials(base) == ["step-000006.tmp-dead"]
    assert sorted(os.listdir(base)) == ["latest", "step-000002", "step-000004"]


def test_resolve_errors_name_the_directory(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve(str(tmp_path / "nope"))
    os.makedirs(tmp_path / "empty" / "step-000003.tmp-x")
    with pytest.raises(CheckpointError, match=r"no complete checkpoint in .*empty"):
        resolve(str(tmp_path / "empty"))


def test_saving_a_step_again_replaces_it_and_prune_keeps_the_newest(tmp_path):
    base = str(tmp_path)
    for step in (1, 2, 3):
        write_checkpoint(base, step, full_state(step))
    write_checkpoint(base, 2, full_state(7), save_id="again")
    assert_same(read_full_state(os.path.join(base, "step-000002")), full_state(7))
    assert open(os.path.join(base, "latest")).read().strip() == "step-000002"
    assert prune(base, 2) == [1]
    assert not any(".old-" in n for n in os.listdir(base))


# --- damage ----------------------------------------------------------------------------------
@pytest.fixture
def ckpt(tmp_path):
    return write_checkpoint(str(tmp_path), 4, full_state(), tp=2, dp=2)


def test_intact_checkpoint_verifies(ckpt):
    assert verify(ckpt).step == 4


def test_truncated_file_is_named(ckpt):
    path = os.path.join(ckpt, rank_file_name(1))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 10)
    with pytest.raises(CheckpointError, match=r"rank-00001\.pt has \d+ bytes.*truncated"):
        verify(ckpt)


def test_corrupted_file_is_named(ckpt):
    path = os.path.join(ckpt, rank_file_name(2))
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x01  # one flipped bit, same size
    open(path, "wb").write(bytes(data))
    with pytest.raises(CheckpointError, match=r"rank-00002\.pt fails its sha256 check"):
        verify(ckpt)


def test_missing_shard_is_named(ckpt):
    os.remove(os.path.join(ckpt, rank_file_name(3)))
    with pytest.raises(CheckpointError, match=r"rank-00003\.pt is missing"):
        verify(ckpt)


def test_shard_from_another_step_is_named(tmp_path):
    base = str(tmp_path)
    old = write_checkpoint(base, 2, full_state(2), tp=2, dp=2)
    new = write_checkpoint(base, 4, full_state(4), tp=2, dp=2)
    shutil.copy(os.path.join(old, rank_file_name(1)), os.path.join(new, rank_file_name(1)))
    with pytest.raises(CheckpointError, match=r"rank-00001\.pt (has \d+ bytes|fails its sha256)"):
        verify(new)
    # Even with a manifest rewritten to match the stray file, its header gives it away.
    m = json.load(open(os.path.join(new, "manifest.json")))
    from hybridpar.checkpoint.files import sha256_of

    path = os.path.join(new, rank_file_name(1))
    m["files"][rank_file_name(1)].update(bytes=os.path.getsize(path), sha256=sha256_of(path))
    json.dump(m, open(os.path.join(new, "manifest.json"), "w"))
    with pytest.raises(CheckpointError, match=r"rank-00001\.pt belongs to step 2"):
        read_full_state(new)


def test_corrupted_manifest_is_named(ckpt):
    path = os.path.join(ckpt, "manifest.json")
    open(path, "w").write(open(path).read()[:-20])
    with pytest.raises(CheckpointError, match=r"manifest\.json: not valid JSON"):
        verify(ckpt)


def test_fragment_gap_is_an_error(ckpt):
    """A manifest whose index lacks one DP range (a rank's file left out of it)."""
    m = json.load(open(os.path.join(ckpt, "manifest.json")))
    del m["files"][rank_file_name(2)]  # dp 1, tp 0
    json.dump(m, open(os.path.join(ckpt, "manifest.json"), "w"))
    with pytest.raises(CheckpointError, match=r"lacks elements \d+\.\.\d+ of param of .* \(TP rank 0 of 2"):
        read_full_state(ckpt)


def test_checkpoint_of_another_model_is_refused(ckpt):
    other = Plan(model=ModelSpec(layers=2, hidden=8, ffn_hidden=12, heads=2, kv_heads=2, vocab=16), seq_len=8, global_batch=1)
    with pytest.raises(CheckpointError, match=r"another model: layers 1 \(checkpoint\) vs 2 \(this run\)"):
        check_compatible(verify(ckpt), other, ckpt)
    same = Plan(model=MODEL.__class__(**{**MODEL.to_dict(), "name": "renamed"}), seq_len=64, global_batch=4, tp=4)
    check_compatible(verify(ckpt), same, ckpt)  # names, sequence length and layout may differ


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch /tmp/hybridpar-checkpoint-pwned",))


def test_loading_never_runs_code_from_the_file(tmp_path):
    marker = "/tmp/hybridpar-checkpoint-pwned"
    if os.path.exists(marker):
        os.remove(marker)
    path = str(tmp_path / "evil.pt")
    torch.save({"header": {}, "x": _Payload()}, path)
    with pytest.raises(CheckpointError, match=r"evil\.pt cannot be loaded safely"):
        load_tensors(path)
    assert not os.path.exists(marker)
