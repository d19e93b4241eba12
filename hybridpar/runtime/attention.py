"""Core attention through ``torch.nn.functional.scaled_dot_product_attention`` (FlashAttention on GPU).

megatron-core's local layer spec computes attention with ``DotProductAttention``: it materialises
the ``[b, heads, s, s]`` scores, softmaxes them and multiplies by V, so its memory and time grow with
the square of the sequence and run at HBM speed. Its fast kernels come with TransformerEngine,
which is not in hybridpar's pinned stack. torch's SDPA dispatches to FlashAttention-2 (or
cuDNN / memory-efficient attention) on CUDA and to a fused flash kernel on CPU, with causal
masking and grouped-query heads built in, and is differentiable, so it drops into megatron's
``SelfAttention`` as its ``core_attention`` submodule with the same inputs and output.

Context parallelism (cp > 1), which megatron's DotProductAttention refuses, is implemented here:
K/V all-gathered over the CP group, each rank's two load-balanced chunks attending causally with the
diagonal at the chunk's offset, given as a lower-right CausalBias rather than a mask tensor
(``_context_parallel``); tests/integration/test_runtime.py checks CP layouts against one process,
tests/unit/test_cp_attention.py the chunks' rows against whole-sequence attention.

Same math as ``DotProductAttention`` for what hybridpar builds: causal mask, no dropout, softmax
scale ``1/sqrt(head_dim)``, no attention bias, no sliding window, vanilla softmax; anything else is
refused at construction (tests/integration/test_attention.py checks outputs and gradients against megatron's).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right


def _base():
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    return DotProductAttention


def sdpa_core_attention_class(cp_group=None):
    """The class megatron's layer spec instantiates, bound to this rank's CP group (the mesh's;
    None without context parallelism); built when asked, so importing hybridpar imports no megatron."""
    return _make_class(_base(), cp_group)


def _make_class(base, cp_group):
    from megatron.core.transformer.enums import AttnMaskType

    class SDPACoreAttention(base):
        """megatron ``DotProductAttention``'s interface, computed by torch SDPA."""

        def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                     softmax_scale=None, cp_comm_type=None, pg_collection=None):
            # megatron's DotProductAttention refuses context parallelism (only TE's attention has
            # it); this class implements it, so the base sees cp = 1 while it sets up heads/scale.
            cp_size = config.context_parallel_size
            config.context_parallel_size = 1
            try:
                super().__init__(config, layer_number, attn_mask_type, attention_type,
                                 attention_dropout=attention_dropout, softmax_scale=softmax_scale,
                                 cp_comm_type=cp_comm_type, pg_collection=pg_collection)
            finally:
                config.context_parallel_size = cp_size
            self.cp_size = cp_size
            dropout = config.attention_dropout if attention_dropout is None else attention_dropout
            unsupported = {
                "attention dropout": dropout != 0.0,
                "a non-causal mask": attn_mask_type != AttnMaskType.causal,
                "a sliding window": config.window_size is not None,
                "a non-vanilla softmax": config.softmax_type != "vanilla",
            }
            bad = [name for name, present in unsupported.items() if present]
            if bad:
                raise ValueError(f"hybridpar's SDPA attention does not support {', '.join(bad)}")
            self.gqa_group = self.num_attention_heads_per_partition // self.num_query_groups_per_partition

        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            if attention_mask is not None or attention_bias is not None or packed_seq_params is not None:
                raise ValueError("hybridpar's SDPA attention takes no explicit mask, bias or packed sequences")
            # [s, b, heads, d] -> [b, heads, s, d]
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            if self.cp_size > 1:
                context = self._context_parallel(q, k, v)
            else:
                context = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale,
                                                         enable_gqa=self.gqa_group > 1)
            # [b, heads, s, d] -> [s, b, heads * d]
            s, b = context.shape[2], context.shape[0]
            return context.permute(2, 0, 1, 3).reshape(s, b, self.hidden_size_per_partition)

        def _context_parallel(self, q, k, v):
            """Causal attention of this rank's two sequence chunks against the whole sequence.

            Layout (megatron's, Llama 3's): the sequence is cut into 2 x cp chunks and CP rank r
            holds chunks r and 2cp-1-r, so every rank has the same causal work. K and V are
            all-gathered over the CP group (Llama 3 §3.3.2: all-gather, not a ring; with GQA
            they are small) and put back in sequence order; each local chunk c attends to keys
            0 .. (c+1)L-1 with the causal diagonal at its own offset."""
            import torch.distributed as dist

            group = cp_group  # the mesh's CP group of this rank (sdpa_core_attention_class's argument)
            cp, rank = self.cp_size, dist.get_rank(group)
            chunk = q.shape[2] // 2
            k_all, v_all = (_sequence_order(gather_along_sequence(t, group), cp) for t in (k, v))
            outputs = []
            for local, c in enumerate((rank, 2 * cp - 1 - rank)):
                q_c = q[:, :, local * chunk:(local + 1) * chunk]
                keys = (c + 1) * chunk
                outputs.append(causal_chunk_attention(q_c, k_all[:, :, :keys], v_all[:, :, :keys],
                                                      self.softmax_scale, self.gqa_group > 1))
            return torch.cat(outputs, dim=2)

    return SDPACoreAttention


def causal_chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale, gqa: bool) -> torch.Tensor:
    """Causal attention of queries that are the last ``q.shape[2]`` positions of the keys' sequence: query i
    sees keys 0 .. keys - chunk + i, the diagonal aligned to the lower right. Given as a CausalBias, no mask
    tensor exists: on CUDA SDPA runs FlashAttention (or memory-efficient attention with that mask type);
    elsewhere it is materialised (tests/workers/attention_worker.py reports which kernels a GPU runs)."""
    chunk, keys = q.shape[2], k.shape[2]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(chunk, keys), scale=scale,
                                          enable_gqa=gqa)


def _sequence_order(gathered: torch.Tensor, cp: int) -> torch.Tensor:
    """[b, h, cp x 2L, d] in rank order (rank j: chunks j, 2cp-1-j) -> the 2cp chunks in sequence order."""
    pieces = gathered.chunk(2 * cp, dim=2)  # rank j's chunks are pieces 2j and 2j+1
    order = [pieces[2 * c] if c < cp else pieces[2 * (2 * cp - 1 - c) + 1] for c in range(2 * cp)]
    return torch.cat(order, dim=2)


class _GatherAlongSequence(torch.autograd.Function):
    """All-gather along dim 2 over a group; backward sums the gradients and keeps this rank's slice."""

    @staticmethod
    def forward(ctx, tensor, group):
        import torch.distributed as dist

        ctx.group = group
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, tensor.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad):
        import torch.distributed as dist

        size, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        parts = [p.contiguous() for p in grad.chunk(size, dim=2)]
        out = torch.empty_like(parts[rank])
        dist.reduce_scatter(out, parts, group=ctx.group)  # NCCL, and gloo since torch 2.x
        return out, None


def gather_along_sequence(tensor: torch.Tensor, group) -> torch.Tensor:
    return _GatherAlongSequence.apply(tensor, group)
