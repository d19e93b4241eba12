"""``--init-from-hf DIR``: each rank reads its TP shards from Hugging Face Llama safetensors.

A rank reads only the slices of the HF tensors its shards hold (safetensors' lazy ``get_slice``),
through the segments of hf_layout.py and the TP rows of ``model.shard_positions``, so any layout
loads any HF model of the same shape. Weights (and ZeRO's fp32 masters) are set; AdamW's state
is left empty: continued pretraining starts a fresh optimizer.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from hybridpar.runtime.model import canonical_params, shard_positions
from hybridpar.checkpoint.files import CheckpointError
from hybridpar.checkpoint.hf_layout import CanonicalParam, canonical_layout, check_hf_dir
from hybridpar.checkpoint.optim import OptimizerView


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """Sorted positions as [start, stop) runs of consecutive values."""
    runs: list[list[int]] = []
    for i in positions:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return [(a, b) for a, b in runs]


def shard_rows(p, layout: CanonicalParam, tp: int, tp_rank: int) -> list[int]:
    """The rows (along ``layout.axis``) of the full tensor that parameter ``p`` holds on ``tp_rank``."""
    full = layout.shape[layout.axis]
    if tp > 1 and getattr(p, "tensor_model_parallel", False):
        if p.partition_dim != layout.axis:
            raise CheckpointError(f"{layout.cname} is split along dim {p.partition_dim}, expected {layout.axis}")
        return shard_positions(p, full, tp_rank, tp, device="cpu").tolist()
    return list(range(full))


class HFReader:
    """Open safetensors files lazily and read slices along one axis."""

    def __init__(self, files: dict[str, str]):
        self.files, self._open = files, {}

    def slice(self, name: str, axis: int, lo: int, hi: int) -> torch.Tensor:
        from safetensors import safe_open

        path = self.files[name]
        # Host memory, whatever the rank's device: safetensors builds the tensor without naming a
        # device, so say it here (strict device mode would otherwise put it on meta).
        with torch.device("cpu"):
            if path not in self._open:
                self._open[path] = safe_open(path, framework="pt", device="cpu")
            part = self._open[path].get_slice(name)
            return part[lo:hi] if axis == 0 else part[:, lo:hi]


def read_shard(reader: HFReader, layout: CanonicalParam, positions: list[int]) -> torch.Tensor:
    """The canonical tensor's rows (along ``layout.axis``) at ``positions``, from HF slices."""
    pieces = []
    for a, b in _runs(positions):
        for s in layout.segments:
            lo, hi = max(a, s.start), min(b, s.start + s.length)
            if lo < hi:
                off = s.hf_start - s.start
                pieces.append(reader.slice(s.hf_name, layout.axis, lo + off, hi + off))
    return torch.cat(pieces, dim=layout.axis) if len(pieces) > 1 else pieces[0]


def load_hf_into(job, hf_dir: str, files: dict[str, str]) -> int:
    """This rank's weights from ``hf_dir`` (no collectives); returns how many it set."""
    mesh = job.mesh
    tp, tp_rank = mesh.size("tp"), mesh.tp_rank
    layout = {c.cname: c for c in canonical_layout(job.plan.model, job.tied)}
    view, reader, count = OptimizerView(job.engine, mesh.rank_in("dp_cp")), HFReader(files), 0
    for cname, p in canonical_params(job.chunks):
        value = read_shard(reader, layout[cname], shard_rows(p, layout[cname], tp, tp_rank))
        if tuple(value.shape) != tuple(p.shape):
            raise CheckpointError(f"{hf_dir}: {cname} gives a shard of shape {list(value.shape)}, this rank holds {list(p.shape)}")
        view.set_param(p, value.to(device=p.device, dtype=torch.float32))
        count += 1
    return count


class HFInit:
    """A ``train()`` hook: Hugging Face weights before the first step (hybridpar/runtime/loop.py)."""

    def __init__(self, hf_dir: str, print_fn=print):
        self.hf_dir, self.print_fn = hf_dir, print_fn

    def on_start(self, job, first_step: int) -> int:
        from hybridpar.checkpoint.load import on_every_rank

        def load() -> int:
            return load_hf_into(job, self.hf_dir, check_hf_dir(self.hf_dir, job.plan.model, job.tied))

        count = on_every_rank(load)
        if dist.get_rank() == 0 and self.print_fn:
            self.print_fn(f"initialised from Hugging Face weights {self.hf_dir} ({count} tensors on rank 0; optimizer state fresh)")
        return first_step
