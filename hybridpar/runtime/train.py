"""The training loop: wires mesh, model, schedule and engine, and nothing else.

``Job`` holds one layout's running state (mesh, model chunks, DeepSpeed engine, data source);
``Job.train_step(step)`` is one optimizer step over one global batch and returns its metrics.
``train(recipe, out_dir)`` is the whole run used by ``hybridpar train``: it builds a Job,
loops over the steps, prints one line per step on rank 0 and appends metrics.jsonl.

Extension points (issue 4):
- data: ``recipe.data.build(...)`` returns any object with the ``hybridpar.data`` batch
  contract (``global_batch(step)`` -> LongTensor [global_batch, seq_len + 1]);
- hooks: ``train(..., hooks=[...])`` calls ``hook.on_start(job, first_step)`` once (a checkpoint
  loader returns the step to resume from), ``hook.on_step_begin(job, step)`` before every step
  (fault injection), and ``hook.on_step(job, metrics)`` after every step (checkpoint saving,
  replica hashing, extra metrics);
  ``hook.step_record(job, metrics)`` returns ``(extra keys, text)`` for metrics.jsonl and the
  step line (hybridpar.metrics.StepMonitor: FLOP/s, MFU, predicted step time).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from hybridpar.topology.plan import Plan

from hybridpar.data.prefetch import BatchPrefetcher
from hybridpar.zero.engine import OptimConfig, StageEngine, lr_at
from hybridpar.zero.grad_sync import DEFAULT_BUCKET_NUMEL
from hybridpar.runtime.mesh import Mesh
from hybridpar.runtime.model import ModelOptions, build_model, canonical_params, full_from_shards
from hybridpar.runtime.pipeline import finalize_model_parallel_grads, forward_backward, micro_batches, model_parallel_summed_params
from hybridpar.reliability.run_dir import keep_steps_before
from hybridpar.reliability.stopping import STOP_REASONS, StopReason


@dataclass
class StepMetrics:
    step: int
    loss: float
    grad_norm: float
    lr: float
    step_time_s: float
    tokens_per_s: float
    stop: int = 0  # the reason every rank agreed to stop after this step (stopping.py), 0: none
    saves_written: bool = False  # every rank's background checkpoint file is written (checkpoint/hook.py)


def resolve_dtype(precision: str) -> torch.dtype:
    if precision == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]


class Job:
    """One layout's model, engine and data on this rank. Requires torch.distributed to be up."""

    def __init__(self, plan: Plan, optim: OptimConfig, source, seed: int = 0, tied: bool | None = None,
                 overlap_grad_reduce: bool = True, grad_bucket_numel: int = DEFAULT_BUCKET_NUMEL,
                 overlap_param_gather: bool = True):
        self.plan, self.optim, self.source, self.seed = plan, optim, source, seed
        self.mesh = Mesh.build(plan.layout, vpp=plan.vpp)
        self.dtype = resolve_dtype(plan.precision)
        self.tied = plan.model.tied_embeddings if tied is None else tied
        self.sequence_parallel = plan.sequence_parallel and plan.tp > 1
        opts = ModelOptions(seq_len=plan.seq_len, sequence_parallel=self.sequence_parallel, tied_embeddings=self.tied,
                            dtype=self.dtype, rope_base=plan.model.rope_theta, recompute=plan.recompute,
                            lighter_end_stages=plan.lighter_end_stages)
        torch.manual_seed(seed)
        self.engine = None
        self._chunks = build_model(plan.model, self.mesh, opts, seed=seed)
        self.batches = BatchPrefetcher(source, self.mesh.dp_rank, plan.dp, self.mesh.device)
        self.engine = StageEngine(
            self._chunks, self.mesh, optim, plan.zero_stage, plan.micro_batch, plan.grad_accum,
            bf16=self.dtype == torch.bfloat16, overlap_grad_reduce=overlap_grad_reduce,
            grad_bucket_numel=grad_bucket_numel, whole_grad_params=self._model_parallel_summed(),
            overlap_param_gather=overlap_param_gather,
        )

    @property
    def chunks(self) -> list:
        """This rank's model chunks, their weights up to date: with ``overlap_param_gather`` the
        last step's gather may still be in flight, and every reader outside the training step
        (checkpoints, state dicts, replica checks, tests) comes through here."""
        if self.engine is not None:
            self.engine.sync_weights()
        return self._chunks

    def _model_parallel_summed(self) -> list:
        sp, weight = model_parallel_summed_params(self._chunks, self.mesh, self.tied, self.sequence_parallel)
        return sp + ([weight] if weight is not None else [])

    # --- one step ---------------------------------------------------------------------
    def replica_batches(self, step: int) -> list[torch.Tensor]:
        return micro_batches(self.batches.rows(step), self.plan.micro_batch)

    def train_step(self, step: int, stop=None, save_written=None) -> StepMetrics:
        """One optimizer step. ``stop`` (stopping.StopConditions): this rank's reason to stop, read
        as the step ends and agreed over the world in the step's loss all-reduce; so is
        ``save_written()`` (whether this rank's background checkpoint file is on disk; None: no
        save in flight), asked at the same moment, so a file written during the step counts."""
        start = time.perf_counter()
        lr = lr_at(step, self.optim, self.plan.global_batch)
        loss = forward_backward(self._chunks, self.mesh, self.replica_batches(step), self.plan.seq_len)
        self.engine.finish_grad_reduction()
        finalize_model_parallel_grads(self._chunks, self.mesh, self.tied, self.sequence_parallel)
        norm = self.engine.step(lr)
        self.engine.zero_grad()
        mean_loss, agreed, written = self._global_loss_and_agreements(
            loss, stop.local_code(step) if stop else 0, save_written() if save_written else None)
        elapsed = time.perf_counter() - start
        tokens = self.plan.global_batch * self.plan.seq_len
        return StepMetrics(step, mean_loss, norm, lr, elapsed, tokens / elapsed if elapsed > 0 else 0.0, agreed, written)

    def _global_loss_and_agreements(self, replica_loss, stop_code: int, save_written: bool | None):
        """(mean loss over the global batch, the stop reason the ranks agree on, whether every
        rank's background checkpoint file is written), on every rank: one small all-reduce.

        Only the last stage of each replica holds its loss; every TP (x CP) rank there holds
        the same value, so the world sum counts each replica tp x cp times. Each rank adds a 1
        at its stop reason's slot: the first slot (in ``STOP_REASONS`` order) any rank marked
        wins; and a 1 in the last slot when its file is written: all are when the sum is the world."""
        value = torch.zeros(2 + len(STOP_REASONS), dtype=torch.float64, device=self.mesh.device)
        if replica_loss is not None:
            value[0] += float(replica_loss)
        if stop_code:
            value[1 + STOP_REASONS.index(stop_code)] = 1.0
        value[-1] = 1.0 if save_written else 0.0
        world = dist.get_world_size()
        if world > 1:
            dist.all_reduce(value)
        marked = value[1:-1].tolist()
        agreed = next((code for code, n in zip(STOP_REASONS, marked) if n > 0), 0)
        written = save_written is not None and int(value[-1]) == world
        return float(value[0]) / (self.plan.dp * self.plan.tp * self.plan.cp), agreed, written

    # --- inspection -------------------------------------------------------------------
    def full_state_dict(self, dst: int = 0) -> dict[str, torch.Tensor]:
        """Every parameter as its full one-process fp32 tensor, on the CPU of rank ``dst`` ({} on
        the other ranks). Collective. TP shards are gathered inside each TP group of the first
        replica's first CP rank; each pipeline stage's TP rank 0 moves its full tensors to the host
        and sends them to ``dst`` alone (small models: the whole model is held by one process)."""
        mesh, local = self.mesh, {}
        sender = mesh.dp_rank == 0 and mesh.coord.cp == 0
        for cname, p in canonical_params(self.chunks):
            if not sender:
                continue
            shard = p.detach().float().contiguous()
            if mesh.size("tp") > 1 and getattr(p, "tensor_model_parallel", False):
                shards = [torch.empty_like(shard) for _ in range(mesh.size("tp"))]
                dist.all_gather(shards, shard, group=mesh.group("tp"))
            else:
                shards = [shard]
            if mesh.tp_rank == 0:
                local[cname] = full_from_shards(cname, p, shards).to("cpu")
        gathered = [None] * dist.get_world_size() if dist.get_rank() == dst else None
        dist.gather_object(local, gathered, dst=dst)
        merged = {}
        for part in gathered or ():
            merged.update(part)
        return merged

    def close(self) -> None:
        if self.engine is not None:
            self.engine.sync_weights()  # no gather left in flight when the groups go
        self.engine = None
        self._chunks = None
        self.batches.close()
        self.mesh.destroy()


