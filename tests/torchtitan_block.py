"""torchtitan's Llama block as it ran in April 2024 (pytorch/torchtitan 1ea476e9f: torchtitan/models/llama/model.py
``Attention``, ``apply_rotary_emb``, ``repeat_kv``, ``FeedForward``, ``TransformerBlock``; torchtitan/models/norms.py
``RMSNorm`` and ``TritonFusedRMSNorm``), rebuilt op for op on CPU for tests/unit/test_planner_torchtitan_activations.py,
with stand-ins that save what the GPU kernels save (the Triton RMSNorm; FlashAttention-2). ``tap`` (a dict or None)
names the tensors the test expects to be kept."""
import math

import torch
import torch.nn.functional as F
from torch import nn

CPU = torch.device("cpu")


def _tap(tap, name, t):
    if tap is not None:
        tap[name] = t


class _Norm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=CPU))
        self.tap, self.prefix = None, ""


class UnfusedRMSNorm(_Norm):
    """norms.py RMSNorm: normalise in fp32, cast back to x's dtype, then scale by weight."""

    def forward(self, x):
        wide = x.float()
        inv_rms = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        normed = (wide * inv_rms).type_as(x)
        out = normed * self.weight
        for name, t in (("x_fp32", wide), ("rstd", inv_rms), ("normed_bf16", normed), ("out", out)):
            _tap(self.tap, f"{self.prefix}.{name}", t)
        return out


class _TritonRMSNormStandIn(torch.autograd.Function):
    """norms.py TritonFusedRMSNorm on the CPU: keeps (x as [M, N], weight, rstd fp32 [M]), same math."""

    @staticmethod
    def forward(ctx, x, weight, eps, tap, prefix):
        rows = x.view(-1, x.shape[-1])
        wide = rows.float()
        rstd = torch.rsqrt(wide.pow(2).mean(-1) + eps)
        y = (wide * rstd[:, None] * weight.float()).to(x.dtype)
        ctx.save_for_backward(rows, weight, rstd)
        ctx.in_shape = x.shape
        _tap(tap, f"{prefix}.rstd", rstd)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        rows, weight, rstd = ctx.saved_tensors
        dy = dy.reshape(rows.shape).float()
        x_hat = rows.float() * rstd[:, None]
        wdy = weight.float() * dy
        c1 = (x_hat * wdy).sum(-1, keepdim=True) / rows.shape[-1]
        dx = (wdy - x_hat * c1) * rstd[:, None]
        dw = (dy * x_hat).sum(0)
        return dx.to(rows.dtype).view(ctx.in_shape), dw.to(weight.dtype), None, None, None


class FusedRMSNorm(_Norm):
    def forward(self, x):
        _tap(self.tap, f"{self.prefix}.x", x)
        out = _TritonRMSNormStandIn.apply(x, self.weight, self.eps, self.tap, self.prefix)
        _tap(self.tap, f"{self.prefix}.out", out)
        return out


class _FlashAttention2StandIn(torch.autograd.Function):
    """CUDA _scaled_dot_product_flash_attention (FA2), causal: keeps q, k, v, out and lse fp32 [b, heads, s].

    The output is laid out [b, s, heads, d] and returned as its [b, heads, s, d] transpose, as the CUDA
    kernel returns it. Backward recomputes SDPA with autograd."""

    @staticmethod
    def forward(ctx, q, k, v, tap):
        b, heads, s, d = q.shape
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = torch.empty(b, s, heads, d, dtype=q.dtype, device=q.device).transpose(1, 2)
        out.copy_(ref)
        scores = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(d)
        causal = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        lse = scores.masked_fill(causal, float("-inf")).logsumexp(-1).contiguous()  # fp32 [b, heads, s]
        ctx.save_for_backward(q, k, v, out, lse)
        _tap(tap, "attention.sdpa_out", out)
        _tap(tap, "attention.logsumexp", lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, _out, _lse = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            again = F.scaled_dot_product_attention(*leaves, is_causal=True)
            grads = torch.autograd.grad(again, leaves, dout)
        return (*grads, None)


def precompute_freqs_cis(head_dim, end, theta=10000.0):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=CPU)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(end, device=CPU).float(), inv)
    return torch.polar(torch.ones_like(angles), angles)  # complex64 [end, head_dim / 2]


def apply_rotary_emb(xq, xk, freqs_cis):
    """model.py apply_rotary_emb: rotate pairs as complex64 numbers, return in the inputs' dtype."""

    def as_complex(t):
        return torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))

    cq, ck = as_complex(xq), as_complex(xk)
    rot = freqs_cis.view(1, cq.shape[1], 1, cq.shape[-1])
    rq = torch.view_as_real(cq * rot).flatten(3)
    rk = torch.view_as_real(ck * rot).flatten(3)
    return rq.type_as(xq), rk.type_as(xk)


def repeat_kv(t, n_rep):
    """model.py repeat_kv: expand then reshape (a copy) to n_kv_heads * n_rep heads."""
    if n_rep == 1:
        return t
    b, s, groups, d = t.shape
    return t[:, :, :, None, :].expand(b, s, groups, n_rep, d).reshape(b, s, groups * n_rep, d)


class Attention(nn.Module):
    def __init__(self, dim, heads, kv_heads, sdpa):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False, device=CPU)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False, device=CPU)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False, device=CPU)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False, device=CPU)
        self.sdpa = sdpa  # "flash2": the CUDA kernel's saved set; "cpu": whatever F.sdpa keeps on the CPU
        self.tap = None
        self.sdpa_output = self.wo_input = None

    def forward(self, x, freqs_cis):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.head_dim)
        k = self.wk(x).view(b, s, self.kv_heads, self.head_dim)
        v = self.wv(x).view(b, s, self.kv_heads, self.head_dim)
        q, k = apply_rotary_emb(q, k, freqs_cis)
        n_rep = self.heads // self.kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        for name, t in (("q", q), ("k", k), ("v", v)):
            _tap(self.tap, f"attention.{name}", t)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.sdpa == "flash2":
            out = _FlashAttention2StandIn.apply(q, k, v, self.tap)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        merged = out.transpose(1, 2).contiguous().view(b, s, -1)
        if self.tap is not None:
            self.sdpa_output, self.wo_input = out, merged
        return self.wo(merged)


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False, device=CPU)
        self.w2 = nn.Linear(hidden, dim, bias=False, device=CPU)
        self.w3 = nn.Linear(dim, hidden, bias=False, device=CPU)
        self.tap = None

    def forward(self, x):
        up = self.w1(x)
        act = F.silu(up)
        lin = self.w3(x)
        gated = act * lin
        for name, t in (("w1_out", up), ("silu_out", act), ("w3_out", lin), ("gated", gated)):
            _tap(self.tap, f"feed_forward.{name}", t)
        return self.w2(gated)


class TransformerBlock(nn.Module):
    def __init__(self, dim, heads, kv_heads, ffn, fused_norm, sdpa="flash2"):
        super().__init__()
        norm = FusedRMSNorm if fused_norm else UnfusedRMSNorm
        self.attention_norm, self.ffn_norm = norm(dim), norm(dim)
        self.attention_norm.prefix, self.ffn_norm.prefix = "attention_norm", "ffn_norm"
        self.attention = Attention(dim, heads, kv_heads, sdpa)
        self.feed_forward = FeedForward(dim, ffn)

    def set_tap(self, tap):
        for m in (self.attention_norm, self.ffn_norm, self.attention, self.feed_forward):
            m.tap = tap

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))
