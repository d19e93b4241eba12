"""Checkpoints that resume exactly and load into any layout of the same model.

On disk (files.py): ``SAVE_DIR/step-NNNNNN/`` with manifest.json (sizes, sha256, fragment index),
plan.json, recipe.json and one ``rank-RRRRR.pt`` per rank holding per-parameter *fragments*
(canonical name, TP rank, flat range) of the fp32 weights and AdamW moments, AdamW's step and
the rank's RNG states; ``SAVE_DIR/latest`` names the newest. Written to ``*.tmp-<id>`` and
renamed when every rank has finished.

API: ``save_checkpoint(job, save_dir, step)``, ``load_checkpoint(job, path) -> step``,
``Checkpointer(CheckpointConfig(...), last_step)`` (a ``train()`` hook), ``resolve(path)``,
``verify(step_dir)``, ``read_full_state(step_dir)`` (one-process tensors), ``inspect_resume``.
"""
from .compat import check_compatible, layout_text
from .files import CheckpointError, Manifest, read_manifest, resolve, verify
from .hook import CheckpointConfig, Checkpointer
from .preflight import inspect_resume
from .reshard import CheckpointReader, read_full_state

from .load import load_checkpoint
from .save import save_checkpoint

__all__ = [
    "CheckpointConfig", "CheckpointError", "CheckpointReader", "Checkpointer", "Manifest", "check_compatible",
    "inspect_resume", "layout_text", "load_checkpoint", "read_full_state", "read_manifest", "resolve",
    "save_checkpoint", "verify",
]
