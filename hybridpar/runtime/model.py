"""The Llama-style decoder, built from megatron-core parts, and its layout-free view.

``build_model(spec, mesh, ...)`` returns this rank's model chunks (one per virtual pipeline
stage): megatron-core ``GPTModel`` with the local (non-TransformerEngine) layer spec, so TP uses
megatron's column/row-parallel linears, vocab-parallel embedding and vocab-parallel
cross-entropy; its core attention is torch SDPA (``attention.py``: FlashAttention on GPU) unless
``ModelOptions.attention = "megatron"``. Llama choices: RMSNorm, SwiGLU, RoPE, grouped-query attention, no biases, no
dropout, untied input/output embeddings by default.

Every parameter has a *canonical name* (its name in the one-process model, with global layer
numbers) and a rule that maps the full tensor to this rank's TP shard (``shard_of_full``) and
back (``full_from_shards``). Initialisation uses them: each rank draws only its shard's elements
of the full tensor, on its device, from a counter-based generator keyed by (seed, canonical name)
(``canonical_init``), so every layout starts from exactly the weights of the one-process model.
megatron allocates the parameters on the rank's device and its own init methods are no-ops.
Tests use the inverse to gather final weights.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hybridpar.topology.models import ModelSpec

from hybridpar.runtime.canonical_init import fill_normal_

INIT_STD = 0.02


@dataclass(frozen=True)
class ModelOptions:
    seq_len: int
    sequence_parallel: bool = False
    tied_embeddings: bool | None = None  # None: take the ModelSpec's setting
    dtype: torch.dtype = torch.float32
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    attention: str = "sdpa"  # sdpa: torch's fused kernels (attention.py) | megatron: materialised scores
    lighter_end_stages: bool = False  # Llama 3's split: embedding and loss count as a layer each
    recompute: str = "none"  # none | selective (core attention) | full (every layer): topology.plan.Plan.recompute


def transformer_config(spec: ModelSpec, mesh, opts: ModelOptions):
    from megatron.core.transformer.transformer_config import TransformerConfig
    import torch.nn.functional as F

    on_gpu = torch.cuda.is_available()
    kwargs = dict(
        num_layers=spec.layers,
        hidden_size=spec.hidden,
        ffn_hidden_size=spec.ffn_hidden,
        num_attention_heads=spec.heads,
        num_query_groups=spec.kv_heads,
        kv_channels=spec.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=opts.norm_eps,
        gated_linear_unit=spec.mlp == "swiglu",
        activation_func=F.silu if spec.mlp == "swiglu" else F.gelu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=INIT_STD,
        # megatron allocates each weight on the device and sets its TP attributes; the values come
        # from init_weights (canonical, layout-free), so its own draws would be wasted work.
        perform_initialization=True,
        init_method=_left_to_canonical_init,
        output_layer_init_method=_left_to_canonical_init,
        embedding_init_method=_left_to_canonical_init,
        tensor_model_parallel_size=mesh.layout.tp,
        pipeline_model_parallel_size=mesh.layout.pp,
        virtual_pipeline_model_parallel_size=mesh.vpp if mesh.vpp > 1 else None,
        context_parallel_size=mesh.layout.cp,
        sequence_parallel=opts.sequence_parallel and mesh.layout.tp > 1,
        params_dtype=opts.dtype,
        pipeline_dtype=opts.dtype,
        bf16=opts.dtype == torch.bfloat16,
        use_cpu_initialization=False,  # allocate on torch.cuda.current_device() (cpu.py: the CPU there)
        gradient_accumulation_fusion=False,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        batch_p2p_sync=on_gpu,
        # Interleaving on 2 stages sends both directions between the same two ranks at once;
        # batched p2p would match them by posting order and swap activations with gradients.
        # megatron's unbatched path puts one direction on another communicator instead.
        batch_p2p_comm=not (mesh.layout.pp == 2 and mesh.vpp > 1),
        deallocate_pipeline_outputs=False,
        account_for_embedding_in_pipeline_split=opts.lighter_end_stages,
        account_for_loss_in_pipeline_split=opts.lighter_end_stages,
    )
    # Activation recomputation (the planner's Plan.recompute). selective: megatron's default
    # recompute_modules, ["core_attn"]: core attention (with SDPA, the attention kernel alone) is
    # rerun in backward from its kept q/k/v. full: every transformer layer is one checkpoint unit
    # (uniform, 1 layer): only each layer's input is kept and the whole layer is rerun in backward.
    if opts.recompute == "selective":
        kwargs.update(recompute_granularity="selective")
    elif opts.recompute == "full":
        kwargs.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif opts.recompute != "none":
        raise ValueError(f"unknown recompute {opts.recompute!r}: none, selective or full")
    return TransformerConfig(**kwargs)


def _left_to_canonical_init(weight) -> None:
    """megatron's init hook: nothing to draw here, ``init_weights`` sets every value."""


