"""The plain alternatives hybridpar is timed against (benchmarks/overhead.py), one step each.

* ``DDPLoop``: the same megatron-core GPTModel (TP = PP = 1) in torch DistributedDataParallel,
  torch AdamW, gradient accumulation with ``no_sync``, ``clip_grad_norm_``.
* ``HandLoop``: megatron-core's own pipeline schedule (``get_forward_backward_func``) and a
  DeepSpeed engine built with megatron's ``parallel_state`` as its mpu: the minimal loop that
  drives the same two libraries without hybridpar's Job/StageEngine/pipeline layers.
Both take their rows from the same synthetic source as the hybridpar Job, so data and model
weights are identical.
"""
from __future__ import annotations


import torch
import torch.distributed as dist


def _forward_step(data_iterator, model):
    batch = next(data_iterator)
    tokens, labels = batch[:, :-1], batch[:, 1:]
    pos = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0).expand_as(tokens)
    out = model(tokens, pos, None, labels=labels)

    def loss_func(t):
        loss = t.float().mean()
        return loss, {"lm loss": loss.detach()}

    return out, loss_func


def _rows(source, plan, dp_rank: int, step: int, device) -> list[torch.Tensor]:
    from hybridpar.data import replica_batch

    return list(replica_batch(source, step, dp_rank, plan.dp).to(device).split(plan.micro_batch))


class DDPLoop:
    def __init__(self, job, lr: float = 1e-3):
        from hybridpar.runtime.model import ModelOptions, build_model

        plan = job.plan
        self.plan, self.source, self.dp_rank = plan, job.source, dist.get_rank()
        self.device = job.mesh.device
        opts = ModelOptions(seq_len=plan.seq_len, dtype=torch.float32)
        model = build_model(plan.model, job.mesh, opts, seed=0)[0]
        self.model = torch.nn.parallel.DistributedDataParallel(model)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)

    def step(self, step: int) -> None:
        batches = _rows(self.source, self.plan, self.dp_rank, step, self.device)
        for i, batch in enumerate(batches):
            ctx = self.model.no_sync() if i < len(batches) - 1 else _null()
            with ctx:
                out, loss_func = _forward_step(iter([batch]), self.model)
                loss, _ = loss_func(out)
                (loss / len(batches)).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class MegatronMPU:
    """The few calls DeepSpeed makes on an mpu, answered straight from megatron's parallel_state."""

    def __init__(self):
        from megatron.core import parallel_state as ps

        self.ps = ps

    def __getattr__(self, name):  # get_data_parallel_group, get_tensor_model_parallel_rank, ...
        return getattr(self.ps, name)

    def get_model_parallel_rank(self):
        return dist.get_rank(self.ps.get_model_parallel_group())

    def get_model_parallel_world_size(self):
        return dist.get_world_size(self.ps.get_model_parallel_group())


class HandLoop:
    def __init__(self, job, lr: float = 1e-3):
        import deepspeed
        from megatron.core import parallel_state as ps

        from hybridpar.zero.engine import deepspeed_config, param_groups
        from hybridpar.runtime.model import ModelOptions, build_model

        plan = job.plan
        self.plan, self.source = plan, job.source
        self.dp_rank = ps.get_data_parallel_rank()
        self.device = job.mesh.device
        opts = ModelOptions(seq_len=plan.seq_len, dtype=torch.float32)
        self.chunks = build_model(plan.model, job.mesh, opts, seed=0)
        opt = torch.optim.AdamW(param_groups(self.chunks, 0.1), lr=lr, betas=(0.9, 0.95))
        n = sum(p.numel() for c in self.chunks for p in c.parameters())
        cfg = deepspeed_config(plan.zero_stage, plan.micro_batch, plan.grad_accum, plan.dp, 1.0, False, int(min(5e7, n)))
        self.engine, _, _, _ = deepspeed.initialize(model=torch.nn.ModuleList(self.chunks), optimizer=opt, config=cfg,
                                                    mpu=MegatronMPU(), dist_init_required=False)

    def step(self, step: int) -> None:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        batches = _rows(self.source, self.plan, self.dp_rank, step, self.device)
        get_forward_backward_func()(
            forward_step_func=_forward_step, data_iterator=iter(batches), model=self.chunks[0],
            num_microbatches=len(batches), seq_length=self.plan.seq_len, micro_batch_size=self.plan.micro_batch)
        self.engine.step()
        for c in self.chunks:
            for p in c.parameters():
                p.grad = None
