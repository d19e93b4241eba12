"""A plain-PyTorch Llama forward pass over the canonical (one-process) weights.

``Job.full_state_dict()`` returns every parameter under its canonical name (hybridpar/runtime/model.py);
``LlamaReference(spec, weights)`` computes the logits those weights define with nothing but
torch ops, independently of megatron-core, so that

- rank 0 can sample text from a model trained under any TP x PP x DP layout (generate.py), and
- a test can check megatron's model against a second implementation of the same math
  (tests/integration/test_generate.py: equal logits).

The math is megatron-core's with hybridpar's options (model.py): token embedding, then per layer
``x += proj(attn(rmsnorm(x)))`` and ``x += fc2(mlp(rmsnorm(x)))``, a final RMSNorm and the output
layer. Attention: fused QKV weight laid out per query group as ``[q of the group's heads, k, v]``
(megatron's ``[ng, (np/ng + 2) * hn]``), RoPE on q and k (non-interleaved halves, base
``rope_base``), causal softmax scaled by 1/sqrt(head_dim), query head i reading KV group
``i // (heads / kv_heads)``. MLP: SwiGLU with fc1 = ``[gate; up]`` (silu on the gate), or GELU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hybridpar.topology.models import ModelSpec


@dataclass(frozen=True)
class RefOptions:
    rope_base: float = 10000.0  # hybridpar.model.ModelOptions defaults
    norm_eps: float = 1e-5


class LlamaReference:
    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], opts: RefOptions = RefOptions(),
                 tied: bool | None = None):
        self.spec, self.opts = spec, opts
        self.w = {k: v.detach().float() for k, v in weights.items()}
        tied = spec.tied_embeddings if tied is None else tied
        self.out_name = "embedding.word_embeddings.weight" if tied else "output_layer.weight"
        missing = [k for k in self._names() if k not in self.w]
        if missing:
            raise KeyError(f"weights lack {len(missing)} parameter(s), e.g. {missing[0]}")

    @property
    def device(self) -> torch.device:
        return self.w["embedding.word_embeddings.weight"].device

    def _names(self) -> list[str]:
        names = ["embedding.word_embeddings.weight", "decoder.final_layernorm.weight", self.out_name]
        for i in range(self.spec.layers):
            p = f"decoder.layers.{i}."
            names += [p + "input_layernorm.weight", p + "self_attention.linear_qkv.weight",
                      p + "self_attention.linear_proj.weight", p + "pre_mlp_layernorm.weight",
                      p + "mlp.linear_fc1.weight", p + "mlp.linear_fc2.weight"]
        return names

    # --- pieces ---------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.w[name], self.opts.norm_eps)

    def _rope(self, seq: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        dim = self.spec.head_dim
        inv_freq = 1.0 / (self.opts.rope_base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
        freqs = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # [seq, dim]
        return emb.cos(), emb.sin()

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    def _attention(self, x: torch.Tensor, i: int, cos, sin) -> torch.Tensor:
        m, p = self.spec, f"decoder.layers.{i}.self_attention."
        b, s, _ = x.shape
        hn, ng, per = m.head_dim, m.kv_heads, m.heads // m.kv_heads
        qkv = (x @ self.w[p + "linear_qkv.weight"].T).view(b, s, ng, (per + 2) * hn)
        q, k, v = qkv.split([per * hn, hn, hn], dim=-1)
        q = q.reshape(b, s, m.heads, hn).transpose(1, 2)  # [b, heads, s, hn], head = group * per + j
        k = k.transpose(1, 2).repeat_interleave(per, dim=1)  # each group's K/V for its `per` heads
        v = v.transpose(1, 2).repeat_interleave(per, dim=1)
        q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hn)
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        probs = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        out = (probs @ v).transpose(1, 2).reshape(b, s, m.heads * hn)
        return out @ self.w[p + "linear_proj.weight"].T

    def _mlp(self, x: torch.Tensor, i: int) -> torch.Tensor:
        p = f"decoder.layers.{i}.mlp."
        h = x @ self.w[p + "linear_fc1.weight"].T
        if self.spec.mlp == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h)
        return h @ self.w[p + "linear_fc2.weight"].T

    # --- the model ------------------------------------------------------------------------
    @torch.no_grad()
    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [b, s] (int64) -> logits [b, s, vocab] (fp32)."""
        x = F.embedding(tokens, self.w["embedding.word_embeddings.weight"])
        cos, sin = self._rope(tokens.shape[1], tokens.device)
        for i in range(self.spec.layers):
            p = f"decoder.layers.{i}."
            x = x + self._attention(self._norm(x, p + "input_layernorm.weight"), i, cos, sin)
            x = x + self._mlp(self._norm(x, p + "pre_mlp_layernorm.weight"), i)
        x = self._norm(x, "decoder.final_layernorm.weight")
        return x @ self.w[self.out_name].T