def build_model(spec: ModelSpec, mesh, opts: ModelOptions, seed: int = 0, draw_weights: bool = True) -> list:
    """This rank's model chunks (one per virtual stage), initialised by canonical name.
    ``draw_weights=False`` leaves the values as allocated (the memory audit builds on ``meta``,
    where there are none)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from hybridpar.compat import cpu
    from hybridpar.compat import megatron as megatron_compat

    cpu.apply()
    cpu.seed_model_parallel_rng(seed, mesh.tp_rank)
    config = transformer_config(spec, mesh, opts)
    layer_spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    if opts.attention == "sdpa":
        from hybridpar.runtime.attention import sdpa_core_attention_class

        layer_spec.submodules.self_attention.submodules.core_attention = sdpa_core_attention_class(
            mesh.group("cp") if mesh.layout.cp > 1 else None)
    elif opts.attention != "megatron":
        raise ValueError(f"unknown attention {opts.attention!r}: sdpa or megatron")
    torch_norm = megatron_compat.uses_torch_fallback_norm(layer_spec)
    if torch_norm:  # no apex/TE: megatron's torch fallback norm refuses sequence parallelism
        layer_spec.submodules.input_layernorm = RMSNorm
        layer_spec.submodules.pre_mlp_layernorm = RMSNorm
    tied = spec.tied_embeddings if opts.tied_embeddings is None else opts.tied_embeddings
    chunks = []
    for vp in range(mesh.vpp):
        vp_stage = vp if mesh.vpp > 1 else None
        kwargs = dict(
            config=config,
            transformer_layer_spec=_block_spec(layer_spec, config, vp_stage) if torch_norm else layer_spec,
            vocab_size=spec.vocab,
            max_sequence_length=opts.seq_len,
            pre_process=mesh.is_first_stage and vp == 0,  # the first virtual stage of the first rank
            post_process=mesh.is_last_stage and vp == mesh.vpp - 1,
            share_embeddings_and_output_weights=tied,
            position_embedding_type="rope",
            rotary_base=int(opts.rope_base),
        )
        if vp_stage is not None:
            kwargs["vp_stage"] = vp_stage
        chunks.append(GPTModel(**kwargs))
    _mark_gated(chunks, spec)
    if draw_weights:
        init_weights(chunks, spec, mesh, seed)
    for chunk in chunks:
        for p in chunk.parameters():
            # DeepSpeed counts a parameter once in the gradient norm unless marked replicated:
            # the last stage's copy of a tied embedding is such a copy.
            if getattr(p, "shared_embedding", False) and not mesh.is_first_stage:
                p.ds_pipe_replicated = True
    return chunks


class RMSNorm(torch.nn.Module):
    """RMSNorm for megatron's layer spec when neither apex nor TransformerEngine is present.

    Same math as megatron's torch fallback (``torch.nn.RMSNorm``), but it also supports
    sequence parallelism: its weight is marked ``sequence_parallel`` so that its gradient,
    computed on a sequence shard, is summed over the TP group (pipeline.py)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.hidden_size, self.eps = hidden_size, eps
        device = torch.cuda.current_device()  # as megatron's own layers (cpu.py: the CPU on CPU ranks)
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype, device=device))
        setattr(self.weight, "sequence_parallel", bool(config.sequence_parallel))

    def forward(self, x):
        return torch.nn.functional.rms_norm(x, (self.hidden_size,), self.weight, self.eps)


