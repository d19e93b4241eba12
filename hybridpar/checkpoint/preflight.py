"""Checks on ``--resume`` that need no process group (run before any rank starts).

A step directory given explicitly must be usable. A save directory resumes from the checkpoint
that ``latest`` names when it is usable; otherwise from the newest usable one, and every newer
checkpoint passed over is reported (``Found.skipped``) so the caller can say what it costs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from hybridpar.checkpoint.compat import check_compatible
from hybridpar.checkpoint.files import (LATEST, MANIFEST, STEP_DIR, CheckpointError, Manifest, no_checkpoint_in, read_manifest,
                                       refuse_missing_dir, step_dir_name, verify)

# Up to this size the pre-launch check also verifies checksums (a few seconds of reading);
# above it the ranks verify them while loading, each file once, spread over all ranks.
CHECKSUM_BYTES = 2 << 30


@dataclass(frozen=True)
class Skipped:
    path: str
    step: int
    reason: str


@dataclass(frozen=True)
class Found:
    step_dir: str
    manifest: Manifest
    skipped: list = field(default_factory=list)  # newer, unusable checkpoints, newest first


def _usable(step_dir: str, plan) -> Manifest:
    manifest = read_manifest(step_dir)
    check_compatible(manifest, plan, step_dir)
    total = sum(rec["bytes"] for rec in manifest.files.values())
    verify(step_dir, manifest, checksum=total <= CHECKSUM_BYTES)
    return manifest


def _candidates(save_dir: str) -> list[tuple[int, str]]:
    """(step, directory) of every step-NNNNNN in ``save_dir`` and of the one ``latest`` names, newest first."""
    steps = {int(m.group(1)) for m in map(STEP_DIR.match, os.listdir(save_dir)) if m}
    pointer = os.path.join(save_dir, LATEST)
    if os.path.isfile(pointer):
        with open(pointer) as f:
            m = STEP_DIR.match(f.read().strip())
        if m and os.path.isdir(os.path.join(save_dir, m.group(0))):
            steps.add(int(m.group(1)))
    return [(s, os.path.join(save_dir, step_dir_name(s))) for s in sorted(steps, reverse=True)]


def inspect_resume(path: str, plan) -> Found:
    """The checkpoint that ``path`` resumes from; CheckpointError when there is none that is
    complete and intact (a file missing, of the wrong size, or failing its checksum) or it is of
    another model."""
    refuse_missing_dir(path)
    if os.path.isfile(os.path.join(path, MANIFEST)) or STEP_DIR.match(os.path.basename(os.path.normpath(path))):
        return Found(path, _usable(path, plan))
    skipped = []
    for step, step_dir in _candidates(path):
        try:
            return Found(step_dir, _usable(step_dir, plan), skipped)
        except CheckpointError as err:
            if "of another model" in str(err):
                raise
            skipped.append(Skipped(step_dir, step, str(err)))
    if skipped:
        raise CheckpointError(f"no usable checkpoint in {path}: the newest, {skipped[0].path}, is unusable: {skipped[0].reason}")
    raise no_checkpoint_in(path)
