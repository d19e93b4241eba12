"""How many operations one transformer layer of hybridpar's model runs per micro-batch, counted on CPU.

The planner charges every kernel a boundary cost and the host an issue cost (topology/kernels.py
kernel_bound, Software.kernels_per_layer). The count: megatron-core's layer as
``hybridpar.runtime.model.build_model`` builds it, run forward and backward under a dispatch mode
that counts every aten operation except views and allocations (which launch no kernel); a model of
3 layers minus one of 2 is one layer. TP > 1 runs as TP rank 0 of a fake world
(memory_audit.fake_world), so the layer's collectives are counted as the calls they are. The count
does not depend on the hidden size or the sequence length, only on the layer's code.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from hybridpar.compat.torch import dispatch_mode_base

# Operations that only describe or allocate memory: no kernel runs for them.
NO_KERNEL = frozenset({
    "view", "_unsafe_view", "t", "transpose", "expand", "as_strided", "detach", "alias", "permute",
    "unsqueeze", "squeeze", "slice", "select", "split", "split_with_sizes", "chunk", "unbind",
    "reshape", "_reshape_alias", "empty", "empty_like", "empty_strided", "lift_fresh", "unflatten",
    "flatten", "narrow", "view_as", "expand_as", "new_empty", "new_empty_strided",
})


class _Counter(dispatch_mode_base()):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in NO_KERNEL:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _model_counts(spec, layers: int, tp: int, seq_len: int) -> tuple[int, int]:
    from hybridpar.observe.memory_audit import fake_world
    from hybridpar.runtime.mesh import Mesh
    from hybridpar.runtime.model import ModelOptions, build_model
    from hybridpar.topology.layout import RankLayout

    small = replace(spec, layers=layers, vocab=64 * tp)
    with fake_world(tp, 0):
        mesh = Mesh.build(RankLayout(tp=tp, cp=1, pp=1, dp=1))
        try:
            model = build_model(small, mesh, ModelOptions(seq_len=seq_len, sequence_parallel=tp > 1),
                                draw_weights=False)[0]
            model.train()
            tokens = torch.randint(0, model.vocab_size, (1, seq_len))
            positions = torch.arange(seq_len).unsqueeze(0)
            forward, backward = _Counter(), _Counter()
            with forward:
                loss = model(tokens, positions, None, labels=tokens).sum()
            with backward:
                loss.backward()
            return forward.count, backward.count
        finally:
            mesh.destroy()


def layer_operations(spec, tp: int = 1, seq_len: int = 128) -> tuple[int, int]:
    """(forward, backward) operations of one layer for one micro-batch, TP rank 0 of ``tp``."""
    f2, b2 = _model_counts(spec, 2, tp, seq_len)
    f3, b3 = _model_counts(spec, 3, tp, seq_len)
    return f3 - f2, b3 - b2
