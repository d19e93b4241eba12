"""Writing files so that a crash never leaves half of one: a temp file beside the target, flushed
to disk, renamed over it only when complete. The one helper every writer in hybridpar uses."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


def fsync_dir(path: str) -> None:
    """Make a rename inside ``path`` durable (best effort: some filesystems refuse)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def head_of(path, size: int) -> bytes:
    """The first ``size`` bytes of the file at ``path`` (b"" when it cannot be read): how a writer
    tells a file it wrote, by its own marker, from one it must never replace."""
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:
        return b""


def why_not_writable(directory: str) -> str | None:
    """Why ``directory`` cannot be created or written, checked before anything is: a file where it
    or an ancestor should be, or a nearest existing ancestor this process cannot write; None when
    nothing says so (a read-only or pseudo filesystem shows only when a write is tried)."""
    path = os.path.abspath(directory)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        return f"{path} is a file"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{path} is not writable"
    return None


@contextmanager
def replacing(target, mode: str = "w", permissions: int = 0o644, **open_kwargs):
    """A temp file beside ``target`` for the block to write; renamed over ``target`` only when the
    block completes (removed otherwise): readers see the old file or the new one, never part."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, permissions)  # mkstemp creates 0600
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
    fsync_dir(str(target.parent))


def write_atomic(path, data, permissions: int = 0o644) -> None:
    """``data`` (str or bytes) as the whole content of ``path``."""
    with replacing(path, "wb" if isinstance(data, bytes) else "w", permissions) as f:
        f.write(data)


@contextmanager
def replacing_path(target):
    """For writers that take a path (matplotlib's savefig): yields a temp path beside ``target``,
    renamed over it when the block completes."""
    target = Path(target)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
