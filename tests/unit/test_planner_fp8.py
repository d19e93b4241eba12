"""FP8 as Transformer Engine runs it under megatron-core (topology/fp8.py): the fp8 GEMM rate, the casts and
transposes counted from TE 1.13's modules, the output layer in 16 bits, the fp8 all-gathers, and the refusal to
cost fp8 for a stack that has none."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest


from hybridpar.topology.cost import _fp8_gather_share, layer_time, step_cost
from hybridpar.topology.fp8 import layer_cast_bytes, layer_cast_kernels
from hybridpar.topology.hardware import HardwareError, get_gpu, gpu_from_dict
from hybridpar.topology.kernels import gemm_time
from hybridpar.topology.models import PRESETS
from hybridpar.topology.plan import Plan
from hybridpar.topology.software import HYBRIDPAR, MEGATRON_CORE, MEGATRON_CORE_BF16_GRADS, PROFILES
from plan_cli import run
from tensor_listing import listed_bytes

H100 = get_gpu("h100-80gb")
L8B = PRESETS["llama3-8b"]


def _te_tensors(m, tp: int, sp: bool) -> tuple[list, list]:
    """(elements per token, bytes per element) of every tensor Transformer Engine 1.13 casts or transposes in one
    layer, listed module by module as its code does it; the norms' fp8 output counted as the byte it saves."""
    h, kv, f = m.hidden, m.kv_heads * m.head_dim, m.ffn_hidden
    local = 1 / tp if sp else 1.0
    forward = [(h * local, -1), (h * local, -1)]  # layernorm_fwd_fp8 before QKV and fc1 writes 1 byte, not 2
    backward = [(h, 2), (h, 2)]  # fp8_transpose of the gathered norm outputs for the QKV and fc1 wgrads
    backward += [((h + 2 * kv) / tp, 4), (2 * f / tp, 4)]  # their output gradients: fp8_cast_transpose_fused
    for row_input in (h / tp, f / tp):  # proj, fc2
        if sp:
            forward.append((row_input, 3))  # cast_to_fp8
            backward += [(row_input, 2), (h * local, 3), (h, 2)]  # input transpose; gradient cast, gathered, transposed
        else:
            forward.append((row_input, 4))  # fp8_cast_transpose_fused
            backward.append((h, 4))  # the output gradient's fp8_cast_transpose_fused
    return forward, backward


@pytest.mark.parametrize("tp,sp", [(1, False), (4, True), (8, True), (2, False)])
def test_cast_bytes_are_te_tensors_summed(tp, sp):
    forward, backward = _te_tensors(L8B, tp, sp)
    assert layer_cast_bytes(L8B, tp, sp) == pytest.approx(listed_bytes(forward, backward))
    assert layer_cast_kernels(sp) == (len(forward) - 2, len(backward))  # one kernel a tensor; the norms' are theirs


def test_fp8_gemm_runs_at_the_measured_fp8_rate():
    """The same compute-bound shape (same tiles and waves) in fp8 and bf16: the rates are the two measured MAMFs."""
    m = n = k = 8192
    fp8 = gemm_time(m, k, n, H100, H100.fp8_tflops * 1e12, 1, 1)
    bf16 = gemm_time(m, k, n, H100, H100.bf16_tflops * 1e12, 1, 2)
    assert H100.fp8_gemm_fraction == pytest.approx(1402.6 / 1979, abs=1e-3)
    assert bf16 / fp8 == pytest.approx(1979 * H100.fp8_gemm_fraction / (989 * H100.gemm_fraction), rel=1e-9)
    no_measurement = replace(H100, fp8_gemm_fraction=None)  # a GPU without an fp8 measurement: bf16's fraction
    assert gemm_time(m, k, n, no_measurement, 1979e12, 1, 1) < fp8


