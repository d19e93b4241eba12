"""Checkpoints that resume exactly and load into any layout of the same model.

On disk (files.py): ``SAVE_DIR/step-NNNNNN/`` with manifest.json (sizes, sha256, fragment index),
plan.json, run.json and one ``rank-RRRRR.pt`` per rank holding per-parameter *fragments*
(canonical name, TP rank, flat range) of the fp32 weights and AdamW moments, AdamW's step and
the rank's RNG states; ``SAVE_DIR/latest`` names the newest. Written to ``*.tmp-<id>`` and
renamed when every rank has finished.

API: ``save_checkpoint(job, save_dir, step)``, ``load_checkpoint(job, path) -> step``,
``Checkpointer(CheckpointConfig(...), last_step)`` (a ``train()`` hook), ``resolve(path)``,
``verify(step_dir)``, ``read_full_state(step_dir)`` (one-process tensors), ``inspect_resume``
(the pre-launch check). Names load lazily: the pre-launch check does not import torch.
"""
import importlib

_WHERE = {
    "CheckpointError": "files", "Manifest": "files", "read_manifest": "files", "resolve": "files", "verify": "files",
    "check_compatible": "compat", "layout_text": "compat", "inspect_resume": "preflight",
    "CheckpointConfig": "hook", "Checkpointer": "hook", "CheckpointReader": "reshard",
    "read_full_state": "reshard", "load_checkpoint": "load", "save_checkpoint": "save",
}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
