"""Hugging Face in and out without process groups (issue 16 §5): the name/slice mapping against
real transformers models, TP shards read by slices, the byte tokenizer's equivalent, bad input.

- A random tiny LlamaForCausalLM (GQA, untied and tied) saved with save_pretrained, read back
  through hf_import's slices into canonical tensors, gives transformers' logits in
  hybridpar.llama_ref (fp32, <= 1e-5); each TP shard read by slices equals model.shard_of_full.
- The byte tokenizer rebuilt with `tokenizers` loads with AutoTokenizer and encodes/decodes
  like hybridpar's ByteTokenizer.
- Bad input to `hybridpar export-hf` and `hybridpar train --init-from-hf`: one line, exit 2,
  before any rank starts, nothing written.
"""
from __future__ import annotations

import json
import os
import pytest
import torch

from hf_models import TINY, canonical_from_hf, hf_logits, param_like, random_llama

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def saved(request, tmp_path_factory):
    model = random_llama(seed=1, tied=request.param)
    path = tmp_path_factory.mktemp("hf") / "model"
    model.save_pretrained(str(path))
    return model, str(path), request.param


def test_hf_weights_through_the_mapping_give_transformers_logits(saved):
    from hybridpar.runtime.llama_ref import LlamaReference

    model, path, tied = saved
    tokens = torch.randint(0, TINY.vocab, (2, 24), generator=torch.Generator().manual_seed(3))
    want = hf_logits(model, tokens)
    got = LlamaReference(TINY, canonical_from_hf(path, tied), tied=tied).logits(tokens)
    diff = (got - want).abs().max().item()
    print(f"HF -> canonical -> llama_ref, {'tied' if tied else 'untied'}: max |logit diff| {diff:.2e}, max |logit| {want.abs().max():.2f}")
    assert want.abs().max() > 3.0 and want.std() > 0.5  # sharp logits: a misplaced row would show
    assert diff <= 1e-5


def test_tp_shards_read_by_slices_equal_the_full_tensors_split(saved):
    from hybridpar.checkpoint.hf_layout import canonical_layout
    from hybridpar.runtime.model import shard_of_full

    _, path, tied = saved
    full = canonical_from_hf(path, tied)
    for tp in (2, 4):
        for tp_rank in range(tp):
            shards = canonical_from_hf(path, tied, tp, tp_rank)
            for c in canonical_layout(TINY, tied):
                want = shard_of_full(c.cname, param_like(c), full[c.cname], tp_rank, tp)
                assert torch.equal(shards[c.cname], want), (c.cname, tp, tp_rank)


def test_byte_tokenizer_equivalent_loads_with_autotokenizer(tmp_path):
    from transformers import AutoTokenizer

    from hybridpar.checkpoint.hf_tokenizer import write_tokenizer
    from hybridpar.data.tokenizers import ByteTokenizer

    assert write_tokenizer("byte", str(tmp_path)) == ByteTokenizer.eod
    tok, mine = AutoTokenizer.from_pretrained(str(tmp_path)), ByteTokenizer()
    for text in ("Ham.\nTo be, or not to be", "ünïcödé — 日本語 \t\r\n", "a<|endoftext|>b", " lead and trail "):
        ids = tok(text)["input_ids"]
        assert ids == mine.encode(text), text
        assert tok.decode(ids) == mine.decode(ids) == text
    assert len(tok) == mine.vocab_size and tok.eos_token_id == mine.eod


def test_a_runs_tokenizer_json_is_exported_as_is(tmp_path):
    from transformers import AutoTokenizer

    from hybridpar.checkpoint.hf_tokenizer import byte_tokenizer, choose_tokenizer, write_tokenizer
    from hybridpar.data.tokenizers import load_tokenizer

    src = tmp_path / "src" / "tokenizer.json"
    src.parent.mkdir()
    byte_tokenizer().save(str(src))  # any tokenizer.json; this one has <|endoftext|> for the EOD search
    spec, note = choose_tokenizer(None, {"data": {"source": "indexed", "path": "x", "tokenizer": str(src)}}, 320)
    assert spec == str(src) and "data.tokenizer" in note
    out = tmp_path / "out"
    out.mkdir()
    mine = load_tokenizer(str(src))
    assert write_tokenizer(spec, str(out)) == mine.eod == 256
    assert (out / "tokenizer.json").read_bytes() == src.read_bytes()
    tok = AutoTokenizer.from_pretrained(str(out))
    text = "Ham.\nünï"
    assert tok(text)["input_ids"] == mine.encode(text) and tok.decode(mine.encode(text)) == text
    assert tok.eos_token_id == 256


