"""The bytes torchtitan's eager-mode ops move (pytorch/torchtitan at commit 1ea476e9f, April 2024), forward and
backward, replayed op by op on CPU and counted with hybridpar's TrafficCounter (bytes read plus written by every
aten operation that runs a kernel; views move nothing; a pure write, ``copy_``/``zero_``/``fill_``, does not read
its destination). Training tensors are bf16 (FSDP2 MixedPrecisionPolicy param_dtype bf16), fp32 where the code
casts. Each figure is bytes per element of the stated tensor; every test checks two sizes and gives the exact
size-dependent remainder (per-row statistics, broadcast tables, labels, scalars) as a formula.

What the counter counts and a GPU would not (see each docstring): a read of an ``expand``ed operand is counted at
the expanded size; ``nll_loss_forward`` and ``nll_loss_backward`` are charged a full read of their log-prob
argument, which their kernels only gather from or take the shape of.
"""
from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn.functional as F

from hybridpar.compat.torch import dispatch_mode_base, tensor_leaves
from hybridpar.observe.step_bytes import TrafficCounter

BF16 = torch.bfloat16

from hybridpar.topology.kernels import (COMPLEX_ROPE_BYTES, EAGER_RMSNORM_BYTES, REPEAT_KV_BYTES,
                                        REPEAT_KV_SOURCE_BWD_BYTES, SEPARATE_SWIGLU_BYTES)
from hybridpar.topology.software import CROSS_ENTROPY_KERNELS, TORCH_FOREACH_STEP_BYTES

TORCH_CE = CROSS_ENTROPY_KERNELS["torch-fp32"]
# What the counter adds to the planner's figures: each nll_loss charged a full read of the log-probabilities (4 B
# per logit each way) and the test's own bf16 logits leaf held through the loss (2 B).
NLL_FULL_READ, LEAF_LOGITS = 4, 2
ADAMW_FOREACH_BYTES = 84  # of TORCH_FOREACH_STEP_BYTES; the clipping the rest

# Bytes per element, size-independent part (the tests add the exact small terms): the planner's constants.
EXPECTED = {
    "rmsnorm": {"fwd": EAGER_RMSNORM_BYTES[0], "bwd": EAGER_RMSNORM_BYTES[1]},  # per element of x
    "rope": {"fwd": COMPLEX_ROPE_BYTES[0], "bwd": COMPLEX_ROPE_BYTES[1]},  # per element of Q plus K
    # per output element; bwd = 2 + 2 / n_rep
    "repeat_kv": {"fwd": REPEAT_KV_BYTES[0], "bwd": REPEAT_KV_BYTES[1], "bwd_per_source": REPEAT_KV_SOURCE_BWD_BYTES},
    "swiglu": {"fwd": SEPARATE_SWIGLU_BYTES[0], "bwd": SEPARATE_SWIGLU_BYTES[1]},  # per element of the operands
    "cross_entropy": {"fwd": TORCH_CE.forward_bytes + NLL_FULL_READ, "bwd": TORCH_CE.backward_bytes + NLL_FULL_READ,
                      "peak": TORCH_CE.peak_bytes - 4 + LEAF_LOGITS,
                      "peak_pred_held": TORCH_CE.peak_bytes + LEAF_LOGITS},  # per logit
    "adamw_step": ADAMW_FOREACH_BYTES,  # per fp32 parameter
    "clip": TORCH_FOREACH_STEP_BYTES - ADAMW_FOREACH_BYTES,
}


def _count(fn):
    """(TrafficCounter, fn's result) with fn run under the counter."""
    with TrafficCounter() as counter:
        result = fn()
    return counter, result