def _block_spec(layer_spec, config, vp_stage):
    """The decoder block with this stage's layers and RMSNorm as its final norm."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    try:
        n = get_num_layers_to_build(config, vp_stage=vp_stage)
    except TypeError:  # older megatron-core: no vp_stage argument
        n = get_num_layers_to_build(config)
    return TransformerBlockSubmodules(layer_specs=[layer_spec] * n, layer_norm=RMSNorm)


# --- canonical names and TP shards ---------------------------------------------------------
def canonical_params(chunks, tied: bool | None = None):
    """Yield (canonical name, parameter) for this rank's parameters."""
    for chunk in chunks:
        layer_number = {}
        if hasattr(chunk, "decoder"):
            for i, layer in enumerate(chunk.decoder.layers):
                layer_number[i] = layer.layer_number - 1  # megatron numbers layers from 1
        for name, p in chunk.named_parameters():
            parts = name.split(".")
            if parts[:2] == ["decoder", "layers"]:
                parts[2] = str(layer_number[int(parts[2])])
            cname = ".".join(parts)
            if cname == "output_layer.weight" and chunk.share_embeddings_and_output_weights:
                cname = "embedding.word_embeddings.weight"  # the last stage's copy of the tied weight
            yield cname, p


def shard_positions(p, full_len: int, tp_rank: int, tp: int, device=None) -> torch.Tensor:
    """Positions, along ``p.partition_dim`` of the full tensor, of TP rank ``tp_rank``'s shard:
    its contiguous 1/tp slice, or for SwiGLU's fc1 ([gate; up] stacked) its slice of each half."""
    whole = torch.arange(full_len, dtype=torch.int64, device=device)
    if getattr(p, "_hybridpar_gated", False):
        gate, up = whole.chunk(2)
        return torch.cat([gate.chunk(tp)[tp_rank], up.chunk(tp)[tp_rank]])
    return whole.chunk(tp)[tp_rank]


def _tp_split(p, tp: int) -> bool:
    return tp > 1 and getattr(p, "tensor_model_parallel", False)


def shard_of_full(cname: str, p, full: torch.Tensor, tp_rank: int, tp: int) -> torch.Tensor:
    if not _tp_split(p, tp):
        return full
    dim = p.partition_dim
    return full.index_select(dim, shard_positions(p, full.shape[dim], tp_rank, tp, device=full.device))


def full_from_shards(cname: str, p, shards: list[torch.Tensor]) -> torch.Tensor:
    tp = len(shards)
    if not _tp_split(p, tp):
        return shards[0]
    if getattr(p, "_hybridpar_gated", False):  # SwiGLU fc1: each shard is [gate part; up part]
        gates, ups = zip(*(s.chunk(2, dim=0) for s in shards))
        return torch.cat(list(gates) + list(ups), dim=0)
    return torch.cat(shards, dim=p.partition_dim)


def _full_shape(cname: str, p, tp: int) -> list[int]:
    shape = list(p.shape)
    if _tp_split(p, tp):
        shape[p.partition_dim] *= tp
    return shape


def init_std(cname: str, spec: ModelSpec) -> float:
    if cname.endswith("linear_proj.weight") or cname.endswith("linear_fc2.weight"):
        return INIT_STD / math.sqrt(2.0 * spec.layers)  # megatron's scaled init for output projections
    return INIT_STD


def _mark_gated(chunks, spec: ModelSpec) -> None:
    """SwiGLU's fc1 holds [gate; up] stacked: its TP shard is a slice of each half."""
    for chunk in chunks:
        if spec.mlp == "swiglu" and hasattr(chunk, "decoder"):
            for layer in chunk.decoder.layers:
                layer.mlp.linear_fc1.weight._hybridpar_gated = True


@torch.no_grad()
def init_weights(chunks, spec: ModelSpec, mesh, seed: int) -> None:
    """Each parameter's shard of its canonical full tensor, drawn on the parameter's device:
    vectors (norm weights) are ones, matrices N(0, std) from ``canonical_init`` keyed by
    (seed, canonical name), so the shard's cost is its own size and every layout matches the
    one-process model exactly."""
    tp, tp_rank = mesh.layout.tp, mesh.tp_rank
    _mark_gated(chunks, spec)
    for cname, p in canonical_params(chunks):
        if p.dim() == 1:
            p.fill_(1.0)
            continue
        full_shape = _full_shape(cname, p, tp)
        along = {}
        if _tp_split(p, tp):
            dim = p.partition_dim
            along[dim] = shard_positions(p, full_shape[dim], tp_rank, tp, device=p.device)
        fill_normal_(p, full_shape, along, seed, cname, init_std(cname, spec))


def num_params(chunks) -> int:
    return sum(p.numel() for c in chunks for p in c.parameters())
