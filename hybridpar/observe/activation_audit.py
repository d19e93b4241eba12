"""What one transformer layer of hybridpar's model keeps for backward, measured on CPU.

The layer is megatron-core's, built by ``hybridpar.model.build_model`` (local spec, SDPA core
attention, RMSNorm, SwiGLU, RoPE) at a model's real hidden size and head layout, in a two-layer
model with a small vocabulary (neither changes a layer). A forward pass runs under
``torch.autograd.graph.saved_tensors_hooks``; every tensor autograd saves is recorded once per
storage (a view keeps its whole storage alive), parameters excluded. The layer measured is the
second: tensors every layer shares (RoPE's frequency table, computed once per forward) are first
saved by the first layer and so not counted again. TP > 1 and CP > 1 run as rank 0 of a fake world
(memory_audit.fake_world): collectives move nothing, shapes are exact; with CP the layer sees this rank's
seq_len / cp tokens and all-gathers K and V of the whole sequence.

CPU runs in fp32; a bf16 run on a GPU keeps the same tensors at 2 bytes per element, except the
fp32 statistics (RMSNorm's rstd, SDPA's logsumexp: 4 bytes). One tensor is CPU's alone: torch's
CPU rms_norm is a composition (rms_norm_composite, aten layer_norm.cpp) whose ``x * rstd`` is kept
by the multiplication with the weight; CUDA runs ``_fused_rms_norm``, whose backward keeps only
input, weight and rstd (derivatives.yaml). The CP path's causal diagonal (a lower-right CausalBias) is
materialised as a mask on CPU and kept for backward; on CUDA SDPA's FlashAttention and memory-efficient
kernels take it as a mask type, nothing kept. Such tensors are reported apart and left out of ``gpu_bytes``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

FP32_ON_GPU = ("_saved_logsumexp", "RsqrtBackward0._saved_result")  # stay fp32 in bf16 runs
CPU_ONLY_SAVED = ("_saved_attn_mask",)  # the CP path's CausalBias, materialised only off CUDA


@dataclass(frozen=True)
class SavedTensor:
    shape: tuple
    numel: int  # elements of its whole storage
    cpu_bytes: int
    saved_by: tuple  # autograd nodes and attributes that keep it ("" for custom Functions)
    cpu_only: bool  # kept only on CPU (its composite rms_norm, the CP path's materialised mask)
    gpu_element_bytes: int  # in a bf16 run: 2, or 4 for the fp32 statistics; integers keep theirs

    @property
    def gpu_bytes(self) -> int:
        return 0 if self.cpu_only else self.numel * self.gpu_element_bytes


@dataclass(frozen=True)
class LayerActivations:
    seq_len: int  # the layer's tokens (with CP, this rank's seq_len / cp)
    micro_batch: int
    tp: int
    recompute: str
    tensors: tuple
    cp: int = 1

    @property
    def gpu_bytes(self) -> int:
        return sum(t.gpu_bytes for t in self.tensors)

    @property
    def cpu_only_bytes(self) -> int:
        return sum(t.cpu_bytes for t in self.tensors if t.cpu_only)


def _saved_by(root, norm_weights: set) -> tuple[dict, set]:
    """{storage pointer: names of the autograd nodes' saved attributes that hold it}, and the
    storages kept only as ``x * rstd`` of CPU's composite rms_norm (a Mul whose other operand is a
    norm weight)."""
    names, cpu_only, seen, stack = {}, set(), set(), [root]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        saved = {}
        for attr in dir(node):
            if attr.startswith("_saved_"):
                try:
                    value = getattr(node, attr)
                except RuntimeError:  # freed or not a tensor
                    continue
                if isinstance(value, torch.Tensor):
                    saved[attr] = value.untyped_storage().data_ptr()
        kind = type(node).__name__
        for attr, ptr in saved.items():
            names.setdefault(ptr, []).append(f"{kind}.{attr}")
        if kind == "MulBackward0" and saved.get("_saved_other") in norm_weights and "_saved_self" in saved:
            cpu_only.add(saved["_saved_self"])
        stack += [n for n, _ in node.next_functions]
    return names, cpu_only


def measure(spec, tp: int, seq_len: int, recompute: str, micro_batch: int = 1, cp: int = 1) -> LayerActivations:
    """One layer's saved tensors for one micro-batch of ``seq_len`` tokens (fp32 on CPU, rank 0 of TP x CP)."""
    from hybridpar.topology.layout import RankLayout

    from hybridpar.observe.memory_audit import fake_world
    from hybridpar.runtime.mesh import Mesh
    from hybridpar.runtime.model import ModelOptions, build_model

    small = replace(spec, layers=2, vocab=64 * tp)
    layout = RankLayout(tp=tp, cp=cp, pp=1, dp=1)
    with fake_world(tp * cp, 0):
        mesh = Mesh.build(layout)
        try:
            opts = ModelOptions(seq_len=seq_len, sequence_parallel=tp > 1, recompute=recompute)
            model = build_model(small, mesh, opts, draw_weights=False)[0]
            # What autograd saves depends on shapes, not values: a constant fill (a memory write) gives
            # finite activations at a fifth of normal_'s cost on billions of weights.
            with torch.no_grad():
                for p in model.parameters():
                    p.fill_(0.02)
            model.train()
            return _record(model, tp, cp, seq_len // cp, recompute, micro_batch)
        finally:
            mesh.destroy()


class SavedStorages:
    """A ``saved_tensors_hooks`` pack hook that records, in order, the first tensor autograd saves of each
    storage (a view keeps its whole storage alive) while ``recording`` is set; every saved tensor stays referenced,
    so no storage's address is reused during the pass."""

    def __init__(self, recording: bool = True):
        self.recording = recording
        self.first = []
        self._seen = set()
        self._alive = []

    def pack(self, t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self._seen:
            self._seen.add(ptr)
            if self.recording:
                self.first.append(t)
        self._alive.append(t)
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    @property
    def by_storage(self) -> dict:
        """data_ptr -> (bytes of the storage, dtype of its first saved tensor), for each storage recorded."""
        return {t.untyped_storage().data_ptr(): (t.untyped_storage().nbytes(), t.dtype) for t in self.first}


def _record(model, tp, cp, seq_len, recompute, micro_batch) -> LayerActivations:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    log = SavedStorages(recording=False)
    # The second layer's forward up to the final norm (with full recomputation the layer's
    # checkpoint saves its inputs after the layer has run, still before the final norm).
    hooks = [model.decoder.layers[1].register_forward_pre_hook(lambda *a: setattr(log, "recording", True)),
             model.decoder.final_layernorm.register_forward_pre_hook(lambda *a: setattr(log, "recording", False))]
    device = next(model.parameters()).device
    tokens = torch.randint(0, model.vocab_size, (micro_batch, seq_len), device=device)
    positions = torch.arange(seq_len, device=device).unsqueeze(0).expand(micro_batch, -1)
    try:
        with log.hooks():
            loss = model(tokens, positions, None, labels=tokens)
    finally:
        for h in hooks:
            h.remove()
    window = [t for t in log.first if t.untyped_storage().data_ptr() not in params]
    norm_weights = {p.untyped_storage().data_ptr() for n, p in model.named_parameters() if "layernorm" in n}
    names, cpu_only = _saved_by(loss.grad_fn, norm_weights)
    tensors = []
    for t in window:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        by = tuple(names.get(ptr, ("",)))
        numel = storage.nbytes() // t.element_size()
        size = t.element_size()
        if t.is_floating_point():
            size = 4 if any(tag in name for name in by for tag in FP32_ON_GPU) else 2
        kept_on_cpu_only = ptr in cpu_only or any(name.endswith(CPU_ONLY_SAVED) for name in by)
        tensors.append(SavedTensor(tuple(t.shape), numel, storage.nbytes(), by, kept_on_cpu_only, size))
    return LayerActivations(seq_len, micro_batch, tp, recompute, tuple(tensors), cp)
