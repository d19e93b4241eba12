"""One training step's forward and backward passes through megatron-core's pipeline schedules.

- PP = 1: ``forward_backward_no_pipelining`` (gradient accumulation over the micro-batches);
- PP > 1: 1F1B (``forward_backward_pipelining_without_interleaving``);
- PP > 1 with virtual stages: the interleaved 1F1B schedule.

megatron picks the schedule from its parallel state (set by the mesh). The raw model chunks
go to the schedule (not a DeepSpeed engine: megatron reads ``model.config``). Each micro-batch
loss is the mean over its tokens, and the schedule divides it by the number of micro-batches,
so the accumulated gradient is that of the mean loss over the replica's rows. With context
parallelism each CP rank takes its two load-balanced chunks of every row (``context_parallel_slice``)
and its loss is the mean over those tokens; DeepSpeed's average over the DP x CP group then
gives the gradient of the mean over all tokens (every CP rank has the same number of them). DP averaging is
DeepSpeed's job (engine.py). What megatron's ``finalize_model_grads`` would do besides DP
reduction is done here, on the mesh's groups: the tied-embedding gradient sum over the
embedding group, and the TP sum of sequence-parallel norm-weight gradients.
"""
from __future__ import annotations


import functools

import torch
import torch.distributed as dist


def _loss_func(cp: int, output_tensor: torch.Tensor):
    loss = output_tensor.float().mean()
    logged = loss.detach().clone()  # the schedule scales `loss` in place
    if cp > 1:  # megatron's schedule multiplies a (loss, dict) loss by the CP size: undo it
        loss = loss / cp
    return loss, {"lm loss": logged}


def context_parallel_slice(t: torch.Tensor, cp: int, cp_rank: int, dim: int = 1) -> torch.Tensor:
    """This CP rank's part of t along its sequence dimension ``dim`` ([b, s, ...] by default): chunks cp_rank
    and 2cp-1-cp_rank of 2cp equal chunks (megatron's load-balanced causal split; its RoPE and hybridpar's
    attention assume it)."""
    if cp == 1:
        return t
    chunks = t.chunk(2 * cp, dim=dim)
    return torch.cat([chunks[cp_rank], chunks[2 * cp - 1 - cp_rank]], dim=dim)


def _forward_step_for(mesh):
    """megatron's forward-step function for this rank: its CP slice of each micro-batch, the
    model's output and the loss function (CP size and rank from the mesh)."""
    cp, cp_rank = mesh.size("cp"), mesh.rank_in("cp")

    def forward_step(data_iterator, model):
        batch = next(data_iterator)
        tokens, labels = batch[:, :-1], batch[:, 1:]
        position_ids = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0).expand_as(tokens)
        tokens, labels, position_ids = (context_parallel_slice(t, cp, cp_rank) for t in (tokens, labels, position_ids))
        output = model(tokens, position_ids, None, labels=labels)
        return output, functools.partial(_loss_func, cp)

    return forward_step


def micro_batches(rows: torch.Tensor, micro_batch: int) -> list[torch.Tensor]:
    """Split a replica's rows [n, seq+1] into micro-batches, in order."""
    if rows.shape[0] % micro_batch:
        raise ValueError(f"{rows.shape[0]} rows not divisible by micro-batch {micro_batch}")
    return list(rows.split(micro_batch))


def forward_backward(chunks: list, mesh, batches: list[torch.Tensor], seq_len: int, forward_only: bool = False):
    """Run one step's micro-batches through this rank's chunks.

    Returns the replica's mean loss on the last pipeline stage (a float tensor), else None.
    Gradients are left accumulated in ``p.grad`` (main_grad is not used).
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    fb = get_forward_backward_func()
    n = len(batches)
    iterators = [iter(list(batches)) for _ in chunks]
    store = fb(
        forward_step_func=_forward_step_for(mesh),
        data_iterator=iterators if len(chunks) > 1 else iterators[0],
        model=chunks if len(chunks) > 1 else chunks[0],
        num_microbatches=n,
        seq_length=seq_len,
        micro_batch_size=batches[0].shape[0],
        forward_only=forward_only,
    )
    if not mesh.is_last_stage:
        return None
    losses = [d["lm loss"] for d in store]
    return torch.stack(losses).mean() if losses else None


def model_parallel_summed_params(chunks: list, mesh, tied: bool, sequence_parallel: bool) -> tuple[list, object]:
    """(sequence-parallel parameters whose gradients are summed over TP, the tied embedding or
    output weight summed over the embedding group, or None): what
    ``finalize_model_parallel_grads`` sums. Their DP-averaged gradients must be whole first."""
    sp = []
    if sequence_parallel and mesh.size("tp") > 1:
        sp = [p for c in chunks for p in c.parameters() if getattr(p, "sequence_parallel", False)]
    weight = None
    if tied and mesh.layout.pp > 1 and (mesh.is_first_stage or mesh.is_last_stage):
        chunk = chunks[0] if mesh.is_first_stage else chunks[-1]
        weight = chunk.shared_embedding_or_output_weight()
    return sp, weight


def finalize_model_parallel_grads(chunks: list, mesh, tied: bool, sequence_parallel: bool) -> None:
    """Gradient sums that model parallelism needs besides the DP reduction (not DP itself)."""
    sp, weight = model_parallel_summed_params(chunks, mesh, tied, sequence_parallel)
    _all_reduce_flat([p.grad for p in sp if p.grad is not None], mesh.group("tp"))
    if weight is not None:
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        dist.all_reduce(weight.grad, group=mesh.group("embedding"))


def _all_reduce_flat(grads: list[torch.Tensor], group) -> None:
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
