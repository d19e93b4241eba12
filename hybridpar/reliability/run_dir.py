"""The run directory owns its run: no silent overwrite, no two runs at once, no duplicated steps.

``claim(dirs, resuming, overwrite)`` runs once per job, before training starts (in the process that
launches local ranks, or on rank 0 under a cluster launcher), and holds until the job ends:
- a fresh run (no ``--resume``) into a run directory that already holds metrics or a plan, or
  into a save directory that already holds checkpoints, is refused in one line naming
  ``--resume auto`` and ``--overwrite``; ``--overwrite`` first deletes what hybridpar wrote there
  (metrics.jsonl, plan.json, sample.txt, profile/rank-*-steps-*.json, step-*/ and latest), nothing else;
- a status.json in the run directory that hybridpar did not write (not its JSON object whose "status" is
  one of STATUSES) is never replaced: the run is refused, with or without ``--overwrite``;
- each directory is locked (``flock`` on ``.hybridpar.lock``) for the run's lifetime: a second
  run on the same directory is refused, naming the holder; the kernel drops the lock when the
  holding process dies, however it dies, so a dead run never holds it.
``keep_steps_before(metrics_path, first)`` drops the metrics a resumed run will write again.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass, field

from hybridpar.errors import UsageError
from hybridpar.files import why_not_writable, write_atomic
from hybridpar.observe.profile import traces_in

LOCK_NAME = ".hybridpar.lock"
RUN_FILES = ("metrics.jsonl", "plan.json", "sample.txt")
# How a run ended (hybridpar/cli/commands/train.py writes it, and replaces it on every run into the directory).
STATUS_FILE = "status.json"
STATUSES = ("running", "finished", "stopped", "failed")


@dataclass(frozen=True)
class RunDirs:
    out: str
    save_dir: str | None  # None: this run saves no checkpoints

    def all(self) -> list[str]:
        dirs = [self.out]
        if self.save_dir and os.path.abspath(self.save_dir) != os.path.abspath(self.out):
            dirs.append(self.save_dir)
        return dirs


def _checkpoints_in(save_dir: str) -> list[str]:
    if not os.path.isdir(save_dir):
        return []
    return sorted(n for n in os.listdir(save_dir) if n == "latest" or n.startswith("step-"))


def previous_run(dirs: RunDirs) -> list[str]:
    """What an earlier run left that a fresh run would overwrite or mix with."""
    found = [os.path.join(dirs.out, n) for n in RUN_FILES if os.path.isfile(os.path.join(dirs.out, n))]
    found += traces_in(dirs.out)
    if dirs.save_dir:
        found += [os.path.join(dirs.save_dir, n) for n in _checkpoints_in(dirs.save_dir)]
    return found


def foreign_status(out: str) -> str | None:
    """OUT/status.json where one exists that hybridpar did not write, else None."""
    path = os.path.join(out, STATUS_FILE)
    if not os.path.lexists(path):
        return None
    try:
        with open(path) as f:
            status = json.load(f)
    except (OSError, ValueError):
        return path
    return None if isinstance(status, dict) and status.get("status") in STATUSES else path


def _holders(dirs: RunDirs, found: list[str]) -> list[str]:
    """The directories to name for what previous_run found: --out, and --save-dir where it lies outside it
    (another run's checkpoints, which --overwrite would delete)."""
    out = os.path.abspath(dirs.out) + os.sep
    inside = [p for p in found if os.path.abspath(p).startswith(out)]
    outside = sorted({os.path.dirname(p) for p in found if p not in inside})
    return ([dirs.out] if inside else []) + outside


def remove_previous_run(dirs: RunDirs) -> None:
    for name in RUN_FILES:
        path = os.path.join(dirs.out, name)
        if os.path.isfile(path):
            os.remove(path)
    for path in traces_in(dirs.out):
        os.remove(path)
    if dirs.save_dir:
        for name in _checkpoints_in(dirs.save_dir):
            path = os.path.join(dirs.save_dir, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


@dataclass
class RunClaim:
    """The locks of a claimed run; released by ``release()`` or when the process ends."""

    dirs: RunDirs
    _files: list = field(default_factory=list)

    def release(self) -> None:
        for f in self._files:
            f.close()  # closing the descriptor drops its flock
        self._files.clear()


def _unwritable(directory: str, why: str) -> UsageError:
    return UsageError(f"cannot write the run directory {directory} ({why}); give --out / --save-dir a directory "
                      f"you can write")


def _lock(directory: str):
    path = os.path.join(directory, LOCK_NAME)
    try:
        os.makedirs(directory, exist_ok=True)
        f = open(path, "a+")
    except OSError as e:  # what why_not_writable cannot see: a read-only or pseudo filesystem
        raise _unwritable(directory, e.strerror or str(e)) from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise UsageError(f"{directory} is in use by another run ({holder}); wait for it to end, or give this run "
                         f"its own --out / --save-dir") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    f.flush()
    return f


def claim(dirs: RunDirs, resuming: bool, overwrite: bool) -> RunClaim:
    """Lock the run's directories, then make sure a fresh run starts on a clean slate."""
    held = RunClaim(dirs)
    for directory in dirs.all():  # every one checked before any is created
        why = why_not_writable(directory)
        if why:
            raise _unwritable(directory, why)
    try:
        for directory in dirs.all():
            held._files.append(_lock(directory))
        foreign = foreign_status(dirs.out)
        if foreign:
            raise UsageError(f"{foreign} is not a status hybridpar wrote, and a run writes its own there; move it "
                             f"away or give this run another --out")
        if not resuming:
            found = previous_run(dirs)
            if found and not overwrite:
                shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
                holders = _holders(dirs, found)
                raise UsageError(f"{' and '.join(holders)} already hold{'s' if len(holders) == 1 else ''} a run ({shown}); "
                                 f"continue it with --resume auto, or delete it and start over with --overwrite")
            if found:
                remove_previous_run(dirs)
    except BaseException:
        held.release()
        raise
    return held


def keep_steps_before(metrics_path: str, first: int) -> int:
    """Rewrite ``metrics_path`` (atomically) keeping only steps before ``first``: a resumed run
    writes the later ones again. Returns how many records were dropped."""
    if not os.path.isfile(metrics_path):
        return 0
    kept, dropped = [], 0
    with open(metrics_path) as f:
        for line in f:
            try:
                step = json.loads(line).get("step", 0)
            except ValueError:  # a half-written last line of a killed run
                dropped += 1
                continue
            if step < first:
                kept.append(line if line.endswith("\n") else line + "\n")
            else:
                dropped += 1
    if dropped:
        write_atomic(metrics_path, "".join(kept))
    return dropped
