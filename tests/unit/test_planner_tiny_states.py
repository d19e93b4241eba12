"""Model-state bytes of the tiny CPU model under ZeRO 0/1/2 agree with a hand count of its tensors."""
import pytest

from hybridpar.topology.memory import stage_memory
from hybridpar.topology.models import PRESETS
from hybridpar.topology.plan import Plan
from hybridpar.topology.software import HYBRIDPAR, MEGATRON_CORE, Software
from hybridpar.topology.stages import stages

TINY = PRESETS["tiny"]  # 4 layers, hidden 64, ffn 176, 4 heads (head_dim 16), 2 KV heads, vocab 320

# Hand count. Per layer: q 64x64, k and v 64x32 (2 KV heads x 16), o 64x64, SwiGLU gate/up/down
# 3 x 64x176, two RMSNorm weights of 64.
ATTENTION = 64 * 64 + 2 * 64 * 32 + 64 * 64  # 12,288
MLP = 3 * 64 * 176  # 33,792
NORMS = 2 * 64
EMBEDDING = 320 * 64  # 20,480; the untied output layer is the same size


def test_total_params_by_hand():
    assert TINY.total_params == 4 * (ATTENTION + MLP + NORMS) + 2 * EMBEDDING + 64 == 225_856


@pytest.mark.parametrize("zero, sw", [(0, HYBRIDPAR), (1, HYBRIDPAR), (2, HYBRIDPAR), (2, MEGATRON_CORE)])
def test_zero_states_per_stage_tp2_pp2_dp2(zero, sw):
    """Classic ZeRO-2 shards the gradients; hybridpar's keeps them whole until its one
    reduction per step (hybridpar/zero/engine.py _defer_zero2_reduction), in fp32."""
    plan = Plan(TINY, seq_len=32, global_batch=16, tp=2, pp=2, dp=2, micro_batch=2, zero_stage=zero)
    per_layer = (ATTENTION + MLP) // 2 + NORMS  # matrices split over TP=2, norms replicated
    held = {"first stage": 2 * per_layer + EMBEDDING // 2,  # 56,576
            "last stage": 2 * per_layer + EMBEDDING // 2 + 64}  # + final norm: 56,640
    got = {s.name: stage_memory(plan, s, sw) for s in stages(plan)}
    assert set(got) == set(held)
    for name, n in held.items():
        mem = got[name]
        assert mem.params == 2 * n
        grad_bytes = 4 if sw.fp32_grads else 2  # hybridpar accumulates bf16 gradients in fp32
        assert mem.grads == grad_bytes * n / (2 if zero >= 2 and not sw.zero2_reduce_once else 1)
        assert mem.optimizer == 12 * n / (2 if zero >= 1 else 1)


def test_fp32_gradients_are_four_bytes():
    plan = Plan(TINY, seq_len=32, global_batch=16, tp=1, pp=1, dp=4, zero_stage=1)
    (only,) = stages(plan)
    mem = stage_memory(plan, only, Software(fp32_grads=True))
    assert mem.grads == 4 * TINY.total_params and mem.optimizer == 12 * TINY.total_params / 4