def _plan(model, precision, **kw):
    base = dict(tp=1, pp=1, cp=1, dp=8, vpp=1, micro_batch=1, zero_stage=1, recompute="none",
                sequence_parallel=True, gpu="h100-80gb")
    base.update(kw)
    return Plan(model, 8192, 256, precision=precision, **base)


def test_output_layer_stays_in_16_bits_under_fp8():
    """Only the output layer depends on the vocabulary: a larger one adds the same compute to an fp8 plan as to a
    bf16 plan, since megatron-core's output layer runs outside Transformer Engine's fp8_autocast."""
    big_vocab = replace(L8B, vocab=2 * L8B.vocab, name="llama3-8b-2v")
    added = {p: step_cost(_plan(big_vocab, p), MEGATRON_CORE).compute_s - step_cost(_plan(L8B, p), MEGATRON_CORE).compute_s
             for p in ("bf16", "fp8")}
    assert added["fp8"] == pytest.approx(added["bf16"], rel=1e-6) and added["bf16"] > 0


def test_fp8_gathers_move_half_the_bytes():
    share = _fp8_gather_share(8192 * 8192 * 2, H100, 8, 8)
    assert 0.5 < share < 0.6  # bandwidth-bound: half, plus the call's latency
    args = (L8B, H100, None, 8192, 1, 8, 1, True, "none")
    bf16 = layer_time(*args[:2], "bf16", *args[3:], MEGATRON_CORE, 8)
    fp8 = layer_time(*args[:2], "fp8", *args[3:], MEGATRON_CORE, 8)
    # the reduce-scatters keep their 16-bit bytes, the gathers halve: between half and all of the bf16 time
    assert 0.5 * bf16.tp < fp8.tp < 0.9 * bf16.tp


def test_fp8_parameter_gather_moves_one_byte_per_parameter():
    sw = replace(MEGATRON_CORE_BF16_GRADS, overlap_param_gather=False, overlap_grad_reduce=False)
    plan = _plan(L8B, "fp8", dp=64)
    without = step_cost(plan, sw).dp_s
    with_fp8 = step_cost(plan, replace(sw, fp8_param_gather=True)).dp_s
    saved = without - with_fp8
    assert 0 < saved < without / 2  # the gather halves, the bf16 gradient reduce-scatter stays


def test_only_transformer_engine_stacks_cost_fp8():
    assert {n for n, sw in PROFILES.items() if sw.fp8} == {"megatron-core", "megatron-core-bf16-grads",
                                                           "nemo-distributed-fused-adam"}
    with pytest.raises(ValueError, match="no fp8"):
        layer_time(L8B, H100, "fp8", 8192, 1, 1, 1, True, "none", HYBRIDPAR, 8)


def test_gpu_file_takes_an_fp8_fraction(tmp_path):
    gpu = gpu_from_dict({"base": "h100-80gb", "fp8_gemm_fraction": 0.65}, str(tmp_path / "mine.json"))
    assert gpu.gemm_fraction_for(1) == 0.65 and gpu.gemm_fraction_for(2) == H100.gemm_fraction
    with pytest.raises(HardwareError, match="fp8_gemm_fraction"):
        gpu_from_dict({"base": "h100-80gb", "fp8_gemm_fraction": 1.4}, str(tmp_path / "bad.json"))


def test_tp1_costs_te_without_sequence_parallelism():
    """At TP 1 the planner's `sp` only says nothing is split; Transformer Engine's sequence_parallel is off, so
    the layer costs the same whichever way the flag is passed (the casts of the non-SP path)."""
    on = layer_time(L8B, H100, "fp8", 8192, 1, 1, 1, True, "none", MEGATRON_CORE, 8)
    off = layer_time(L8B, H100, "fp8", 8192, 1, 1, 1, False, "none", MEGATRON_CORE, 8)
    assert (on.fwd, on.bwd) == pytest.approx((off.fwd, off.bwd), rel=1e-12)


