"""Small Hugging Face Llama models for the HF in/out tests (real transformers, real files)."""
from __future__ import annotations

import torch

from topology.models import PRESETS

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
