"""How many bytes of memory traffic hybridpar's optimizer step moves per parameter, counted on CPU.

The planner charges the step at HBM bandwidth (topology/cost.py optimizer_step_bytes,
Software.optimizer_step_bytes_counted). The count: ``StageEngine.step()`` (hybridpar/zero/engine.py:
the hand-over of the accumulated fp32 gradients, DeepSpeed's overflow check and fp64 gradient norm,
the clipping, torch's AdamW on the fp32 master partition, the copy back into the bf16 weights) on a
small bf16 model, run under a dispatch mode that adds up the bytes every aten operation reads and
writes. Views, allocations and collectives (the DP reduction and weight gather, charged as
communication) are left out; a pure write (``copy_``, ``zero_``, ``fill_``) does not read its
destination. The rank is rank 0 of a fake world of ``dp`` ranks (memory_audit.fake_world), where
collectives move nothing, so the DP>1 paths run as they do on a cluster. The steady state is the
third step's: the first steps also allocate and initialise the optimizer's state.
"""
from __future__ import annotations

import os
from dataclasses import replace

import torch

from hybridpar.compat.torch import dispatch_mode_base, tensor_leaves
from hybridpar.observe.kernel_count import NO_KERNEL

PURE_WRITES = frozenset({"copy_", "zero_", "fill_"})


class TrafficCounter(dispatch_mode_base()):
    """Bytes read plus written by every aten operation that runs a kernel, by operation name."""

    def __init__(self):
        super().__init__()
        self.by_op: dict[str, int] = {}

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name in NO_KERNEL or func.is_view or func.namespace != "aten":
            return out
        read, written = [], []
        for i, arg in enumerate(func._schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            tensors = tensor_leaves(value)
            writes = arg.alias_info is not None and arg.alias_info.is_write
            if writes:
                written += tensors
            if not (writes and name in PURE_WRITES):
                read += tensors
        seen = {id(t) for t in read + written}
        fresh = [t for t in tensor_leaves(out) if id(t) not in seen]
        moved = sum(t.numel() * t.element_size() for t in read + written + fresh)
        self.by_op[name] = self.by_op.get(name, 0) + moved
        return out


def optimizer_step_traffic(zero_stage: int, dp: int, steps: int = 3) -> tuple[float, dict[str, float]]:
    """(bytes per parameter of this rank's optimizer shard, the same by operation) of one bf16
    ``StageEngine.step()`` in its steady state, as DP rank 0 of ``dp`` at ``zero_stage``."""
    from hybridpar.config.optim import OptimConfig
    from hybridpar.observe.memory_audit import fake_world
    from hybridpar.runtime.mesh import Mesh
    from hybridpar.runtime.model import ModelOptions, build_model
    from hybridpar.topology.layout import RankLayout
    from hybridpar.topology.models import PRESETS
    from hybridpar.zero.engine import StageEngine

    os.environ.setdefault("LOCAL_RANK", "0")  # DeepSpeed asks for a launcher's variable
    spec = replace(PRESETS["llama3-8b"], hidden=256, ffn_hidden=896, heads=4, kv_heads=2, layers=2, vocab=512)
    seq_len = 32
    with fake_world(dp, 0):
        mesh = Mesh.build(RankLayout(tp=1, cp=1, pp=1, dp=dp))
        try:
            chunks = build_model(spec, mesh, ModelOptions(seq_len=seq_len, dtype=torch.bfloat16))
            engine = StageEngine(chunks, mesh, OptimConfig(total_steps=steps), zero_stage=zero_stage,
                                 micro_batch=1, grad_accum=2, bf16=True)
            model = chunks[0]
            model.train()
            tokens = torch.randint(0, spec.vocab, (1, seq_len))
            positions = torch.arange(seq_len).unsqueeze(0)
            for _ in range(steps):
                for _ in range(2):
                    model(tokens, positions, None, labels=tokens).float().sum().backward()
                engine.finish_grad_reduction()
                counter = TrafficCounter()
                with counter:
                    engine.step(1e-4)
                engine.zero_grad()
            params = sum(p.numel() for p in model.parameters())
            shard = params / dp if zero_stage >= 1 else params
            return counter.total / shard, {op: b / shard for op, b in counter.by_op.items()}
        finally:
            mesh.destroy()