def _saved(m, tp, sp):
    """(elements per token, bytes per element) a layer keeps under fp8 beyond its 16-bit count, module by module."""
    h, f = m.hidden, m.ffn_hidden
    local = 1 / tp if sp else 1.0
    kept = [(h * local, 1 - 2), (h * local, 1 - 2)]  # LayerNormLinear's ln_out for QKV and fc1: fp8, not bf16
    kept.append((h / tp, 1 if sp else 2))  # proj's fp8 input (and its transpose without SP) beside FlashAttention's O
    kept.append((f / tp, (1 if sp else 2) - 2))  # fc2's input: its fp8 copy (and transpose) instead of the bf16 one
    return sum(n * b for n, b in kept)


@pytest.mark.parametrize("tp,sp", [(1, False), (4, True), (8, True)])
def test_activations_kept_in_fp8(tp, sp):
    from hybridpar.topology.fp8 import saved_bytes_change
    from hybridpar.topology.memory import layer_activation_bytes

    assert saved_bytes_change(L8B, tp, sp) == pytest.approx(_saved(L8B, tp, sp))
    plan = _plan(L8B, "fp8", tp=tp, dp=8 // tp)
    bf16 = replace(plan, precision="bf16")
    tokens = plan.micro_batch * plan.seq_len
    change = layer_activation_bytes(plan, MEGATRON_CORE) - layer_activation_bytes(bf16, MEGATRON_CORE)
    assert change == pytest.approx(tokens * _saved(L8B, tp, tp > 1))


def test_fp8_weights_cached_beside_16_bit_ones_unless_the_weights_are_fp8():
    from hybridpar.topology.memory import stage_memory
    from hybridpar.topology.stages import layer_params_per_rank, stages

    plan = _plan(L8B, "fp8", tp=2, dp=4)
    stage = stages(plan)[0]
    cached = stage_memory(plan, stage, MEGATRON_CORE).params
    bf16 = stage_memory(replace(plan, precision="bf16"), stage, MEGATRON_CORE).params
    fp8_weights = stage_memory(plan, stage, replace(MEGATRON_CORE, fp8_params=True)).params
    assert cached - bf16 == pytest.approx(2 * stage.layers * layer_params_per_rank(plan))
    assert fp8_weights == pytest.approx(bf16)


def test_fp8_plans_say_what_their_mfu_is_over(capsys):
    code, out, _ = run(["--model", "llama3-8b", "--gpus", "8", "--gpu", "h100", "--precision", "fp8",
                        "--software", "megatron-core", "--top", "1"], capsys)
    assert code == 0 and "fp8: MFU over the dense fp8 peak (1,979 TFLOP/s)" in out
    data = json.loads(run(["--model", "llama3-8b", "--gpus", "8", "--gpu", "h100", "--precision", "fp8",
                           "--software", "megatron-core", "--json"], capsys)[1])
    best = data["plans"][0]
    assert best["precision"] == "fp8" and best["mfu"] == pytest.approx(best["tflops_per_gpu"] / 1979, abs=1e-3)


def test_fp8_params_drop_the_cached_fp8_weights(capsys):
    """Without --fp8-params Transformer Engine keeps an fp8 copy and its transpose beside each 16-bit layer weight
    (2 bytes per parameter); with it the weights are that copy."""
    argv = ["--model", "llama3-8b", "--gpus", "8", "--gpu", "h100", "--precision", "fp8", "--software", "megatron-core-bf16-grads",
            "--tp", "1", "--pp", "1", "--cp", "1", "--micro-batch", "1", "--zero", "1", "--recompute", "full", "--json"]
    cached = json.loads(run(argv, capsys)[1])["plans"][0]["memory_gib"]["params"]
    fp8 = json.loads(run(argv + ["--fp8-params"], capsys)[1])["plans"][0]["memory_gib"]["params"]
    layers = 32 * PRESETS["llama3-8b"].params_per_layer
    assert cached - fp8 == pytest.approx(2 * layers / 2**30, abs=0.01)
