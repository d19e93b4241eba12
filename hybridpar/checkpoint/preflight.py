"""Checks on ``--resume DIR`` that need no process group (run before any rank starts)."""
from __future__ import annotations

from .compat import check_compatible
from .files import read_manifest, resolve, verify


def inspect_resume(path: str, plan, checksum: bool = False) -> tuple[str, int]:
    """The step dir and step that ``path`` resumes from; CheckpointError when it is missing,
    incomplete (a file missing or of the wrong size) or of another model. Checksums are checked
    by the ranks while loading (spread over them), unless ``checksum``."""
    step_dir = resolve(path)
    manifest = read_manifest(step_dir)
    check_compatible(manifest, plan, step_dir)
    verify(step_dir, manifest, checksum=checksum)
    return step_dir, manifest.step
