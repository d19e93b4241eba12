"""Loading into any layout of the same model: verify, then read each parameter's new shard.

Verification is spread over the ranks (file i is hashed by rank i mod world, once), and every
rank learns every problem, so all ranks fail together with the same one-line error. Files are
then memory-mapped with ``torch.load(weights_only=True)``: no code from the file runs, and a rank
reads only the fragments its new shard needs (plus the whole TP shard of each weight).
"""
from __future__ import annotations

import torch.distributed as dist

from hybridpar.runtime.model import canonical_params
from hybridpar.checkpoint import rng
from hybridpar.checkpoint.compat import check_compatible, layout_text, same_ranks
from hybridpar.checkpoint.files import CheckpointError, check_file, read_manifest, resolve
from hybridpar.checkpoint.optim import MOMENTS, OptimizerView
from hybridpar.checkpoint.reshard import CheckpointReader
from hybridpar.checkpoint.save import param_meta
from hybridpar.compat import deepspeed as deepspeed_compat


def _agree(error: str | None) -> None:
    """Collective: raise the first rank's error on every rank."""
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    first = next((e for e in errors if e), None)
    if first:
        raise CheckpointError(first)


def on_every_rank(fn):
    """Collective: ``fn()`` on this rank; a failure on any rank fails every rank with the first
    rank's message (the others would hang at the next collective otherwise)."""
    error, failure, result = None, None, None
    try:
        result = fn()
    except Exception as err:  # noqa: BLE001 - every rank must learn of it
        error, failure = f"rank {dist.get_rank()}: {err}", err
    try:
        _agree(error)
    except CheckpointError:
        if failure is not None and not isinstance(failure, CheckpointError):
            raise failure  # a bug, not a damaged file: keep its traceback on the rank that hit it
        raise
    return result


def verify_distributed(step_dir: str, manifest) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    error = None
    for name in sorted(manifest.files)[rank::world]:
        error = error or check_file(step_dir, name, manifest.files[name])
    _agree(error)


def load_into(job, reader: CheckpointReader) -> None:
    """This rank's weights, fp32 masters and AdamW moments from ``reader`` (no collectives)."""
    mesh, view = job.mesh, OptimizerView(job.engine, job.mesh.rank_in("dp_cp"))
    tp, tp_rank = mesh.size("tp"), mesh.tp_rank
    view.prepare(reader.manifest.adam_step)
    for cname, p in canonical_params(job.chunks):
        saved, mine = reader.meta(cname), param_meta(cname, p, tp)
        if saved["full_shape"] != mine["full_shape"]:
            raise CheckpointError(f"checkpoint {reader.step_dir}: {cname} has shape {saved['full_shape']}, this model's is {mine['full_shape']}")
        value = reader.tensor(cname, "param", tp, tp_rank)
        if list(value.shape) != list(p.shape):
            raise CheckpointError(f"checkpoint {reader.step_dir}: {cname} gives a shard of shape {list(value.shape)}, this rank holds {list(p.shape)}")
        view.set_param(p, value)
        span = view.needed_range(p)
        if span is not None:
            for key in MOMENTS:
                view.set_moment(p, key, reader.flat_range(cname, key, tp, tp_rank, *span))


def load_checkpoint(job, path: str, restore_rng: bool = True, print_fn=None) -> int:
    """Collective: load the checkpoint at ``path`` (a step dir, or a save dir: its latest) into
    ``job``, whatever the saved layout. Returns the step it was saved after."""
    error, step_dir, manifest = None, None, None
    try:
        step_dir = resolve(path)
        manifest = read_manifest(step_dir)
        check_compatible(manifest, job.plan, step_dir)
    except CheckpointError as err:
        error = str(err)
    _agree(error)
    verify_distributed(step_dir, manifest)
    if print_fn and dist.get_rank() == 0:
        old, new = layout_text(manifest.plan), layout_text(job.plan.to_dict())
        note = "" if old == new else f", resharded from {old} to {new}"
        print_fn(f"resuming from {step_dir} (step {manifest.step}{note})")
    reader = CheckpointReader(step_dir, manifest)

    def load():
        load_into(job, reader)
        if restore_rng and same_ranks(manifest, job.plan):
            rng.restore(reader.rank_data(dist.get_rank())["rng"])

    on_every_rank(load)
    deepspeed_compat.set_step_counters(job.engine.engine, manifest.step, manifest.step * job.plan.global_batch)
    return manifest.step
