"""hybridpar's context-parallel attention (hybridpar/runtime/attention.py ``_context_parallel``) on one process:
each CP rank's two load-balanced chunks, attending to the gathered keys, give exactly the rows of causal
attention over the whole sequence, forward and backward, with grouped-query heads; and the causal diagonal
goes to SDPA as a lower-right CausalBias, not a mask tensor, so on CUDA it can run FlashAttention (the
kernel the planner costs). The all-gather is replaced by the concatenation it returns; the multi-rank
layouts are tests/integration/test_runtime.py's."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import CausalBias
from torch.nn.attention.bias import causal_lower_right as _real_lower_right

from hybridpar.runtime import attention
from hybridpar.runtime.pipeline import context_parallel_slice


def _rank_chunks(t, cp, rank):
    """A CP rank's queries, keys or values ([b, heads, s, d]) as the runtime splits the sequence."""
    return context_parallel_slice(t, cp, rank, dim=2)


@pytest.mark.parametrize("cp, q_heads, kv_heads", [(2, 4, 4), (4, 8, 2)])
def test_each_ranks_chunks_are_the_rows_of_whole_sequence_attention(monkeypatch, cp, q_heads, kv_heads):
    torch.manual_seed(0)
    b, s, d = 2, 16 * cp, 8
    q = torch.randn(b, q_heads, s, d, requires_grad=True)
    k, v = (torch.randn(b, kv_heads, s, d, requires_grad=True) for _ in range(2))
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q_heads != kv_heads)
    grads = torch.autograd.grad(whole.sum(), (q, k, v))

    biases = []

    def lower_right(*size):
        biases.append(_real_lower_right(*size))
        return biases[-1]

    core = object.__new__(attention._make_class(object, cp_group=None))
    core.cp_size, core.softmax_scale, core.gqa_group = cp, None, q_heads // kv_heads
    got = [torch.zeros_like(t) for t in (q, k, v)]
    for rank in range(cp):
        local_q, local_k, local_v = (_rank_chunks(t.detach(), cp, rank) for t in (q, k, v))
        local_q.requires_grad_()
        # every rank's local K/V in rank order, as the all-gather returns them; its backward sums each slice's
        # gradient into the rank that holds it (below)
        gathered = {id(t): torch.cat([_rank_chunks(whole_t.detach(), cp, r) for r in range(cp)], dim=2).requires_grad_()
                    for t, whole_t in ((local_k, k), (local_v, v))}
        monkeypatch.setattr(attention, "gather_along_sequence", lambda t, group: gathered[id(t)])
        monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: rank)
        monkeypatch.setattr(attention, "causal_lower_right", lower_right)
        out = core._context_parallel(local_q, local_k, local_v)
        assert torch.allclose(out, _rank_chunks(whole.detach(), cp, rank), atol=1e-6)
        g_q, g_k, g_v = torch.autograd.grad(out.sum(), (local_q, gathered[id(local_k)], gathered[id(local_v)]))
        _add_rank_chunks(got[0], g_q, cp, rank)
        for total, g in ((got[1], g_k), (got[2], g_v)):
            for owner, piece in enumerate(g.chunk(cp, dim=2)):
                _add_rank_chunks(total, piece, cp, owner)
    # q's gradient is each rank's own; K/V's are summed over the ranks whose queries attended to them
    for g_whole, g_cp in zip(grads, got):
        assert torch.allclose(g_whole, g_cp, atol=1e-5)
    # two chunks per rank, each diagonal at its chunk's offset: (chunk, keys seen)
    chunk = s // (2 * cp)
    assert [(bias.seq_len_q, bias.seq_len_kv) for bias in biases] == [
        (chunk, (c + 1) * chunk) for r in range(cp) for c in (r, 2 * cp - 1 - r)]
    assert all(isinstance(bias, CausalBias) for bias in biases)


def _add_rank_chunks(total, grad, cp, rank):
    pieces = list(total.chunk(2 * cp, dim=2))
    half = grad.shape[2] // 2
    pieces[rank] += grad[:, :, :half]
    pieces[2 * cp - 1 - rank] += grad[:, :, half:]
