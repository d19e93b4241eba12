"""Activation bytes one torchtitan Llama block keeps for backward, per token (torchtitan 1ea476e9f, April 2024).

The block is rebuilt op for op (tests/torchtitan_block.py) after ``torchtitan/models/llama/model.py`` (``Attention``,
``apply_rotary_emb``, ``repeat_kv``, ``FeedForward``, ``TransformerBlock``) and ``torchtitan/models/norms.py``
(``RMSNorm``, ``FusedRMSNorm`` / ``TritonFusedRMSNorm``) at pytorch/torchtitan commit 1ea476e9f, with every
parameter and activation in bf16 (FSDP2 ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``).
``torch.autograd.graph.saved_tensors_hooks`` records what autograd keeps, one count per storage.

Two things exist only on the GPU and have CPU stand-ins that save exactly what the GPU code saves:
 - the fused Triton RMSNorm keeps (x, weight, rstd fp32 per row);
 - ``F.scaled_dot_product_attention`` on an A100 or H100 runs FlashAttention-2, which keeps query, key, value,
   output and an fp32 logsumexp [b, heads, s], and whose output is a [b, heads, s, d] view of a
   [b, s, heads, d] buffer (so torchtitan's ``transpose(1, 2).contiguous()`` copies nothing).

Result, bytes per token (h = dim, f = ffn hidden, heads = query heads; kv = n_kv_heads * head_dim does
not appear: ``repeat_kv`` hands SDPA expanded copies of K and V, and those are what it keeps):
    unfused RMSNorm: 24h + 8f + 4*heads + 8
    fused RMSNorm:   16h + 8f + 4*heads + 8
    full AC:         2h (the block input), and while one block is recomputed its full no-AC set is live.
"""
from contextlib import nullcontext
from dataclasses import replace

import pytest
import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.checkpoint import checkpoint

from torchtitan_block import CPU, FusedRMSNorm, TransformerBlock, UnfusedRMSNorm, precompute_freqs_cis

from hybridpar.observe.activation_audit import SavedStorages
from hybridpar.topology.memory import layer_activation_bytes
from hybridpar.topology.models import ModelSpec
from hybridpar.topology.plan import Plan
from hybridpar.topology.software import TORCHTITAN_2024

BF16, FP32 = 2, 4
PLANNER_SEQ = 1024


# ----------------------------------------------------------------------------------------------------
# The formulas: the saved-tensor inventory, and the planner's per-layer count it must add up to.


def saved_tensors_per_token(h, kv, f, heads, fused_norm):
    """{name: (dtype, bytes per token)} of every activation one block keeps for backward.

    ``kv`` is accepted for the planner's signature but unused: torchtitan's ``repeat_kv`` copies K and V
    up to ``heads`` heads before SDPA, and the expanded copies are what FlashAttention keeps.
    """
    del kv
    table = {}
    for norm in ("attention_norm", "ffn_norm"):
        if fused_norm:
            # TritonFusedRMSNorm.forward: ctx.save_for_backward(x, weight, rstd)
            table[f"{norm}.x"] = (torch.bfloat16, BF16 * h)
        else:
            # RMSNorm: x.float() kept by pow and mul, type_as(x) result kept by "* weight"
            table[f"{norm}.x_fp32"] = (torch.float32, FP32 * h)
            table[f"{norm}.normed_bf16"] = (torch.bfloat16, BF16 * h)
        table[f"{norm}.rstd"] = (torch.float32, FP32)  # fp32 [b, s, 1] (unfused rsqrt) or [b*s] (fused)
        table[f"{norm}.out"] = (torch.bfloat16, BF16 * h)  # input of wq/wk/wv, or of w1/w3
    table["attention.q"] = (torch.bfloat16, BF16 * h)  # rotated q, SDPA query
    table["attention.k"] = (torch.bfloat16, BF16 * h)  # rotated k after repeat_kv: heads * head_dim
    table["attention.v"] = (torch.bfloat16, BF16 * h)  # v after repeat_kv: heads * head_dim
    table["attention.sdpa_out"] = (torch.bfloat16, BF16 * h)  # SDPA output = wo's input (same storage)
    table["attention.logsumexp"] = (torch.float32, FP32 * heads)
    table["feed_forward.w1_out"] = (torch.bfloat16, BF16 * f)  # kept by silu
    table["feed_forward.silu_out"] = (torch.bfloat16, BF16 * f)  # kept by the gating mul
    table["feed_forward.w3_out"] = (torch.bfloat16, BF16 * f)  # kept by the gating mul
    table["feed_forward.gated"] = (torch.bfloat16, BF16 * f)  # w2's input
    return table