class _LiveBytes(dispatch_mode_base()):
    """Peak bytes of tensor storage alive at once: the storages of ``held`` plus every storage an operation
    returns, each dropped when torch frees it (storages keep one Python object for life, so a weakref tracks them,
    including tensors autograd saves)."""

    def __init__(self, *held):
        super().__init__()
        self.live: dict[int, int] = {}
        self.peak = 0
        for t in held:
            self._track(t)

    def _track(self, t):
        storage = t.untyped_storage()
        key = id(storage)
        if key not in self.live:
            self.live[key] = storage.nbytes()
            weakref.finalize(storage, self.live.pop, key, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tensor_leaves(out):
            self._track(t)
        self.peak = max(self.peak, sum(self.live.values()))
        return out


def _rmsnorm(x, weight, eps=1e-5):
    """norms.py RMSNorm.forward: one fp32 copy of x normalised by its row RMS, cast back, times the weight."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return normed.type_as(x) * weight


@pytest.mark.parametrize("tokens,hidden", [(64, 256), (32, 1024)])
def test_rmsnorm(tokens, hidden):
    """torchtitan/models/norms.py RMSNorm.forward / _norm (commit 1ea476e9f), the unfused norm.

    Forward 36 B per element of x: _to_copy 6 (bf16->fp32) + pow 8 + mean 4 + mul 8 (x*rstd) + _to_copy 6
    (fp32->bf16) + mul 4 (*weight); per row 24 B (mean's output, add eps, rsqrt, rstd read) and the weight's 2 B
    per element of weight. Backward 96: mul 4 (g*w) + mul 6 + sum 2 (the weight-gradient reduction over tokens) +
    _to_copy 6 + mul 8 (g*rstd) + mul 12 + sum 4 (row sum) + div 8 (mean backward: the [t,1] grad expanded to
    [t,h], counted as a full read) + pow 8 + mul 8 + mul 12 (pow backward) + add 12 (the two x grads) + _to_copy 6;
    per row 36 B and per weight element 4 B (read w, write its grad)."""
    x = torch.randn(tokens, hidden, dtype=BF16, requires_grad=True)
    weight = torch.randn(hidden, dtype=BF16, requires_grad=True)
    fwd, out = _count(lambda: _rmsnorm(x, weight))
    grad = torch.ones_like(out)
    bwd, _ = _count(lambda: out.backward(grad))
    n = x.numel()
    assert fwd.total == EXPECTED["rmsnorm"]["fwd"] * n + 24 * tokens + 2 * hidden
    assert bwd.total == EXPECTED["rmsnorm"]["bwd"] * n + 36 * tokens + 4 * hidden
    assert bwd.by_op["sum"] == (2 + 4) * n + 2 * hidden + 4 * tokens  # weight-grad reduction + row sum
    assert set(fwd.by_op) == {"_to_copy", "pow", "mean", "add", "rsqrt", "mul"}
    assert set(bwd.by_op) == {"mul", "sum", "_to_copy", "pow", "div", "add"}


def _apply_rotary_emb(xq, xk, freqs_cis):
    """model.py apply_rotary_emb: fp32 pairs as complex64, times the [1, s, 1, d/2] table, back to real, cast."""
    q = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    k = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    table = freqs_cis.view(1, freqs_cis.shape[0], 1, freqs_cis.shape[1])
    q_out = torch.view_as_real(q * table).flatten(3)
    k_out = torch.view_as_real(k * table).flatten(3)
    return q_out.type_as(xq), k_out.type_as(xk)


@pytest.mark.parametrize("batch,seq,heads,kv_heads,head_dim", [(1, 32, 32, 8, 128), (2, 16, 16, 4, 64)])
def test_rope_complex(batch, seq, heads, kv_heads, head_dim):
    """torchtitan/models/llama/model.py apply_rotary_emb (+ reshape_for_broadcast) at commit 1ea476e9f.

    Per element of Q plus K, forward 20 B: _to_copy 6 (bf16->fp32) + complex mul 8 + _to_copy 6 (fp32->bf16); the
    complex64 table (4*s*d bytes) is read once per mul: +8*s*d in all. Backward 20 B (_to_copy 6 + mul 8 +
    _to_copy 6) + 24*s*d: each mul backward clones the conjugated table (the conj fallback resolves the conj bit:
    a real, tiny kernel) and reads it. view_as_complex / view_as_real / flatten are views: nothing counted."""
    xq = torch.randn(batch, seq, heads, head_dim, dtype=BF16, requires_grad=True)
    xk = torch.randn(batch, seq, kv_heads, head_dim, dtype=BF16, requires_grad=True)
    freqs_cis = torch.polar(torch.ones(seq, head_dim // 2), torch.randn(seq, head_dim // 2))
    fwd, (q_out, k_out) = _count(lambda: _apply_rotary_emb(xq, xk, freqs_cis))
    grads = [torch.ones_like(q_out), torch.ones_like(k_out)]
    bwd, _ = _count(lambda: torch.autograd.backward([q_out, k_out], grads))
    n = xq.numel() + xk.numel()
    assert fwd.total == EXPECTED["rope"]["fwd"] * n + 8 * seq * head_dim
    assert bwd.total == EXPECTED["rope"]["bwd"] * n + 24 * seq * head_dim
    assert set(fwd.by_op) == {"_to_copy", "mul"}
    assert set(bwd.by_op) == {"_to_copy", "mul", "clone"}
    assert fwd.by_op["_to_copy"] == bwd.by_op["_to_copy"] == 12 * n


@pytest.mark.parametrize("n_rep", [4, 8])
@pytest.mark.parametrize("batch,seq,kv_heads,head_dim", [(1, 32, 8, 128), (2, 16, 4, 64)])
def test_repeat_kv(batch, seq, kv_heads, head_dim, n_rep):
    """torchtitan/models/llama/model.py repeat_kv at commit 1ea476e9f (x[:, :, :, None, :].expand().reshape()).

    Per element of the expanded output: forward 4 B, one clone (the reshape of an expanded view copies); the
    counter charges its read at the expanded size, 2 B, where a GPU reads the source once (2 / n_rep B; real about
    2 + 2/n_rep). Backward 2 + 2/n_rep: the expand's backward is a sum over the n_rep axis."""
    x = torch.randn(batch, seq, kv_heads, head_dim, dtype=BF16, requires_grad=True)
    shape = (batch, seq, kv_heads, n_rep, head_dim)
    fwd, out = _count(lambda: x[:, :, :, None, :].expand(*shape).reshape(batch, seq, kv_heads * n_rep, head_dim))
    grad = torch.ones_like(out)
    bwd, _ = _count(lambda: out.backward(grad))
    n = out.numel()
    assert fwd.total == EXPECTED["repeat_kv"]["fwd"] * n and set(fwd.by_op) == {"clone"}
    exp = EXPECTED["repeat_kv"]
    assert bwd.total == exp["bwd"] * n + exp["bwd_per_source"] * n // n_rep and set(bwd.by_op) == {"sum"}


@pytest.mark.parametrize("tokens,ffn", [(32, 512), (16, 96)])
def test_swiglu(tokens, ffn):
    """torchtitan/models/llama/model.py FeedForward.forward at commit 1ea476e9f: ``F.silu(w1(x)) * w3(x)`` (the
    projections are separate GEMMs; a and b are their outputs).

    Forward 10 B per element: silu 4 + mul 6. Backward 18: mul 6 (g*b) + mul 6 (g*silu(a), silu's output saved)
    + silu_backward 6."""
    a = torch.randn(tokens, ffn, dtype=BF16, requires_grad=True)
    b = torch.randn(tokens, ffn, dtype=BF16, requires_grad=True)
    fwd, out = _count(lambda: F.silu(a) * b)
    grad = torch.ones_like(out)
    bwd, _ = _count(lambda: out.backward(grad))
    n = a.numel()
    assert fwd.total == EXPECTED["swiglu"]["fwd"] * n and fwd.by_op == {"silu": 4 * n, "mul": 6 * n}
    assert bwd.total == EXPECTED["swiglu"]["bwd"] * n and bwd.by_op == {"mul": 12 * n, "silu_backward": 6 * n}


@pytest.mark.parametrize("tokens,vocab", [(32, 4096), (64, 1024)])
def test_cross_entropy(tokens, vocab):
    """torchtitan/models/llama/model.py Transformer.forward (``self.output(h).float()``) and train.py loss_fn
    (``F.cross_entropy(pred.flatten(0, 1), labels.flatten(0, 1))``), loss.backward(), at commit 1ea476e9f.

    Per logit, forward 18 B: _to_copy 6 (bf16->fp32) + _log_softmax 8 + nll_loss_forward 4 (counted as a full
    read of the log-probs; the kernel gathers one per token) ; + 8 B per label (int64) and two fp32 scalars.
    Backward 26: nll_loss_backward 8 (counted: a read of the log-probs it takes only the shape of, and its fp32
    output, which the kernel zero-fills and scatters -1/N into: a pure write of 4) + _log_softmax_backward_data 12
    + _to_copy 6 (fp32->bf16); + 8 per label and scalars (the seed ones_like, grad, total_weight).
    Peak 14 per logit held at once, in _log_softmax_backward_data: the bf16 logits (2) + the saved fp32 log-probs
    (4) + nll's fp32 grad (4) + its fp32 output (4); the fp32 copy is freed after the forward. train.py keeps
    ``pred`` (the fp32 logits) alive through backward: 18."""
    logits = torch.randn(tokens, vocab, dtype=BF16, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,))
    fwd, loss = _count(lambda: F.cross_entropy(logits.float(), labels))
    bwd, _ = _count(lambda: loss.backward())
    n = logits.numel()
    exp = EXPECTED["cross_entropy"]
    assert fwd.total == exp["fwd"] * n + 8 * tokens + 2 * 4
    assert bwd.total == exp["bwd"] * n + 8 * tokens + 4 * 4
    assert fwd.by_op["_log_softmax"] == 8 * n and fwd.by_op["_to_copy"] == 6 * n
    assert bwd.by_op["_log_softmax_backward_data"] == 12 * n and bwd.by_op["_to_copy"] == 6 * n
    assert bwd.by_op["nll_loss_backward"] == 8 * n + 8 * tokens + 2 * 4
    assert not {"zero_", "zeros", "fill_", "zeros_like"} & (set(fwd.by_op) | set(bwd.by_op))  # no pure write op

    small = (8 * tokens + 64) / n  # labels, scalars
    for hold_pred, key in ((False, "peak"), (True, "peak_pred_held")):
        logits = torch.randn(tokens, vocab, dtype=BF16, requires_grad=True)
        with _LiveBytes(logits, labels) as live:
            pred = logits.float()
            loss = F.cross_entropy(pred, labels)
            if not hold_pred:
                del pred
            loss.backward()
        assert live.peak / n == pytest.approx(exp[key], abs=small)


def _params(sizes):
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(*s)) for s in sizes]