def test_the_recorded_tokenizer_is_chosen(tmp_path):
    from hybridpar.checkpoint.hf_tokenizer import choose_tokenizer
    from hybridpar.errors import UsageError

    assert choose_tokenizer(None, {"data": {"source": "synthetic"}}, 320)[0] == "byte"
    assert choose_tokenizer(None, {"data": {"source": "embedded"}}, 320)[0] == "byte"
    assert choose_tokenizer(None, None, 320)[0] == "byte"
    (tmp_path / "d.meta.json").write_text(json.dumps({"tokenizer": "byte"}))
    assert choose_tokenizer(None, {"data": {"source": "indexed", "path": str(tmp_path / "d")}}, 320)[0] == "byte"
    with pytest.raises(UsageError, match="--tokenizer"):
        choose_tokenizer(None, {"data": {"source": "indexed", "path": str(tmp_path / "none")}}, 320)
    with pytest.raises(UsageError, match="vocab"):
        choose_tokenizer("byte", None, 200)  # 257 tokens do not fit a 200-row embedding


def test_config_differences_name_each_mismatch():
    from hybridpar.checkpoint.hf_layout import config_differences, hf_config

    good = hf_config(TINY, False, 32, "float32", 256)
    assert config_differences(good, TINY, False) == []
    bad = dict(good, hidden_size=128, num_key_value_heads=4, rms_norm_eps=1e-6)
    diff = config_differences(bad, TINY, False)
    assert [d.split()[0] for d in diff] == ["hidden_size", "num_key_value_heads", "rms_norm_eps"]
    assert config_differences(good, TINY, True) == ["tie_word_embeddings False (HF) vs True (recipe)"]


def test_norm_eps_is_the_models():
    from hybridpar.checkpoint.hf_layout import NORM_EPS
    from hybridpar.runtime.model import ModelOptions

    assert NORM_EPS == ModelOptions(seq_len=1).norm_eps


def test_shard_plan_fills_in_order_and_splits():
    from hybridpar.checkpoint.hf_export import shard_name, shard_plan
    from hybridpar.checkpoint.hf_layout import canonical_layout

    layout = canonical_layout(TINY, False)
    assert set(shard_plan(layout, 4, 10**12).values()) == {0}
    plan = shard_plan(layout, 4, 100_000)
    assert list(plan.values()) == sorted(plan.values()) and max(plan.values()) >= 3
    assert shard_name(0, 1) == "model.safetensors" and shard_name(1, 3) == "model-00002-of-00003.safetensors"


# --- bad input: one line, exit 2, nothing started, nothing written ---------------------------
TINY_RECIPE = os.path.join(ROOT, "recipes", "tiny.yaml")


def _one_line_exit_2(capsys, argv, expect: str):
    from hybridpar.cli.main import main

    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert expect in err, err


