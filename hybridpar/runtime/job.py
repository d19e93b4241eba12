"""One layout's running state on this rank, and one optimizer step.

``Job(plan, optim, source, seed)`` builds the mesh (every process group), this rank's model
chunks (megatron-core, canonical initial weights), its DeepSpeed ZeRO engine and its batch
prefetcher; ``Job.train_step(step)`` runs one optimizer step over one global batch (megatron's
schedule, the DP reduction, the model-parallel gradient sums, AdamW) and returns its metrics,
agreeing across the world on the loss, an early stop and a background save's completion in one
small all-reduce. ``Job.full_state_dict()`` gathers the one-process weights to rank 0.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hybridpar.config.optim import OptimConfig, lr_at
from hybridpar.data.batches import replica_batch
from hybridpar.data.prefetch import BatchPrefetcher
from hybridpar.reliability.stopping import STOP_REASONS
from hybridpar.runtime.mesh import Mesh
from hybridpar.runtime.model import ModelOptions, build_model, canonical_params, full_from_shards
from hybridpar.runtime.pipeline import finalize_model_parallel_grads, forward_backward, micro_batches, model_parallel_summed_params
from hybridpar.topology.plan import Plan
from hybridpar.zero.engine import StageEngine
from hybridpar.zero.grad_sync import DEFAULT_BUCKET_NUMEL


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
    eval_loss: float | None = None  # mean loss on the held-out batches after this step (observe/evaluation.py)
    eval_time_s: float | None = None  # how long that evaluation took (not in step_time_s)


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

    def evaluate(self, source, batches: int) -> float:
        """Mean loss of the current weights over global batches 1..``batches`` of ``source`` (a
        held-out source under the batch contract), on every rank. Each replica takes its rows of
        each batch, as in training, through megatron's schedule in forward-only mode; the sum over
        the world counts each replica's loss tp x cp times, as in ``_global_loss_and_agreements``.
        Collective."""
        chunks = self.chunks  # the last step's weights, gathered
        total = torch.zeros(1, dtype=torch.float64, device=self.mesh.device)
        with torch.no_grad():
            for k in range(1, batches + 1):
                rows = replica_batch(source, k, self.mesh.dp_rank, self.plan.dp).to(self.mesh.device)
                loss = forward_backward(chunks, self.mesh, micro_batches(rows, self.plan.micro_batch),
                                        self.plan.seq_len, forward_only=True)
                if loss is not None:
                    total += float(loss)
        if dist.get_world_size() > 1:
            dist.all_reduce(total)
        return float(total) / (self.plan.dp * self.plan.tp * self.plan.cp * batches)

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

    def abandon(self) -> None:
        """Drop this job without a collective: its world lost a member (reliability/replica_loss.py)."""
        self._drop()

    def close(self) -> None:
        if self.engine is not None:
            self.engine.sync_weights()  # no gather left in flight when the groups go
        self._drop()

    def _drop(self) -> None:
        """Release the model, optimizer and groups, so that they can be freed."""
        if self.engine is not None:
            self.engine.release()
        self.engine = None
        self._chunks = None
        self.batches.close()
        self.mesh.destroy()