@pytest.mark.parametrize("sizes", [[(64, 48), (256,), (32, 100)], [(512, 256), (1024,), (300, 70)]])
def test_clip_and_adamw_step(sizes):
    """torchtitan train.py at commit 1ea476e9f: build_optimizer's ``torch.optim.AdamW(lr, betas=(0.9, 0.95),
    weight_decay=0.1, foreach=True)`` and ``torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)``,
    fp32 params and grads; the third step (state exists), clip and step counted apart.

    Clip 12 B per parameter: _foreach_norm 4 + _foreach_mul_ 8; + 16 per tensor and 40 (stack, the norm of
    norms, add, reciprocal, mul, clamp on scalars, the coefficient read). Step 84: _foreach_mul_ 16 (decay 8,
    exp_avg_sq*beta2 8) + _foreach_lerp_ 12 + _foreach_addcmul_ 16 (the grad counted twice, as g*g) +
    _foreach_sqrt 8 + _foreach_div_ 8 + _foreach_add_ 8 (eps) + _foreach_addcdiv_ 16; + 16 per tensor and 4: the
    CPU step counters (_foreach_add_ and two .item() calls per tensor: host work, not HBM)."""
    params = _params(sizes)
    opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn_like(p)
        clip, _ = _count(lambda: torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True))
        step, _ = _count(opt.step)
    n, k = sum(p.numel() for p in params), len(params)
    assert clip.total == EXPECTED["clip"] * n + 16 * k + 40
    assert step.total == EXPECTED["adamw_step"] * n + 16 * k + 4
    assert clip.by_op["_foreach_norm"] == 4 * n + 4 * k
    per_param = {op: b // n for op, b in step.by_op.items()}
    assert per_param == {"_foreach_add_": 8, "_foreach_mul_": 16, "_foreach_lerp_": 12, "_foreach_addcmul_": 16,
                         "_local_scalar_dense": 0, "_foreach_sqrt": 8, "_foreach_div_": 8, "_foreach_addcdiv_": 16}
