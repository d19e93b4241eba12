"""The training loop of ``hybridpar train``: a RunPlan in, steps, metrics and saves out.

``train(run, hooks)`` builds the data source and the Job, asks the hooks where to start (a
checkpoint or Hugging Face weights), loops over the steps, prints one line per step on rank 0
and appends metrics.jsonl, and stops early when the ranks agree to (reliability/stopping.py).
``run_hooks(run)`` is the standard set of hooks for a RunPlan. A hook may define
``on_start(job, first_step)`` (returns the step to start from), ``on_step_begin(job, step)``,
``step_record(job, metrics)`` (extra metrics.jsonl keys and step-line text), ``on_step(job,
metrics)``, ``on_stop(job, metrics)`` and ``save_written()`` (its background save's vote).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import torch.distributed as dist

from hybridpar.files import write_atomic
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
    return (
        f"step {m.step}/{total} | loss {m.loss:.6f} | grad norm {m.grad_norm:.4f} | lr {m.lr:.3e} | "
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
    checkpointer: save that step) run first."""
    from hybridpar.data import make_token_source

    plan, d = run.plan, run.data
    source = make_token_source(d.source, seq_len=plan.seq_len, global_batch_size=plan.global_batch,
                               model_vocab=plan.model.vocab, seed=run.seed, path=d.path, tokenizer=d.tokenizer,
                               data_dir=d.data_dir, cache_dir=d.cache_dir)
    job = Job(plan, run.optim, source, seed=run.seed, overlap_grad_reduce=run.overlap_grad_reduce,
              overlap_param_gather=run.overlap_param_gather)
    rank0 = dist.get_rank() == 0
    first = 1
    for hook in hooks:
        first = max(first, int(getattr(hook, "on_start", lambda j, s: s)(job, first) or first))
    metrics_path = None
    if run.out and rank0:
        os.makedirs(run.out, exist_ok=True)
        write_atomic(os.path.join(run.out, "plan.json"), run.to_json() + "\n")
        metrics_path = os.path.join(run.out, "metrics.jsonl")
        keep_steps_before(metrics_path, first)  # a resumed run writes the later steps again
    outcome = TrainOutcome([])
    for step in range(first, run.steps + 1):
        for hook in hooks:
            if hasattr(hook, "on_step_begin"):
                hook.on_step_begin(job, step)
        m = job.train_step(step, stop, lambda: _all_written(hooks))
        outcome.history.append(m)
        record, line = asdict(m), format_step(m, run.steps)
        record.pop("stop"), record.pop("saves_written")
        for hook in hooks:
            if hasattr(hook, "step_record"):  # extra metrics.jsonl keys and step-line text (metrics.StepMonitor)
                extra, text = hook.step_record(job, m)
                record.update(extra)
                line += text
        if rank0:
            print_fn(line)
            if metrics_path:
                _append_line(metrics_path, record)
        for hook in hooks:
            if hasattr(hook, "on_step"):
                hook.on_step(job, m)
        if stop is not None:
            stop.observe(step_s=m.step_time_s)
        if m.stop and step < run.steps:
            outcome.stopped = StopReason(m.stop, step)
            for hook in hooks:
                if hasattr(hook, "on_stop"):
                    hook.on_stop(job, m)
            break
    job.close()
    return outcome


def run_hooks(run, print_fn=print, stop=None, monitor=None) -> list:
    """The hooks of a ``hybridpar train`` run, in their order: fault injection (tests only) and
    the replica check, the Hugging Face start and the checkpointer, the per-step monitor
    (metrics.StepMonitor), the sample after the last step."""
    from hybridpar.checkpoint.hook import run_checkpoint_hooks
    from hybridpar.observe.sample import SampleHook
    from hybridpar.reliability.faults import hooks_from_env

    hooks = hooks_from_env()
    r = run.reliability
    if r.check_replicas > 0:
        from hybridpar.reliability.replicas import ReplicaCheck

        hooks.append(ReplicaCheck(r.check_replicas, r.on_drift, print_fn=print_fn))
    hooks += run_checkpoint_hooks(run, print_fn, stop)
    if monitor is not None:
        hooks.append(monitor)
    hooks.append(SampleHook(run.sample, run.steps, run.out, print_fn=print_fn))
    return hooks
