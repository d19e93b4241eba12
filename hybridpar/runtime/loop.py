"""The training loop of ``hybridpar train``: a RunPlan in, steps, metrics and saves out.

``train(run, hooks)`` builds the data source and the Job, asks the hooks where to start (a
checkpoint or Hugging Face weights), loops over the steps, prints one line per step on rank 0
and appends metrics.jsonl, and stops early when the ranks agree to (reliability/stopping.py).
``run_hooks(run)`` is the standard set of hooks for a RunPlan. A hook may define
``on_start(job, first_step)`` (returns the step to start from), ``on_step_begin(job, step)``,
``after_step(job, metrics)`` (before the step is logged), ``step_record(job, metrics)`` (extra
metrics.jsonl keys and step-line text), ``on_step(job, metrics)``, ``on_stop(job, metrics)``,
``save_written()`` (its background save's vote), ``on_world_change(job)`` (a DP replica was lost
or taken in: the job was rebuilt) and ``defers_join(step)`` (no restarted replica is taken in
after this step; every rank must answer alike).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

import torch.distributed as dist

from hybridpar.files import write_atomic
from hybridpar.reliability.nonfinite import check_step
from hybridpar.reliability.run_dir import keep_steps_before
from hybridpar.reliability.stopping import StopReason
from hybridpar.runtime.job import Job, StepMetrics


def _append_line(path: str, record: dict) -> None:
    """Append one whole JSON line with a single write (readers never see half a line)."""
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def format_step(m: StepMetrics, total: int) -> str:
    held_out = f" | eval loss {m.eval_loss:.6f} ({m.eval_time_s:.2f} s)" if m.eval_loss is not None else ""
    return (
        f"step {m.step}/{total} | loss {m.loss:.6f}{held_out} | grad norm {m.grad_norm:.4f} | lr {m.lr:.3e} | "
        f"{m.step_time_s:.3f} s | {m.tokens_per_s:,.0f} tokens/s"
    )


def _all_written(hooks) -> bool | None:
    """This rank's vote on the checkpoint in flight: None when no hook has one."""
    votes = [v for v in (h.save_written() for h in hooks if hasattr(h, "save_written")) if v is not None]
    return all(votes) if votes else None


@dataclass
class TrainOutcome:
    history: list  # StepMetrics of the steps this run trained
    stopped: StopReason | None = None  # set when the run stopped before its last step


def train(run, hooks=(), print_fn=print, stop=None) -> TrainOutcome:
    """Train ``run`` (config.run.RunPlan) on the already-initialised process group. ``stop``
    (stopping.StopConditions) may end it after any step; the hooks' ``on_stop`` (the
    checkpointer: save that step) run first. With ``run.reliability.tolerate_replica_loss`` a
    lost DP replica is dropped and the survivors go on (reliability/replica_loss.py)."""
    from hybridpar.data import make_token_source

    plan, d = run.plan, run.data
    source = make_token_source(d.source, seq_len=plan.seq_len, global_batch_size=plan.global_batch,
                               model_vocab=plan.model.vocab, seed=run.seed, path=d.path, tokenizer=d.tokenizer,
                               data_dir=d.data_dir, cache_dir=d.cache_dir, held_out=d.held_out,
                               blend=d.blend)

    def build(layout) -> Job:
        return Job(layout, run.optim, source, seed=run.seed, overlap_grad_reduce=run.overlap_grad_reduce,
                   overlap_param_gather=run.overlap_param_gather)

    tolerance = _tolerance(run)
    hooks = ([tolerance.snapshots] if tolerance else []) + list(hooks)
    if tolerance is not None and tolerance.joining():
        job, first, line = tolerance.join(build, run.plan)
        _world_changed(hooks, job)
        if dist.get_rank() == 0:
            print_fn(f"hybridpar train: {line}")
    else:
        job, first = build(plan), 1
        for hook in hooks:
            first = max(first, int(getattr(hook, "on_start", lambda j, s: s)(job, first) or first))
        if tolerance is not None:
            tolerance.snapshots.take(job, first - 1)  # the starting state: a loss in the first step goes back here
    metrics_path = _open_metrics(run, first)
    outcome = TrainOutcome([])
    step = first
    last_end = time.monotonic()
    while step <= run.steps:
        try:
            m = _one_step(job, step, run, hooks, stop, print_fn, metrics_path)
            last_end = time.monotonic()
            outcome.history.append(m)
            if m.stop and step < run.steps:
                outcome.stopped = StopReason(m.stop, step)
                for hook in hooks:
                    if hasattr(hook, "on_stop"):
                        hook.on_stop(job, m)
                break
            if tolerance is not None and step < run.steps and not _join_deferred(hooks, step) \
                    and tolerance.someone_waits(job):
                job, line = tolerance.take_in(job, build, run.plan, step)
                _world_changed(hooks, job)
                metrics_path = _open_metrics(run, step + 1)
                if dist.get_rank() == 0:
                    print_fn(f"hybridpar train: {line}")
            step += 1
        except Exception as err:
            if tolerance is None or not (_lost_peer(err) or tolerance.world.left):
                raise
            tolerance.failed(err)
        else:
            continue
        # A peer was lost. Recovered outside the except block: the traceback's frames hold the old
        # job, which is freed before the new one is built.
        job, step, line = tolerance.recover(job, build, run.plan, step)
        _world_changed(hooks, job)
        metrics_path = _open_metrics(run, step)
        outcome.history = [h for h in outcome.history if h.step < step]
        if dist.get_rank() == 0:
            print_fn(f"hybridpar train: {line}; step {step} begins {time.monotonic() - last_end:.1f} s after "
                     f"the last step ended")
    job.close()
    return outcome