def test_init_from_hf_bad_input(saved, tmp_path, capsys, no_ranks_may_start):
    _, path, tied = saved
    train = ["train", "--recipe", TINY_RECIPE, "--nproc", "8", "--init-from-hf"]
    if tied:  # the recipe's model is untied
        _one_line_exit_2(capsys, train + [path], "tie_word_embeddings True (HF) vs False (recipe)")
        return
    _one_line_exit_2(capsys, train + [str(tmp_path / "nowhere")], "does not exist")
    other = tmp_path / "other"
    other.mkdir()
    _one_line_exit_2(capsys, train + [str(other)], "no config.json")
    config = json.loads(open(os.path.join(path, "config.json")).read())
    (other / "config.json").write_text(json.dumps(dict(config, hidden_size=128, rope_parameters={"rope_type": "llama3", "rope_theta": 5e5})))
    _one_line_exit_2(capsys, train + [str(other)], "hidden_size 128 (HF) vs 64 (recipe)")
    (other / "config.json").write_text(json.dumps(config))
    _one_line_exit_2(capsys, train + [str(other)], "no model.safetensors")
    (other / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"model.embed_tokens.weight": "x.safetensors"}}))
    _one_line_exit_2(capsys, train + [str(other)], "x.safetensors is missing")
    (other / "x.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    _one_line_exit_2(capsys, train + [str(other)], "not a readable safetensors file")
    _one_line_exit_2(capsys, train + [path, "--resume", str(tmp_path)], "choose one")


def test_export_hf_bad_input(tmp_path, capsys, monkeypatch):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("another run's file")
    _one_line_exit_2(capsys, ["export-hf", str(tmp_path / "nowhere"), str(tmp_path / "out")], "does not exist")
    _one_line_exit_2(capsys, ["export-hf", str(tmp_path), str(busy)], "exists and is not empty (keep.txt): choose another OUT_DIR")
    # --overwrite replaces an earlier export only: a directory with anything else in it was deleted whole
    _one_line_exit_2(capsys, ["export-hf", str(tmp_path), str(busy), "--overwrite"], "holds files an export does not write (keep.txt)")
    monkeypatch.chdir(busy)
    _one_line_exit_2(capsys, ["export-hf", str(tmp_path), ".", "--overwrite"], "holds the working directory")
    monkeypatch.chdir(tmp_path)
    _one_line_exit_2(capsys, ["export-hf", str(tmp_path), str(tmp_path / "o"), "--max-shard-size", "5XB"], "--max-shard-size")
    _one_line_exit_2(capsys, ["export-hf", str(tmp_path), str(tmp_path / "o"), "--dtype", "fp8"], "--dtype")
    _one_line_exit_2(capsys, ["export-hf", str(tmp_path), str(tmp_path / "o")], "no complete checkpoint")
    _one_line_exit_2(capsys, ["export-hf", str(tmp_path), ""], "OUT_DIR is empty")  # was a traceback after the export
    _one_line_exit_2(capsys, ["export-hf", str(busy / "keep.txt"), str(tmp_path / "o")], "is a file: give a save directory")
    (tmp_path / "busy" / "ckpt").mkdir()
    _one_line_exit_2(capsys, ["export-hf", str(busy), str(tmp_path / "o")], f"checkpoints are in its save directory, e.g. {busy / 'ckpt'}")
    (tmp_path / "busy" / "ckpt").rmdir()
    assert sorted(os.listdir(tmp_path)) == ["busy"] and (busy / "keep.txt").read_text() == "another run's file"


def test_recipe_key_init_from_hf_is_checked_and_a_resume_wins(saved, tmp_path, capsys, no_ranks_may_start):
    from argparse import Namespace

    from hybridpar.cli import checkpoint_flags as checkpoint_cli
    from hybridpar.checkpoint.hf_import import HFInit
    from hybridpar.config.recipe import load_recipe

    _, path, tied = saved
    text = open(TINY_RECIPE).read() + f"checkpoint: {{init_from_hf: {path}}}\n"
    (tmp_path / "r.yaml").write_text(text)
    if tied:
        _one_line_exit_2(capsys, ["train", "--recipe", str(tmp_path / "r.yaml"), "--nproc", "8"], "tie_word_embeddings")
        return
    (tmp_path / "bad.yaml").write_text(open(TINY_RECIPE).read() + "checkpoint: {init_from_hf: 5}\n")
    _one_line_exit_2(capsys, ["train", "--recipe", str(tmp_path / "bad.yaml"), "--nproc", "8"], "checkpoint.init_from_hf")
    recipe = load_recipe(str(tmp_path / "r.yaml")).validate(8)
    fresh = Namespace(save_dir=None, save_every=None, keep_last=None, resume=None, init_from_hf=None, no_save=False,
                      sync_save=False, overwrite=False, allow_changes=False)
    from dataclasses import replace
    from types import SimpleNamespace

    from hybridpar.checkpoint.hook import run_checkpoint_hooks

    applied, settings = checkpoint_cli.apply(recipe, fresh, str(tmp_path / "run"))
    assert applied.checkpoint.init_from_hf == path and settings.init_from_hf == path
    assert [type(h) for h in run_checkpoint_hooks(SimpleNamespace(checkpoint=settings, steps=5))] == [HFInit]
    resumed = replace(settings, save_dir=str(tmp_path / "ckpt"), resume=str(tmp_path / "ckpt" / "step-000002"))
    assert not any(isinstance(h, HFInit) for h in run_checkpoint_hooks(SimpleNamespace(checkpoint=resumed, steps=5)))
