"""The on-disk checkpoint: names, atomic writes, the manifest, finding and verifying a checkpoint.

Pure file handling (no process groups), so every damage case is testable in one process.

SAVE_DIR/
  latest                      "step-000010\n", replaced atomically after the rename
  step-000010/                complete: renamed from step-000010.tmp-<save id> after every rank wrote
    manifest.json             step, save id, plan, every file's size and sha256, fragment index
    plan.json, run.json       the layout plan and the whole run's settings (rank 0)
    rank-00003.pt             rank 3's parameter/optimizer fragments and RNG states
  step-000015.tmp-1a2b3c4d/   partial (a killed save): ignored, removed by the next save
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field

from hybridpar.errors import UsageError
from hybridpar.files import fsync_dir, write_atomic

FORMAT = "hybridpar-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
RUN_FILE = "run.json"  # the RunPlan of the run that saved the checkpoint (config/run.py)
LATEST = "latest"
STEP_DIR = re.compile(r"^step-(\d{6,})$")
_PARTIAL_DIR = re.compile(r"^step-\d{6,}\.(tmp|old)-[0-9a-zA-Z]+$")


class CheckpointError(UsageError):
    """A checkpoint that cannot be written or loaded; the message (one line) names the file.
    A UsageError, so the command line reports it as one line with exit code 2."""


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def rank_file_name(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


# --- writing --------------------------------------------------------------------------------
@dataclass
class FileRecord:
    bytes: int
    sha256: str


def write_bytes(path: str, data: bytes) -> FileRecord:
    """Write ``data`` durably (fsync) and return its size and checksum."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return FileRecord(len(data), hashlib.sha256(data).hexdigest())


class _HashingWriter:
    """A file that hashes and counts what passes through it: ``torch.save`` streams into it."""

    def __init__(self, f):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def write_tensors(path: str, obj) -> FileRecord:
    """``torch.save`` of plain containers of tensors and numbers (loadable with weights_only),
    streamed to ``path`` and hashed on the way (no in-memory copy of the file), then fsync'd."""
    import torch

    with open(path, "wb") as f:
        writer = _HashingWriter(f)
        torch.save(obj, writer)
        f.flush()
        os.fsync(f.fileno())
    return FileRecord(writer.size, writer.sha.hexdigest())


# --- the manifest ---------------------------------------------------------------------------
@dataclass
class Manifest:
    step: int
    save_id: str
    plan: dict
    files: dict  # name -> {"bytes", "sha256", and for rank files "rank", "coord", "fragments"}
    params: dict  # canonical name -> {"full_shape", "split" (-1: not TP-split), "gated"}
    adam_step: int = 0
    optim: dict = field(default_factory=dict)
    seed: int = 0
    data: dict = field(default_factory=dict)  # {"held_out": share kept out of training, "blend": {prefix: weight}}
    format: str = FORMAT
    version: int = VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, path: str) -> "Manifest":
        try:
            data = json.loads(text)
        except ValueError as err:
            raise CheckpointError(f"{path}: not valid JSON ({err}); the checkpoint is damaged") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CheckpointError(f"{path}: not a hybridpar checkpoint manifest")
        if data.get("version") != VERSION:
            raise CheckpointError(f"{path}: checkpoint format version {data.get('version')} is not {VERSION}")
        try:
            return cls(**data)
        except TypeError as err:
            raise CheckpointError(f"{path}: malformed manifest ({err})") from None

    def rank_files(self) -> dict:
        return {name: rec for name, rec in self.files.items() if "rank" in rec}


def read_manifest(step_dir: str) -> Manifest:
    path = os.path.join(step_dir, MANIFEST)
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: {step_dir} is not a complete checkpoint") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is unreadable: {err}") from None
    return Manifest.from_json(text, path)


# --- finding --------------------------------------------------------------------------------
def complete_steps(save_dir: str) -> list[int]:
    """Steps of the complete checkpoints in ``save_dir`` (renamed dirs with a manifest), ascending."""
    steps = []
    for name in os.listdir(save_dir):
        m = STEP_DIR.match(name)
        if m and os.path.isfile(os.path.join(save_dir, name, MANIFEST)):
            steps.append(int(m.group(1)))
    return sorted(steps)


def refuse_missing_dir(path: str) -> None:
    """CheckpointError naming what ``path`` is when it is not a directory to load from."""
    if os.path.isfile(path):
        raise CheckpointError(f"{path} is a file: give a save directory or one of its step-NNNNNN directories")
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint directory {path} does not exist")


