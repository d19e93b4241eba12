"""Core attention through ``torch.nn.functional.scaled_dot_product_attention`` (FlashAttention on GPU).

megatron-core's local layer spec computes attention with ``DotProductAttention``: it materialises
the ``[b, heads, s, s]`` scores, softmaxes them and multiplies by V, so its memory and time grow with
the square of the sequence and run at HBM speed. Its fast kernels come with TransformerEngine,
which is not in hybridpar's pinned stack. torch's SDPA dispatches to FlashAttention-2 (or
cuDNN / memory-efficient attention) on CUDA and to a fused flash kernel on CPU, with causal
masking and grouped-query heads built in, and is differentiable, so it drops into megatron's
``SelfAttention`` as its ``core_attention`` submodule with the same inputs and output.

Same math as ``DotProductAttention`` for what hybridpar builds: causal mask, no dropout, softmax
scale ``1/sqrt(head_dim)``, no attention bias, no sliding window, vanilla softmax; anything else is
refused at construction (tests/test_attention.py checks outputs and gradients against megatron's).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _base():
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    return DotProductAttention


def sdpa_core_attention_class():
    """The class, built lazily so that importing hybridpar does not import megatron."""
    global _SDPA_CLASS
    if _SDPA_CLASS is None:
        _SDPA_CLASS = _make_class(_base())
    return _SDPA_CLASS


_SDPA_CLASS = None


def _make_class(base):
    from megatron.core.transformer.enums import AttnMaskType

    class SDPACoreAttention(base):
        """megatron ``DotProductAttention``'s interface, computed by torch SDPA."""

        def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                     softmax_scale=None, cp_comm_type=None, pg_collection=None):
            super().__init__(config, layer_number, attn_mask_type, attention_type, attention_dropout=attention_dropout,
                             softmax_scale=softmax_scale, cp_comm_type=cp_comm_type, pg_collection=pg_collection)
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
            context = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale,
                                                     enable_gqa=self.gqa_group > 1)
            # [b, heads, s, d] -> [s, b, heads * d]
            s, b = context.shape[2], context.shape[0]
            return context.permute(2, 0, 1, 3).reshape(s, b, self.hidden_size_per_partition)

    return SDPACoreAttention