def _join_deferred(hooks, step: int) -> bool:
    """A hook keeps a waiting replica out after this step (the same answer on every rank)."""
    return any(hook.defers_join(step) for hook in hooks if hasattr(hook, "defers_join"))


def _world_changed(hooks, job) -> None:
    for hook in hooks:
        if hasattr(hook, "on_world_change"):
            hook.on_world_change(job)


def _one_step(job, step: int, run, hooks, stop, print_fn, metrics_path):
    for hook in hooks:
        if hasattr(hook, "on_step_begin"):
            hook.on_step_begin(job, step)
    m = job.train_step(step, stop, lambda: _all_written(hooks))
    check_step(m)  # a non-finite loss or gradient norm ends the run before anything records the step
    for hook in hooks:
        if hasattr(hook, "after_step"):  # before the step is logged (replica_loss.Snapshots keeps its state)
            hook.after_step(job, m)
    record, line = asdict(m), format_step(m, run.steps)
    record.pop("stop"), record.pop("saves_written")
    if record["eval_loss"] is None:
        record.pop("eval_loss"), record.pop("eval_time_s")
    for hook in hooks:
        if hasattr(hook, "step_record"):  # extra metrics.jsonl keys and step-line text (metrics.StepMonitor)
            extra, text = hook.step_record(job, m)
            record.update(extra)
            line += text
    if dist.get_rank() == 0:
        print_fn(line)
        if metrics_path:
            _append_line(metrics_path, record)
    for hook in hooks:
        if hasattr(hook, "on_step"):
            hook.on_step(job, m)
    if stop is not None:
        stop.observe(step_s=m.step_time_s)
    return m


def _open_metrics(run, first: int) -> str | None:
    """Rank 0 (of the current world): plan.json, and metrics.jsonl without the steps from ``first``
    on (a resumed or recovered run writes them again)."""
    if not run.out or dist.get_rank() != 0:
        return None
    os.makedirs(run.out, exist_ok=True)
    write_atomic(os.path.join(run.out, "plan.json"), run.to_json() + "\n")
    path = os.path.join(run.out, "metrics.jsonl")
    keep_steps_before(path, first)
    return path


def _tolerance(run):
    from hybridpar.reliability.replica_loss import Tolerance, tolerant

    if not tolerant():
        return None
    import torch

    return Tolerance(run.plan, "nccl" if torch.cuda.is_available() else "gloo", run.reliability.rejoin_after_s is not None)


def _lost_peer(err: BaseException) -> bool:
    from hybridpar.launch.local import is_lost_peer

    return is_lost_peer(err)


def run_hooks(run, print_fn=print, stop=None, monitor=None) -> list:
    """The hooks of a ``hybridpar train`` run, in their order: fault injection (tests only) and
    the replica check, the held-out evaluation, the profiler, the Hugging Face start and the
    checkpointer, the per-step monitor (metrics.StepMonitor), the sample after the last step."""
    from hybridpar.checkpoint.hook import run_checkpoint_hooks
    from hybridpar.observe.sample import SampleHook
    from hybridpar.reliability.faults import hooks_from_env

    hooks = hooks_from_env()
    r = run.reliability
    if r.check_replicas > 0:
        from hybridpar.reliability.replicas import ReplicaCheck

        hooks.append(ReplicaCheck(r.check_replicas, r.on_drift, print_fn=print_fn))
    if run.eval.every > 0:
        from hybridpar.observe.evaluation import EvalHook

        hooks.append(EvalHook(run.eval.every, run.eval.batches, run.steps))
    if run.profile.on:
        from hybridpar.observe.profile import ProfileHook

        hooks.append(ProfileHook(run.out, run.profile, print_fn=print_fn))
    hooks += run_checkpoint_hooks(run, print_fn, stop)
    if monitor is not None:
        hooks.append(monitor)
    hooks.append(SampleHook(run.sample, run.steps, run.out, print_fn=print_fn))
    return hooks
