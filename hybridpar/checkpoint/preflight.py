"""Checks on ``--resume DIR`` that need no process group (run before any rank starts)."""
from __future__ import annotations

from .compat import check_compatible
from .files import read_manifest, resolve, verify

# Up to this size the pre-launch check also verifies checksums (a few seconds of reading);
# above it the ranks verify them while loading, each file once, spread over all ranks.
CHECKSUM_BYTES = 2 << 30


def inspect_resume(path: str, plan) -> tuple[str, int]:
    """The step dir and step that ``path`` resumes from; CheckpointError when it is missing,
    incomplete, damaged (a file missing, of the wrong size, or failing its checksum) or of
    another model."""
    step_dir = resolve(path)
    manifest = read_manifest(step_dir)
    check_compatible(manifest, plan, step_dir)
    total = sum(rec["bytes"] for rec in manifest.files.values())
    verify(step_dir, manifest, checksum=total <= CHECKSUM_BYTES)
    return step_dir, manifest.step