def expected_bytes_per_token(h, kv, f, heads, fused_norm):
    """The planner's count, topology/memory.py layer_activation_bytes under software.TORCHTITAN_2024 (16h + 8f +
    4*heads with the fused norm, 24h + 8f + 4*heads with the unfused one), plus the two norms' fp32 rstd, 8 bytes
    per token, which the planner leaves out."""
    head_dim = h // heads
    model = ModelSpec(1, h, f, heads, kv // head_dim, 32000, "swiglu", "torchtitan-block")
    plan = Plan(model, PLANNER_SEQ, 1, tp=1, cp=1, pp=1, dp=1, micro_batch=1, zero_stage=3, recompute="none")
    planner = layer_activation_bytes(plan, replace(TORCHTITAN_2024, norm_fusion=fused_norm)) / PLANNER_SEQ
    return int(planner) + 2 * FP32


def full_ac_bytes_per_token(h):
    """Full activation checkpointing keeps only the block input (bf16)."""
    return BF16 * h


def full_ac_recompute_bytes_per_token(h, kv, f, heads, fused_norm):
    """What one block holds at the end of its recomputation: its no-AC set plus its checkpointed input
    (the fused norm keeps that input itself, so it is not counted twice)."""
    extra = 0 if fused_norm else BF16 * h
    return expected_bytes_per_token(h, kv, f, heads, fused_norm) + extra


# ----------------------------------------------------------------------------------------------------
# Measurement.


def _ptr(t):
    return t.untyped_storage().data_ptr()


LAYOUTS = {
    # Llama 2 13B (dim 5120, 40 heads, ffn 13824) scaled down: MHA
    "mha": dict(heads=8, kv_heads=8, head_dim=16, ffn=352),
    # Llama 3 8B (dim 4096, 32 heads, 8 kv heads, ffn 14336) scaled down: GQA
    "gqa": dict(heads=8, kv_heads=2, head_dim=16, ffn=448),
}
MAX_SEQ = 64


def _build(layout, fused_norm, sdpa="flash2", seed=0):
    cfg = LAYOUTS[layout]
    dim = cfg["heads"] * cfg["head_dim"]
    torch.manual_seed(seed)
    block = TransformerBlock(dim, cfg["heads"], cfg["kv_heads"], cfg["ffn"], fused_norm, sdpa)
    for p in block.parameters():
        nn.init.normal_(p, std=0.05)
    block = block.to(torch.bfloat16)  # FSDP2 param_dtype=bf16: the block sees bf16 weights
    # Transformer.freqs_cis: a complex64 buffer (FSDP2 does not cast buffers) of 2 * max_seq_len rows
    freqs_table = precompute_freqs_cis(cfg["head_dim"], 2 * MAX_SEQ)
    dims = dict(h=dim, kv=cfg["kv_heads"] * cfg["head_dim"], f=cfg["ffn"], heads=cfg["heads"])
    return block, freqs_table, dims


def _input(b, s, h, seed=1):
    g = torch.Generator(device=CPU).manual_seed(seed)
    return torch.randn(b, s, h, generator=g, device=CPU).to(torch.bfloat16).requires_grad_()


def _independent_storages(block, freqs_table):
    """Storages that exist without the layer input: the parameters and the rope table."""
    named = {_ptr(p): f"param {n}" for n, p in block.named_parameters()}
    named[_ptr(freqs_table)] = "buffer freqs_cis (complex64)"
    return named


def _run_no_ac(layout, fused_norm, b, s):
    block, freqs_table, dims = _build(layout, fused_norm)
    x = _input(b, s, dims["h"])
    tap = {}
    block.set_tap(tap)
    log = SavedStorages()
    with log.hooks():
        out = block(x, freqs_table[:s])
    independent = _independent_storages(block, freqs_table)
    kept = {p: v for p, v in log.by_storage.items() if p not in independent}
    excluded = sorted(independent[p] for p in log.by_storage if p in independent)
    return dict(block=block, x=x, out=out, tap=tap, kept=kept, excluded=excluded, dims=dims)


CASES = [(layout, fused) for layout in LAYOUTS for fused in (False, True)]
CASE_IDS = [f"{layout}-{'fused' if fused else 'unfused'}" for layout, fused in CASES]


@pytest.mark.parametrize("layout, fused_norm", CASES, ids=CASE_IDS)
def test_no_ac_bytes_per_token_match_formula_and_are_linear(layout, fused_norm):
    """Replays torchtitan 1ea476e9f torchtitan/models/llama/model.py TransformerBlock.forward (Attention.forward,
    apply_rotary_emb, repeat_kv, FeedForward.forward) with torchtitan/models/norms.py RMSNorm.forward
    (unfused) or TritonFusedRMSNorm.forward (fused, CPU stand-in), SDPA standing in for FlashAttention-2.
    The kept bytes equal expected_bytes_per_token * b * s exactly, at two sequence lengths."""
    for b, s in ((2, 16), (2, 48)):
        run = _run_no_ac(layout, fused_norm, b, s)
        total = sum(nbytes for nbytes, _ in run["kept"].values())
        assert total == expected_bytes_per_token(**run["dims"], fused_norm=fused_norm) * b * s


@pytest.mark.parametrize("layout, fused_norm", CASES, ids=CASE_IDS)
def test_no_ac_saved_tensor_inventory(layout, fused_norm):
    """torchtitan 1ea476e9f torchtitan/models/llama/model.py TransformerBlock.forward with norms.py RMSNorm /
    TritonFusedRMSNorm: every kept storage is one named tensor of saved_tensors_per_token (dtype and size),
    and the only other saved storages are the block's parameters and the freqs_cis buffer."""
    b, s = 2, 16
    run = _run_no_ac(layout, fused_norm, b, s)
    expected = saved_tensors_per_token(**run["dims"], fused_norm=fused_norm)
    names = {_ptr(t): name for name, t in run["tap"].items() if name in expected}
    got = {}
    for p, (nbytes, dtype) in run["kept"].items():
        assert p in names, f"unnamed kept storage: {nbytes} bytes {dtype}"
        got[names[p]] = (dtype, nbytes // (b * s))
    assert got == expected
    # The norm weights, the seven linear weights and the rope table are saved too, and excluded.
    params = sorted(f"param {n}" for n, _ in run["block"].named_parameters())
    assert run["excluded"] == sorted(params + ["buffer freqs_cis (complex64)"])


def test_wo_input_is_the_sdpa_output_storage():
    """torchtitan 1ea476e9f torchtitan/models/llama/model.py Attention.forward: FlashAttention's output is laid
    out [b, s, heads, d], so ``output.transpose(1, 2).contiguous()`` is a no-op and wo keeps the very storage
    SDPA keeps (no extra 2h). The CPU kernel returns the same layout."""
    for sdpa in ("flash2", "cpu"):
        block, freqs_table, dims = _build("gqa", True, sdpa)
        block.set_tap({})
        block(_input(2, 16, dims["h"]), freqs_table[:16])
        attention = block.attention
        assert attention.sdpa_output.transpose(1, 2).is_contiguous()
        assert _ptr(attention.wo_input) == _ptr(attention.sdpa_output)


@pytest.mark.parametrize("fused_norm", [False, True], ids=["unfused", "fused"])
def test_rope_keeps_only_the_freqs_table(fused_norm):
    """torchtitan 1ea476e9f torchtitan/models/llama/model.py apply_rotary_emb: ``xq_ * freqs_cis`` keeps
    freqs_cis (it needs it for dxq) but not the fp32 complex xq_/xk_ (freqs_cis needs no gradient), and the
    ``.float()`` / ``type_as`` casts keep nothing: no complex64 tensor derived from the input is kept."""
    run = _run_no_ac("gqa", fused_norm, 2, 16)
    assert all(dtype != torch.complex64 for _, dtype in run["kept"].values())
    assert "buffer freqs_cis (complex64)" in run["excluded"]


@pytest.mark.parametrize("layout, fused_norm", CASES, ids=CASE_IDS)
def test_stand_ins_match_torch_numerics(layout, fused_norm):
    """The stand-ins for torchtitan 1ea476e9f norms.py TritonFusedRMSNorm and FlashAttention-2 compute what
    model.py TransformerBlock.forward computes with F.scaled_dot_product_attention, forward and backward."""
    b, s = 2, 16
    outs, grads = [], []
    for sdpa in ("flash2", "cpu"):
        block, freqs_table, dims = _build(layout, fused_norm, sdpa)
        x = _input(b, s, dims["h"])
        out = block(x, freqs_table[:s])
        out.float().square().sum().backward()
        outs.append(out.float())
        grads.append(x.grad.float())
    torch.testing.assert_close(outs[0], outs[1], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(grads[0], grads[1], atol=5e-2, rtol=5e-2)
    if fused_norm:  # the fused stand-in normalises like the unfused RMSNorm
        x = _input(b, s, dims["h"])
        fused, plain = FusedRMSNorm(dims["h"]).to(torch.bfloat16), UnfusedRMSNorm(dims["h"]).to(torch.bfloat16)
        torch.testing.assert_close(fused(x).float(), plain(x).float(), atol=2e-2, rtol=2e-2)


class _RecomputeSpy:
    """Recompute context for checkpoint(context_fn=...): while checkpoint recomputes the block, record
    each saved storage, then hand the tensor on to checkpoint's own recomputation hook."""

    def __init__(self, log):
        self.log = log
        self.inner = None

    def __enter__(self):
        inner_pack, inner_unpack = torch._C._autograd._top_saved_tensors_default_hooks(False)

        def pack(t):
            self.log.pack(t)
            return inner_pack(t)

        self.inner = saved_tensors_hooks(pack, inner_unpack)
        return self.inner.__enter__()

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)


@pytest.mark.parametrize("layout, fused_norm", CASES, ids=CASE_IDS)
def test_full_ac_keeps_the_input_and_recompute_peaks_at_no_ac(layout, fused_norm):
    """torchtitan 1ea476e9f torchtitan/parallelisms/parallelize_llama.py checkpoint_wrapper, mode "full":
    ptd_checkpoint_wrapper(CheckpointImpl.NO_REENTRANT) -> torch.utils.checkpoint.checkpoint(block, x,
    freqs_cis, use_reentrant=False) around model.py TransformerBlock.forward. Forward keeps the block input
    only (2h per token); backward recomputes the block and then holds its full no-AC set."""
    for b, s in ((2, 16), (2, 48)):
        block, freqs_table, dims = _build(layout, fused_norm)
        x = _input(b, s, dims["h"])
        independent = _independent_storages(block, freqs_table)
        fwd, rec = SavedStorages(), SavedStorages()
        with fwd.hooks():
            out = checkpoint(block, x, freqs_table[:s], use_reentrant=False, preserve_rng_state=False,
                             context_fn=lambda: (nullcontext(), _RecomputeSpy(rec)))
        kept = {p: v for p, v in fwd.by_storage.items() if p not in independent}
        assert list(kept) == [_ptr(x)]
        assert sum(n for n, _ in kept.values()) == full_ac_bytes_per_token(dims["h"]) * b * s

        out.float().square().sum().backward()
        recomputed = {p: v for p, v in rec.by_storage.items() if p not in independent}
        tokens = b * s
        no_ac = expected_bytes_per_token(**dims, fused_norm=fused_norm) * tokens
        assert sum(n for n, _ in recomputed.values()) == no_ac
        live = {**kept, **recomputed}  # the checkpointed input plus everything recomputed
        assert sum(n for n, _ in live.values()) == full_ac_recompute_bytes_per_token(**dims, fused_norm=fused_norm) * tokens


def test_formula_at_full_size():
    """The formulas for torchtitan 1ea476e9f torchtitan/models/llama/__init__.py llama2 "13B" (dim 5120, 40 heads,
    ffn 13824) and llama3 "8B" (dim 4096, 32 heads, 8 kv heads, ffn 14336), fused_rmsnorm as in their
    train_configs, and unfused rmsnorm."""
    assert expected_bytes_per_token(5120, 5120, 13824, 40, True) == 192_680
    assert expected_bytes_per_token(5120, 5120, 13824, 40, False) == 233_640
    assert expected_bytes_per_token(4096, 1024, 14336, 32, True) == 180_360
    assert expected_bytes_per_token(4096, 1024, 14336, 32, False) == 213_128
    for args in ((5120, 5120, 13824, 40), (4096, 1024, 14336, 32)):
        for fused in (False, True):
            table = saved_tensors_per_token(*args, fused_norm=fused)
            assert sum(n for _, n in table.values()) == expected_bytes_per_token(*args, fused_norm=fused)