def no_checkpoint_in(path: str) -> CheckpointError:
    """The error for a directory with no complete checkpoint; a run directory's are in its ckpt/."""
    hint = f"; a run's checkpoints are in its save directory, e.g. {os.path.join(path, 'ckpt')}" if (
        os.path.isdir(os.path.join(path, "ckpt"))) else ""
    return CheckpointError(f"no complete checkpoint in {path} (no step-NNNNNN/{MANIFEST}, no valid '{LATEST}'){hint}")


def resolve(path: str) -> str:
    """The step directory to load: ``path`` itself when it holds a manifest, else the checkpoint
    that ``path/latest`` names, else the newest complete ``step-*`` in ``path``."""
    refuse_missing_dir(path)
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path
    pointer = os.path.join(path, LATEST)
    if os.path.isfile(pointer):
        with open(pointer) as f:
            name = f.read().strip()
        if STEP_DIR.match(name) and os.path.isfile(os.path.join(path, name, MANIFEST)):
            return os.path.join(path, name)
    steps = complete_steps(path)
    if not steps:
        raise no_checkpoint_in(path)
    return os.path.join(path, step_dir_name(steps[-1]))


# --- verifying ------------------------------------------------------------------------------
def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def check_file(step_dir: str, name: str, record: dict, checksum: bool = True) -> str | None:
    """One file against its manifest record: None when intact, else a one-line reason naming it."""
    path = os.path.join(step_dir, name)
    if not os.path.isfile(path):
        return f"checkpoint file {path} is missing"
    size = os.path.getsize(path)
    if size != record["bytes"]:
        return f"checkpoint file {path} has {size} bytes, the manifest says {record['bytes']} (truncated or replaced)"
    if checksum and sha256_of(path) != record["sha256"]:
        return f"checkpoint file {path} fails its sha256 check (corrupted, or a file from another checkpoint)"
    return None


def verify(step_dir: str, manifest: Manifest | None = None, names=None, checksum: bool = True) -> Manifest:
    """Raise CheckpointError on the first missing, truncated or corrupted file (of ``names``, or all)."""
    manifest = manifest or read_manifest(step_dir)
    for name in sorted(names if names is not None else manifest.files):
        problem = check_file(step_dir, name, manifest.files[name], checksum)
        if problem:
            raise CheckpointError(problem)
    return manifest


def load_tensors(path: str, mmap: bool = True):
    """``torch.load`` that never runs code from the file (weights_only)."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:  # noqa: BLE001 - every unpickling failure is a damaged file here
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise CheckpointError(f"checkpoint file {path} cannot be loaded safely: {first}") from None


# --- committing and cleaning ----------------------------------------------------------------
def remove_partials(save_dir: str, keep: str = "") -> list[str]:
    """Delete leftovers of interrupted saves (``step-*.tmp-*``, ``step-*.old-*``) except ``keep``."""
    removed = []
    for name in os.listdir(save_dir):
        if _PARTIAL_DIR.match(name) and name != keep:
            shutil.rmtree(os.path.join(save_dir, name), ignore_errors=True)
            removed.append(name)
    return removed


def commit(save_dir: str, tmp_name: str, step: int, save_id: str) -> str:
    """Rename the finished temporary directory into place, then point ``latest`` at it."""
    final_name = step_dir_name(step)
    final = os.path.join(save_dir, final_name)
    tmp = os.path.join(save_dir, tmp_name)
    fsync_dir(tmp)
    aside = None
    if os.path.exists(final):  # an older run's checkpoint of this step (a resume from earlier)
        aside = os.path.join(save_dir, f"{final_name}.old-{save_id}")
        os.rename(final, aside)
    os.rename(tmp, final)
    fsync_dir(save_dir)
    write_atomic(os.path.join(save_dir, LATEST), final_name + "\n")
    if aside:
        shutil.rmtree(aside, ignore_errors=True)
    return final


def prune(save_dir: str, keep_last: int) -> list[int]:
    """Keep the newest ``keep_last`` complete checkpoints (0: keep all); returns removed steps."""
    if keep_last <= 0:
        return []
    steps = complete_steps(save_dir)
    removed = steps[:-keep_last]
    for step in removed:
        shutil.rmtree(os.path.join(save_dir, step_dir_name(step)), ignore_errors=True)
    return removed