# --- the run ------------------------------------------------------------------------------
def _append_line(path: str, record: dict) -> None:
    """Append one whole JSON line with a single write (readers never see half a line)."""
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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


def train(recipe, out_dir: str | None, hooks=(), print_fn=print, stop=None) -> TrainOutcome:
    """Train ``recipe`` (a hybridpar.recipe.Recipe) on the already-initialised process group.
    ``stop`` (stopping.StopConditions) may end the run after any step; the hooks' ``on_stop``
    (the checkpointer: save that step) run first."""
    plan = recipe.to_plan()
    source = recipe.data.build(seq_len=plan.seq_len, global_batch=plan.global_batch, vocab=plan.model.vocab, seed=recipe.train.seed)
    job = Job(plan, recipe.optim_config(), source, seed=recipe.train.seed,
              overlap_grad_reduce=recipe.parallel.overlap_grad_reduce,
              overlap_param_gather=recipe.parallel.overlap_param_gather)
    rank0 = dist.get_rank() == 0
    first = 1
    for hook in hooks:
        first = max(first, int(getattr(hook, "on_start", lambda j, s: s)(job, first) or first))
    metrics_path = None
    if out_dir and rank0:
        os.makedirs(out_dir, exist_ok=True)
        write_atomic(os.path.join(out_dir, "plan.json"), plan.to_json() + "\n")
        metrics_path = os.path.join(out_dir, "metrics.jsonl")
        keep_steps_before(metrics_path, first)  # a resumed run writes the later steps again
    outcome = TrainOutcome([])
    for step in range(first, recipe.train.steps + 1):
        for hook in hooks:
            if hasattr(hook, "on_step_begin"):
                hook.on_step_begin(job, step)
        m = job.train_step(step, stop, lambda: _all_written(hooks))
        outcome.history.append(m)
        record, line = asdict(m), format_step(m, recipe.train.steps)
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
        if m.stop and step < recipe.train.steps:
            outcome.stopped = StopReason(m.stop, step)
            for hook in hooks:
                if hasattr(hook, "on_stop"):
                    hook.on_stop(job, m)
            break
    job.close()
    return outcome
