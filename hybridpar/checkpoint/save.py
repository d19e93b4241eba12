"""Saving: every rank writes its file into a temporary directory; rank 0 commits.

1. rank 0 picks a save id, removes leftovers of interrupted saves, creates
   ``step-NNNNNN.tmp-<id>/``; every rank writes ``rank-RRRRR.pt`` (fsync'd) and reports its
   size, sha256 and fragment index (one all_gather_object, which is also the barrier);
2. rank 0 writes plan.json, run.json (the RunPlan) and manifest.json, renames the directory to
   ``step-NNNNNN/`` and replaces ``latest`` (temp file + os.replace) last;
3. every rank learns the outcome (one broadcast): a failure on any rank fails the save everywhere.
A job killed anywhere before the rename leaves only a ``*.tmp-*`` directory, which loading
ignores and the next save removes.

Asynchronous saves (``begin_save(..., background=True)`` then ``finish_save``): the state is
copied to host memory at the step boundary and each rank writes its file on a thread while
training goes on; the collectives of steps 1 and 3 stay on the training thread (a process
group's collectives must keep one order on every rank), run when every rank's file is written
(``hook.Checkpointer`` learns that through the step's all-reduce).
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from hybridpar.runtime.model import canonical_params
from hybridpar.checkpoint import rng
from hybridpar.checkpoint.files import RUN_FILE, CheckpointError, Manifest, commit, prune, rank_file_name, remove_partials, step_dir_name, write_bytes, write_tensors
from hybridpar.checkpoint.optim import OptimizerView


def param_meta(cname: str, p, tp: int) -> dict:
    """How ``cname`` looks in one process and how it splits over TP (split -1: replicated).
    megatron marks its parallel layers' weights even at TP 1, so a TP-1 checkpoint knows too."""
    split = int(p.partition_dim) if getattr(p, "tensor_model_parallel", False) else -1
    shape = list(p.shape)
    if split >= 0:
        shape[split] *= tp
    return {"full_shape": shape, "split": split, "gated": bool(getattr(p, "_hybridpar_gated", False))}


def to_host(t: torch.Tensor) -> torch.Tensor:
    """One fp32 copy of ``t`` in host memory (pinned on CUDA, so the copy runs without blocking):
    no clone on the device, no second copy on the host. The caller synchronises before reading."""
    cuda = t.device.type == "cuda"
    host = torch.empty(t.shape, dtype=torch.float32, device="cpu", pin_memory=cuda)
    host.copy_(t.detach(), non_blocking=cuda)
    return host


def rank_payload(job, step: int, save_id: str, as_dp_rank: int | None = None,
                 every_tp_rank: bool = False) -> tuple[dict, list, dict]:
    """This rank's file contents, its fragment index, and its parameters' metadata. ``as_dp_rank``:
    the fragments this rank would save as that DP (x CP) rank (0: a replicated optimizer's whole
    state, which a checkpoint takes from DP rank 0 alone). ``every_tp_rank``: parameters that are
    the same on every TP rank come from this one too, not only from TP rank 0 (an in-memory copy
    read back by the ranks of one TP position)."""
    mesh = job.mesh
    view = OptimizerView(job.engine, mesh.rank_in("dp_cp") if as_dp_rank is None else as_dp_rank)
    tp = mesh.size("tp")
    fragments, index, metas = {}, [], {}
    for cname, p in canonical_params(job.chunks):
        metas[cname] = param_meta(cname, p, tp)
        replicated = not getattr(p, "tensor_model_parallel", False)
        if replicated and mesh.tp_rank != 0 and not every_tp_rank:  # identical on every TP rank: TP rank 0 saves it
            continue
        frag = view.fragment(p)
        if frag is None:
            continue
        tp_rank = 0 if replicated else mesh.tp_rank
        fragments[cname] = {"start": frag.start, **{k: to_host(v) for k, v in frag.tensors.items()}}
        index.append([cname, tp_rank, mesh.pp_rank, frag.start, frag.numel])
    if torch.cuda.is_available():
        torch.cuda.current_stream().synchronize()  # the host copies were queued without blocking
    header = {"step": step, "save_id": save_id, "rank": dist.get_rank(),
              "coord": {"dp": mesh.dp_rank, "pp": mesh.pp_rank, "tp": mesh.tp_rank}}
    payload = {"header": header, "fragments": fragments, "adam_step": view.adam_step(), "rng": rng.capture()}
    return payload, index, metas


def _broadcast(value, src: int = 0):
    box = [value]
    dist.broadcast_object_list(box, src=src)
    return box[0]


@dataclass
class PendingSave:
    """A save whose state is already in host memory; its rank file may still be being written."""

    save_dir: str
    step: int
    save_id: str
    tmp_name: str
    report: dict
    thread: threading.Thread | None = None

    def written(self) -> bool:
        return self.thread is None or not self.thread.is_alive()


