"""``hybridpar export-hf CHECKPOINT OUT_DIR``: a checkpoint of any layout as a Hugging Face Llama.

Writes config.json, the weights as safetensors (one ``model.safetensors``, or shards of at most
``max_shard_bytes`` with ``model.safetensors.index.json``) and a tokenizer (hf_tokenizer.py).
Each canonical parameter is assembled from the checkpoint's fragments, cut into its HF tensors
(hf_layout.py) and added to the shard being filled; a shard is written as soon as it is full, so
at most one shard and one parameter are held. Everything goes to ``OUT_DIR.tmp-<id>`` first and
is renamed into place at the end: an interrupted export leaves no half-written OUT_DIR.

Vocabulary: hybridpar's embedding has ``model.vocab`` rows (megatron pads nothing here: the
recipe requires vocab % tp == 0), and ``vocab_size`` in config.json is exactly those rows. A
tokenizer with fewer tokens (the byte tokenizer's 257 in a 320-row model) is fine: the rows
past it are written as trained and never produced by the tokenizer.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass

from hybridpar.errors import UsageError
from hybridpar.files import why_not_writable
from hybridpar.checkpoint.files import LATEST, MANIFEST, RUN_FILE, CheckpointError, read_manifest, resolve, verify
from hybridpar.reliability.run_dir import LOCK_NAME, RUN_FILES
from hybridpar.checkpoint.hf_layout import INDEX_FILE, SINGLE_FILE, CanonicalParam, canonical_layout, hf_config

DTYPES = {"fp32": ("float32", 4), "bf16": ("bfloat16", 2)}
# What a run directory or a save directory holds besides step-*/ (reliability/run_dir.py, checkpoint/files.py).
RUN_ENTRIES = (*RUN_FILES[:2], LOCK_NAME, LATEST, MANIFEST)


@dataclass(frozen=True)
class ExportConfig:
    checkpoint: str
    out_dir: str
    overwrite: bool = False
    tokenizer: str | None = None  # None: the run's (run.json's data section), else "byte" or a tokenizer.json
    dtype: str = "fp32"
    max_shard_bytes: int = 5 * 10**9


def check_out_dir(out_dir: str, overwrite: bool) -> None:
    if not out_dir.strip():
        raise UsageError("OUT_DIR is empty: name the Hugging Face directory to create, e.g. hf/my-model")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"{out_dir} exists and is not a directory")
    why = why_not_writable(out_dir)
    if why:
        raise UsageError(f"cannot write OUT_DIR {out_dir} ({why}); choose a directory you can write")
    if os.path.isdir(out_dir):
        entries = os.listdir(out_dir)
        runs = sorted(n for n in entries if n in RUN_ENTRIES or n.startswith("step-"))
        if runs:  # --overwrite replaces an earlier export, never a run or its checkpoints
            raise UsageError(f"{out_dir} holds a training run or checkpoints ({', '.join(runs[:3])}); --overwrite replaces "
                             f"only an earlier export: choose another OUT_DIR")
        here = os.path.abspath(os.getcwd())
        if (here + os.sep).startswith(os.path.abspath(out_dir) + os.sep):  # it cannot be replaced
            raise UsageError(f"OUT_DIR {out_dir} holds the working directory; choose another OUT_DIR")
        foreign = sorted(n for n in entries if not _written_by_export(n))
        if foreign and overwrite:  # never delete what an export did not write
            raise UsageError(f"{out_dir} holds files an export does not write ({', '.join(foreign[:3])}); --overwrite replaces "
                             f"only an earlier export: choose another OUT_DIR")
        if foreign and not overwrite:
            raise UsageError(f"{out_dir} exists and is not empty ({', '.join(foreign[:3])}): choose another OUT_DIR")
        if entries and not overwrite:
            raise UsageError(f"{out_dir} holds an earlier export: pass --overwrite to replace it, or choose another OUT_DIR")


def _written_by_export(name: str) -> bool:
    """A file export_hf writes: config.json, the safetensors (one, or shards and their index), the tokenizer."""
    from hybridpar.checkpoint.hf_tokenizer import COPIED

    return (name in ("config.json", SINGLE_FILE, INDEX_FILE, "tokenizer.json", *COPIED)
            or re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", name) is not None)


def shard_plan(layout: list[CanonicalParam], itemsize: int, max_bytes: int) -> dict[str, int]:
    """HF tensor name -> shard number (0-based), filling shards in layout order."""
    plan, shard, used = {}, 0, 0
    for p in layout:
        for name, shape in p.hf_shapes().items():
            size = itemsize
            for s in shape:
                size *= s
            if used and used + size > max_bytes:
                shard, used = shard + 1, 0
            plan[name], used = shard, used + size
    return plan


def shard_name(i: int, n: int) -> str:
    return SINGLE_FILE if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def hf_tensors(p: CanonicalParam, full, dtype):
    """The HF tensors cut from canonical ``full``: {name: tensor}."""
    import torch

    out = {name: torch.empty(shape, dtype=dtype, device="cpu") for name, shape in p.hf_shapes().items()}
    for s in p.segments:
        out[s.hf_name].narrow(p.axis, s.hf_start, s.length).copy_(full.narrow(p.axis, s.start, s.length))
    return out


def write_weights(reader, layout: list[CanonicalParam], out: str, dtype_name: str, max_bytes: int) -> int:
    """Every shard into ``out``; returns the number of bytes of tensor data."""
    import torch
    from safetensors.torch import save_file

    dtype = getattr(torch, DTYPES[dtype_name][0])
    plan = shard_plan(layout, DTYPES[dtype_name][1], max_bytes)
    n = max(plan.values()) + 1
    shard, current, total = {}, 0, 0

    def flush():
        save_file(shard, os.path.join(out, shard_name(current, n)), metadata={"format": "pt"})

    for p in layout:
        full = reader.tensor(p.cname, "param", 1, 0)
        if tuple(full.shape) != p.shape:
            raise CheckpointError(f"checkpoint {reader.step_dir}: {p.cname} has shape {list(full.shape)}, expected {list(p.shape)}")
        for name, tensor in hf_tensors(p, full, dtype).items():
            if plan[name] != current:
                flush()
                shard, current = {}, plan[name]
            shard[name] = tensor
            total += tensor.numel() * tensor.element_size()
    flush()
    if n > 1:
        index = {"metadata": {"total_size": total}, "weight_map": {k: shard_name(v, n) for k, v in plan.items()}}
        with open(os.path.join(out, INDEX_FILE), "w") as f:
            json.dump(index, f, indent=2, sort_keys=True)
    return total


def _read_run(step_dir: str) -> dict | None:
    path = os.path.join(step_dir, RUN_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def _commit(tmp: str, out_dir: str) -> None:
    """Replace ``out_dir`` (absent, empty, or allowed by --overwrite) with ``tmp``."""
    old = None
    if os.path.isdir(out_dir):
        old = f"{out_dir}.old-{uuid.uuid4().hex[:8]}"
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def export_hf(cfg: ExportConfig, print_fn=print) -> str:
    """Export ``cfg.checkpoint`` to ``cfg.out_dir``; returns the step directory exported."""
    from hybridpar.topology.models import model_from_dict

    from hybridpar.checkpoint.hf_tokenizer import choose_tokenizer, write_tokenizer

    if cfg.dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {cfg.dtype!r}")
    if cfg.max_shard_bytes < 1:
        raise UsageError(f"--max-shard-size must be positive, got {cfg.max_shard_bytes} bytes")
    check_out_dir(cfg.out_dir, cfg.overwrite)
    step_dir = resolve(cfg.checkpoint)
    out, source = os.path.realpath(cfg.out_dir), os.path.realpath(step_dir)
    if source == out or source.startswith(out + os.sep):
        # --overwrite replaces OUT_DIR whole: the checkpoint (and the run around it) would go with it
        raise UsageError(f"OUT_DIR {cfg.out_dir} holds the checkpoint being exported ({step_dir}); choose a directory "
                         f"outside it")
    manifest = read_manifest(step_dir)
    spec = model_from_dict(manifest.plan["model"], f"{step_dir}/manifest.json")
    tied = "output_layer.weight" not in manifest.params
    layout = canonical_layout(spec, tied)
    missing = sorted({p.cname for p in layout} - set(manifest.params))
    if missing:
        raise CheckpointError(f"checkpoint {step_dir} has no parameter {missing[0]}")
    tokenizer, note = choose_tokenizer(cfg.tokenizer, _read_run(step_dir), spec.vocab)
    verify(step_dir, manifest, checksum=True)
    from hybridpar.checkpoint.reshard import CheckpointReader  # torch: after every check of the input

    parent = os.path.dirname(os.path.abspath(cfg.out_dir))
    tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(cfg.out_dir))}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        os.makedirs(tmp)
    except OSError as e:  # what check_out_dir cannot see: a read-only or pseudo filesystem
        raise UsageError(f"cannot write OUT_DIR {cfg.out_dir} ({e.strerror or e}); choose a directory you can write") from None
    try:
        total = write_weights(CheckpointReader(step_dir, manifest), layout, tmp, cfg.dtype, cfg.max_shard_bytes)
        eos = write_tokenizer(tokenizer, tmp)
        config = hf_config(spec, tied, int(manifest.plan["seq_len"]), DTYPES[cfg.dtype][0], eos)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        _commit(tmp, cfg.out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_fn(f"exported {step_dir} (step {manifest.step}) to {cfg.out_dir}: LlamaForCausalLM, {cfg.dtype}, "
             f"{total / 1e6:.1f} MB of weights, vocab_size {spec.vocab} (the embedding's rows), tokenizer {note}")
    return step_dir
