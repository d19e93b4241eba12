"""Reading a checkpoint in any layout: fragments -> TP shards -> full tensors -> the new shard.

A checkpoint stores, per rank, *fragments*: contiguous ranges of one parameter's flattened TP
shard, named by (canonical name, TP rank, start, length), for the weight (fp32 master) and each
AdamW moment. That form does not depend on DP size or ZeRO stage (a DP partition is just a set of
ranges), nor on PP/VPP (canonical names carry global layer numbers). A TP change goes through
the full tensor with the same slicing rules as model initialisation (model.shard_of_full /
full_from_shards), so every layout can read every checkpoint of the same model.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import torch

from hybridpar.checkpoint.files import CheckpointError, Manifest, load_tensors, read_manifest, verify

KEYS = ("param", "exp_avg", "exp_avg_sq")


def param_like(meta: dict) -> SimpleNamespace:
    """The attributes model.py's TP slicing rules read from a parameter, from manifest metadata."""
    split = meta["split"]
    return SimpleNamespace(tensor_model_parallel=split >= 0, partition_dim=max(split, 0), _hybridpar_gated=meta["gated"])


def shard_shape(meta: dict, tp: int) -> list[int]:
    shape = list(meta["full_shape"])
    if meta["split"] >= 0 and tp > 1:
        shape[meta["split"]] //= tp
    return shape


def numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def assemble(pieces: list[tuple[int, torch.Tensor]], total: int, what: str) -> torch.Tensor:
    """Concatenate ``(start, flat tensor)`` pieces that must tile [0, total) exactly."""
    pieces = sorted(pieces, key=lambda p: p[0])
    at = 0
    for start, t in pieces:
        if start < at:
            raise CheckpointError(f"checkpoint has overlapping copies of elements {start}..{at} of {what}")
        if start > at:
            raise CheckpointError(f"checkpoint lacks elements {at}..{start} of {what} (a rank file left out?)")
        at += t.numel()
    if at != total:
        raise CheckpointError(f"checkpoint lacks elements {at}..{total} of {what} (a rank file left out?)")
    return torch.cat([t.reshape(-1) for _, t in pieces]) if len(pieces) > 1 else pieces[0][1].reshape(-1)


class CheckpointReader:
    """Lazily opens a verified checkpoint's rank files and answers per-parameter questions."""

    def __init__(self, step_dir: str, manifest: Manifest | None = None):
        self.step_dir = step_dir
        self.manifest = manifest or read_manifest(step_dir)
        self.tp = int(self.manifest.plan["tp"])
        self._open: dict[str, dict] = {}
        # (canonical name, tp rank) -> [(file, start, numel)] from one pipeline stage (a tied
        # embedding is held by the first and the last stage: identical copies, take the first).
        index: dict[tuple, dict[int, list]] = {}
        for name, rec in self.manifest.rank_files().items():
            for cname, tp_rank, pp_rank, start, n in rec["fragments"]:
                index.setdefault((cname, tp_rank), {}).setdefault(pp_rank, []).append((name, start, n))
        self._index = {key: by_pp[min(by_pp)] for key, by_pp in index.items()}

    def file(self, name: str) -> dict:
        if name not in self._open:
            path = os.path.join(self.step_dir, name)
            data = load_tensors(path)
            header = data.get("header", {}) if isinstance(data, dict) else {}
            if header.get("step") != self.manifest.step or header.get("save_id") != self.manifest.save_id:
                raise CheckpointError(
                    f"checkpoint file {path} belongs to step {header.get('step')} (save {header.get('save_id')}),"
                    f" not to this checkpoint's step {self.manifest.step} (save {self.manifest.save_id})"
                )
            self._open[name] = data
        return self._open[name]

    def meta(self, cname: str) -> dict:
        if cname not in self.manifest.params:
            raise CheckpointError(f"checkpoint {self.step_dir} has no parameter {cname} (another model?)")
        return self.manifest.params[cname]

    def old_range(self, cname: str, tp_rank: int, key: str, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """Elements [lo, hi) of ``cname``'s flattened TP shard ``tp_rank`` (saved layout), for ``key``.

        Only the fragments overlapping the range are touched (files are memory-mapped)."""
        total = numel(shard_shape(self.meta(cname), self.tp))
        hi = total if hi is None else hi
        pieces = []
        for name, start, n in self._index.get((cname, tp_rank), []):
            if start >= hi or start + n <= lo:
                continue
            frag = self.file(name)["fragments"].get(cname)
            if frag is None or key not in frag or frag[key].numel() != n or frag["start"] != start:
                raise CheckpointError(f"checkpoint file {os.path.join(self.step_dir, name)} lacks {key} of {cname}")
            a, b = max(lo, start), min(hi, start + n)
            pieces.append((a - lo, frag[key].reshape(-1)[a - start : b - start]))
        what = f"{key} of {cname} (TP rank {tp_rank} of {self.tp}, elements {lo}..{hi} of {total})"
        return assemble(pieces, hi - lo, what)

    def flat_range(self, cname: str, key: str, tp: int, tp_rank: int, lo: int, hi: int) -> torch.Tensor:
        """Elements [lo, hi) of ``cname``'s flattened shard for TP rank ``tp_rank`` of ``tp``."""
        meta = self.meta(cname)
        if meta["split"] < 0:
            return self.old_range(cname, 0, key, lo, hi)
        if tp == self.tp:
            return self.old_range(cname, tp_rank, key, lo, hi)
        return self.tensor(cname, key, tp, tp_rank).reshape(-1)[lo:hi]

    def tensor(self, cname: str, key: str, tp: int, tp_rank: int) -> torch.Tensor:
        """``cname``'s shard for TP rank ``tp_rank`` of ``tp`` (any TP size), shaped."""
        from hybridpar.runtime.model import full_from_shards, shard_of_full

        meta = self.meta(cname)
        if meta["split"] < 0:  # replicated over TP: every TP rank saved the same values; read one
            return self.old_range(cname, 0, key).view(meta["full_shape"])
        if tp == self.tp:
            return self.old_range(cname, tp_rank, key).view(shard_shape(meta, tp))
        old = param_like(meta)
        shards = [self.old_range(cname, t, key).view(shard_shape(meta, self.tp)) for t in range(self.tp)]
        full = full_from_shards(cname, old, shards)
        return shard_of_full(cname, old, full, tp_rank, tp).contiguous()

    def rank_data(self, rank: int) -> dict | None:
        from hybridpar.checkpoint.files import rank_file_name

        name = rank_file_name(rank)
        return self.file(name) if name in self.manifest.files else None


def read_full_state(step_dir: str, checksum: bool = True) -> dict[str, dict[str, torch.Tensor]]:
    """The whole checkpoint as one-process tensors: {canonical name: {param, exp_avg, exp_avg_sq}}.

    For export and tests; holds everything in memory."""
    manifest = verify(step_dir, checksum=checksum)
    reader = CheckpointReader(step_dir, manifest)
    return {c: {k: reader.tensor(c, k, 1, 0).clone() for k in KEYS} for c in sorted(manifest.params)}