def begin_save(job, save_dir: str, step: int, background: bool = False) -> PendingSave:
    """Collective: the temporary directory, then this rank's state copied to host memory (at
    the step boundary, before training moves on) and its file written: here, or with
    ``background`` on a thread while training goes on. ``finish_save`` commits it."""
    rank = dist.get_rank()
    save_id = _broadcast(uuid.uuid4().hex[:12] if rank == 0 else None)
    tmp_name = f"{step_dir_name(step)}.tmp-{save_id}"
    tmp = os.path.join(save_dir, tmp_name)
    error = None
    if rank == 0:
        try:
            os.makedirs(save_dir, exist_ok=True)
            remove_partials(save_dir)
            os.makedirs(tmp)
        except OSError as err:
            error = f"cannot create {tmp}: {err}"
    error = _broadcast(error)
    if error:
        raise CheckpointError(error)
    pending = PendingSave(save_dir, step, save_id, tmp_name, {"rank": rank, "error": None})
    try:
        payload, index, metas = rank_payload(job, step, save_id)
    except Exception as err:  # noqa: BLE001 - reported to every rank by finish_save
        pending.report["error"] = f"rank {rank}: copying its state for the checkpoint failed: {err}"
        return pending
    pending.report.update(index=index, metas=metas, coord=payload["header"]["coord"], adam_step=payload["adam_step"])
    if background:
        pending.thread = threading.Thread(target=_write_rank_file, args=(pending, tmp, payload),
                                          name=f"hybridpar-save-{step}", daemon=True)
        pending.thread.start()
    else:
        _write_rank_file(pending, tmp, payload)
    return pending


def _write_rank_file(pending: PendingSave, tmp: str, payload: dict) -> None:
    rank = pending.report["rank"]
    try:
        name = rank_file_name(rank)
        record = write_tensors(os.path.join(tmp, name), payload)
        pending.report.update(name=name, record=asdict(record))
    except Exception as err:  # noqa: BLE001 - reported to every rank by finish_save
        pending.report["error"] = f"rank {rank}: writing its checkpoint file failed: {err}"


def save_checkpoint(job, save_dir: str, step: int, run=None, keep_last: int = 0) -> str:
    """Collective: save ``job`` after optimizer step ``step``. Returns the checkpoint directory."""
    return finish_save(job, begin_save(job, save_dir, step), run, keep_last)


def finish_save(job, pending: PendingSave, run=None, keep_last: int = 0) -> str:
    """Collective: wait for this rank's file, learn every rank's outcome, and (rank 0) commit:
    manifest, rename, ``latest``. A failure on any rank fails the save on every rank."""
    if pending.thread is not None:
        pending.thread.join()
    rank, save_dir, step, save_id, tmp_name = pending.report["rank"], pending.save_dir, pending.step, pending.save_id, pending.tmp_name
    tmp = os.path.join(save_dir, tmp_name)
    reports = [None] * dist.get_world_size()
    dist.all_gather_object(reports, pending.report)

    outcome = None
    if rank == 0:
        outcome = next((r["error"] for r in reports if r["error"]), None)
        if outcome is None:
            try:
                final = _commit(job, save_dir, tmp_name, step, save_id, reports, run)
                prune(save_dir, keep_last)
                outcome = ("ok", final)
            except Exception as err:  # noqa: BLE001
                outcome = f"committing {tmp} failed: {err}"
        if not isinstance(outcome, tuple):
            shutil.rmtree(tmp, ignore_errors=True)
    outcome = _broadcast(outcome)
    if not isinstance(outcome, (tuple, list)):
        raise CheckpointError(outcome)
    return outcome[1]


def _commit(job, save_dir, tmp_name, step, save_id, reports, run) -> str:
    tmp = os.path.join(save_dir, tmp_name)
    files, params = {}, {}
    for r in reports:
        files[r["name"]] = {**r["record"], "rank": r["rank"], "coord": r["coord"], "fragments": r["index"]}
        params.update(r["metas"])
    steps = {r["adam_step"] for r in reports}
    if len(steps) != 1:
        raise CheckpointError(f"ranks disagree on AdamW's step count: {sorted(steps)}")
    plan_text = job.plan.to_json() + "\n"
    files["plan.json"] = asdict(write_bytes(os.path.join(tmp, "plan.json"), plan_text.encode()))
    if run is not None:  # config.run.RunPlan: everything that reproduces the run
        files[RUN_FILE] = asdict(write_bytes(os.path.join(tmp, RUN_FILE), (run.to_json() + "\n").encode()))
    manifest = Manifest(
        step=step, save_id=save_id, plan=job.plan.to_dict(), files=files, params=params,
        adam_step=steps.pop(), optim=asdict(job.optim), seed=job.seed,
        data={"held_out": getattr(job.source, "held_out", 0.0), "blend": getattr(job.source, "blend", None)},
    )
    write_bytes(os.path.join(tmp, "manifest.json"), manifest.to_json().encode())
    return commit(save_dir, tmp_name, step, save_id)
