"""Small Hugging Face Llama models for the HF in/out tests (real transformers, real files)."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from hybridpar.topology.models import PRESETS

TINY = PRESETS["tiny"]  # 4 layers, hidden 64, ffn 176, 4 heads / 2 KV heads (GQA), vocab 320


def random_llama(seed: int = 0, tied: bool = False, spec=TINY):
    """A ``LlamaForCausalLM`` of ``spec``'s shape with weights far from initialisation: random
    norm weights and unit-scale matrices, so sharp logits tell every misplaced row apart."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.ffn_hidden,
                         num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                         num_key_value_heads=spec.kv_heads, rms_norm_eps=1e-5, tie_word_embeddings=tied,
                         max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta})
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 / p.shape[1] ** 0.5))
    return model


def hf_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens).logits.float()


def canonical_from_hf(hf_dir: str, tied: bool, tp: int = 1, tp_rank: int = 0, spec=TINY) -> dict:
    """The canonical tensors (or TP shards) that hf_import reads from an HF directory."""
    from hybridpar.checkpoint.hf_import import HFReader, shard_rows, read_shard
    from hybridpar.checkpoint.hf_layout import canonical_layout, check_hf_dir

    reader = HFReader(check_hf_dir(hf_dir, spec, tied))
    out = {}
    for c in canonical_layout(spec, tied):
        p = param_like(c)
        out[c.cname] = read_shard(reader, c, shard_rows(p, c, tp, tp_rank))
    return out


def param_like(c):
    """What model.py's TP rules read from a megatron parameter: every matrix is TP-split along the
    layout's axis, norms are replicated, fc1 is [gate; up]."""
    return SimpleNamespace(tensor_model_parallel=len(c.shape) == 2, partition_dim=c.axis,
                           _hybridpar_gated=c.cname.endswith("linear_fc1.weight"))
