"""Fast checks of the benchmark suite: the pure-Python predictions the benchmarks print beside their
measurements. Benchmarks themselves are not run or timed here (the list: tests/integration/test_bench_cli.py)."""
from __future__ import annotations

import subprocess
from dataclasses import replace

import pytest

from hybridpar.topology.cost import step_cost
from hybridpar.topology.links import LINK_EFFICIENCY
from hybridpar.topology.hardware import get_gpu
from hybridpar.topology.models import load_model
from hybridpar.topology.plan import Plan
from hybridpar.topology.software import HYBRIDPAR
from hybridpar.topology.stages import params_per_rank, stages
from hybridpar.topology.traffic import cost_model_bytes, dp_ring_lower_bound, runtime_bytes



def _tiny_3d(**kw) -> Plan:
    return Plan(model=load_model("tiny"), seq_len=32, global_batch=16, tp=2, pp=2, dp=2, micro_batch=2,
                zero_stage=1, precision="fp32", **kw)


def test_runtime_bytes_match_the_counts_recorded_on_tiny_tp2_pp2_dp2():
    """Per rank and step, fp32: 4 micro-batches of 2 x 32 tokens x 64 x 4 B = 16,384 B each."""
    plan = _tiny_3d()
    first, last = runtime_bytes(plan, 0), runtime_bytes(plan, 1)
    act = 2 * 32 * 64 * 4
    assert first["tp"].wire_bytes == 4 * (2 * 4 + 1) * act  # 2 layers x 4 all-reduces + embedding
    assert first["tp"].calls == 36
    # last stage: + output-layer input gradient + 3 cross-entropy all-reduces of 64 fp32 values
    assert last["tp"].wire_bytes == 4 * ((2 * 4 + 1) * act + 3 * 64 * 4)
    assert first["pp"].wire_bytes == 4 * act and first["pp"].calls == 8
    n = params_per_rank(plan, stages(plan)[0])
    assert n == 56576  # what the recorded run's first stage holds
    assert first["dp"].wire_bytes == pytest.approx(0.5 * n * 4 + 0.5 * n * 4)  # reduce to owners + all-gather
    # DeepSpeed's own reduction (overlap off): every bucket all-reduced in full
    assert runtime_bytes(plan, 0, bucket_allreduce=True)["dp"].wire_bytes == pytest.approx(1.5 * n * 4)
    z0 = runtime_bytes(replace(plan, zero_stage=0), 0)["dp"].wire_bytes
    assert z0 == pytest.approx(dp_ring_lower_bound(n, 2, 4))
    sp = runtime_bytes(replace(plan, sequence_parallel=True), 0)
    assert sp["pp"].wire_bytes == 2 * act  # sequence parallel sends 1/tp of the activations
    assert sp["tp"].calls == 4 * (2 * 10 + 2) + 1  # + embedding RS/AG, + norm-gradient sum
    assert sp["tp"].wire_bytes == 4 * 22 * act / 2 + 2 * 64 * 2 * 4  # measured: 721,920 B


@pytest.mark.parametrize("sp", [False, True])
def test_cost_model_bytes_give_back_cost_py_seconds(sp, monkeypatch):
    """The bytes are the planner's: divided by the link bandwidth they are step_cost's terms
    (nothing overlapped; NCCL's per-call latency, which carries no bytes, set to zero here; the ring
    model, not H100's measured table); with megatron-core's async backward TP collectives, less is
    exposed."""
    from hybridpar.topology import links

    monkeypatch.setattr(links, "NCCL_BASE_LAT_S", 0.0)
    monkeypatch.setattr(links, "NCCL_HOP_LAT_S", {"nvlink": 0.0, "network": 0.0})
    sw = replace(HYBRIDPAR, overlap_grad_reduce=False, overlap_param_gather=False, tp_bwd_overlap=False)
    plan = Plan(model=load_model("llama3-8b"), seq_len=8192, global_batch=32, tp=2, pp=2, dp=2, micro_batch=1,
                zero_stage=1, sequence_parallel=sp)
    modelled = replace(get_gpu(plan.gpu), nvlink_collectives=None)

    def modelled_cost(plan, sw):
        return step_cost(plan, sw=sw, gpu=modelled)

    cost, bytes_ = modelled_cost(plan, sw=sw), cost_model_bytes(plan, sw=sw)
    bw = modelled.nvlink_gbps * 1e9 * LINK_EFFICIENCY
    assert bytes_["tp"].wire_bytes / bw == pytest.approx(cost.tp_s, rel=1e-9)
    assert bytes_["pp"].wire_bytes / bw == pytest.approx(cost.pp_s, rel=1e-9)
    assert bytes_["dp"].wire_bytes / bw == pytest.approx(cost.dp_s, rel=1e-9)
    for z2_sw in (sw, replace(sw, zero2_reduce_once=False)):  # hybridpar's once-per-step ZeRO-2, classic
        z2 = replace(plan, zero_stage=2)
        assert (cost_model_bytes(z2, sw=z2_sw)["dp"].wire_bytes / bw
                == pytest.approx(modelled_cost(z2, sw=z2_sw).dp_s, rel=1e-9))
    overlapped = modelled_cost(plan, sw=replace(sw, tp_bwd_overlap=True)).tp_s
    assert 0 < overlapped < cost.tp_s  # the forward collectives stay exposed
    for recompute in ("none", "selective", "full"):  # CP: K/V all-gather(s) + reduce-scatter
        cp_plan = replace(plan, cp=2, pp=1, dp=2, recompute=recompute)
        cp_bytes = cost_model_bytes(cp_plan, sw=sw)["cp"].wire_bytes
        assert cp_bytes > 0 and cp_bytes / bw == pytest.approx(modelled_cost(cp_plan, sw=sw).cp_s, rel=1e-9)


def test_cost_model_bytes_match_recorded_steps():
    """Per rank and axis, the planner's bytes are within 5% of the bytes recorded by
    benchmarks/comm.py (results/comm.json); the stored measurements, recomputed model."""
    import json

    from hybridpar.benchmarks._jobs import Layout, make_plan
    from hybridpar.benchmarks.results_io import RESULTS_DIR

    result = json.loads((RESULTS_DIR / "comm.json").read_text())
    checked = 0
    for row in result["rows"]:
        if row["axis"] == "scalars+other":
            continue
        layout = Layout.parse(row["layout"])  # '_after': DeepSpeed's bucket all-reduce, in full
        sw = replace(HYBRIDPAR, full_grad_allreduce=layout.deepspeed_reduces)
        plan = make_plan(layout, model=result["model"])
        want = cost_model_bytes(plan, sw, dtype_bytes=4, pp_rank=row["pp_rank"])[row["axis"]].wire_bytes
        assert row["measured_wire"] == pytest.approx(want, rel=0.05, abs=1), row
        if row["axis"] == "cp" and plan.cp > 1:  # K/V all-gathers and the dK/dV reduce-scatter, exactly
            exact = runtime_bytes(plan, row["pp_rank"], dtype_bytes=4)["cp"].wire_bytes
            assert row["measured_wire"] == pytest.approx(exact, rel=1e-9) == want, row
        checked += 1
    assert checked >= 40


def test_recorder_sizes_follow_ring_algorithms():
    import torch

    from hybridpar.observe.comm_trace import group_kind, sizes

    t = torch.zeros(100)
    assert sizes("all_reduce", {"tensor": t}, 4) == (400, 600.0)
    assert sizes("all_gather", {"tensor_list": [t] * 4, "tensor": t}, 4) == (1600, 1200.0)
    assert sizes("reduce_scatter_tensor", {"output": torch.zeros(25), "input": t}, 4) == (400, 300.0)
    assert sizes("isend", {"tensor": t, "dst": 1}, 2) == (400, 400.0)
    assert sizes("irecv", {"tensor": t, "src": 1}, 2) == (400, 0.0)
    members = {"tp": [0, 1], "pp": [0, 2], "dp": [0, 4], "mp": [0, 1, 2, 3]}
    assert group_kind([2, 0], members, 8) == "pp"
    assert group_kind(list(range(8)), members, 8) == "world"


def test_memory_model_restated_for_fp32():
    from hybridpar.benchmarks.memory import planner_rows

    n = 1000
    z0, z1 = planner_rows(n, 4, 0), planner_rows(n, 4, 1)
    assert z0["planner_fp32"] == {"weights": 4 * n, "grads": 4 * n, "optimizer": 8 * n}
    assert z1["planner_fp32"]["optimizer"] == 12 * n / 4 == z1["planner_bf16"]["optimizer"]
    # hybridpar's ZeRO-2 keeps the full (fp32) gradients until its one reduction (as measured)
    assert planner_rows(n, 4, 2)["planner_bf16"]["grads"] == 4 * n


def test_paired_ratios_and_spread():
    from hybridpar.benchmarks._dist import spread
    from hybridpar.benchmarks.overhead import paired

    times = {"a": [1.1, 2.2, 3.3, 1.1, 1.0], "b": [1.0, 2.0, 3.0, 1.0, 1.0]}
    r = paired(times, "a", "b")
    assert r["median"] == pytest.approx(1.1) and r["rounds"] == 5 and r["min"] == pytest.approx(1.0)
    assert spread([3.0, 1.0, 2.0])["median"] == 2.0


def test_gpu_benchmark_model_is_about_1b_and_planned():
    from hybridpar.benchmarks.gpu import MODEL, PREDICTIONS, catalogue_name, make_plan

    plan = make_plan("h200-141gb", 2048, 2, 16)
    assert not plan.violations()
    assert 1.0e9 < params_per_rank(plan, stages(plan)[0]) < 1.15e9
    assert catalogue_name("NVIDIA H200", 140) == "h200-141gb"
    assert catalogue_name("NVIDIA A100-SXM4-40GB", 40) == "a100-40gb"
    # hybridpar's cast-then-add gradient accumulation is predicted slower than megatron-core's fused one
    runtime, fused = (step_cost(plan, sw=sw).step_time_s for _, sw in PREDICTIONS)
    assert runtime > fused and runtime == step_cost(plan).step_time_s
    assert MODEL.heads % MODEL.kv_heads == 0


def test_every_benchmark_takes_its_options_from_the_command_line(capsys):
    """`hybridpar bench NAME [options]` hands the options to ``main(argv)``: each benchmark parses
    them itself (``--help`` prints its usage and exits 0 without running anything)."""
    import importlib

    from hybridpar.benchmarks.cli import available

    names = sorted(available())
    assert names
    for name in names:
        module = importlib.import_module(f"hybridpar.benchmarks.{name}")
        with pytest.raises(SystemExit) as done:
            module.main(["--help"])
        assert done.value.code == 0, name
        assert "usage:" in capsys.readouterr().out, name


BAD_BENCH_INVOCATIONS = [
    ("overhead", ["--worlds", "3"]), ("overhead", ["--rounds", "0"]), ("overhead", ["--steps", "0"]),
    ("overhead", ["--worlds", "2,x"]), ("overhead", ["--model", "nosuch"]), ("overhead", ["--no-such-flag"]),
    ("memory", ["--dp", "0"]), ("memory", ["--dp", "3"]), ("memory", ["--zero", "3"]),
    ("throughput", ["--dp", "3"]), ("throughput", ["--steps", "0"]), ("throughput", ["--max-load", "0"]),
    ("comm", ["--nproc", "3"]), ("comm", ["--layouts", "nosuch"]), ("comm", ["--layouts", "tp"]),
    ("comm", ["--layouts", "tp3_dp2_z1", "--nproc", "6"]),
    ("soak", ["--nproc", "0"]), ("soak", ["--nproc", "4"]), ("soak", ["--steps", "0"]),
    ("soak", ["--save-every", "0"]), ("soak", ["--kill-every", "75"]), ("soak", ["--steps", "100"]),
    ("scaling", ["--max-gpus", "0"]), ("scaling", ["--max-gpus", "4"]), ("scaling", ["--models", "nosuch"]),
    ("gpu", ["--steps", "0"]), ("gpu", ["--global-batch", "15"]), ("gpu", ["--seq-len", "x"]),
    ("planner_speed", ["--repeats", "0"]), ("planner_speed", ["--bogus"]),
    ("data_prepare", ["--documents", "0"]), ("data_prepare", ["--repeats", "x"]), ("data_prepare", ["--vocab", "-5"]),
    ("kernels", ["--out", "gpu.json"]), ("kernels", ["--out", "no/such/folder/gpu.yaml"]),
    ("kernels", ["--sizes", "4096,0"]), ("kernels", ["--sizes", "4k"]), ("kernels", ["--seconds", "0"]), ("kernels", ["--soak", "-1"]),
    ("layer_kernels", ["--tokens", "4096,0"]), ("layer_kernels", ["--tokens", "4k"]), ("layer_kernels", ["--seconds", "0"]),
    ("init", ["--gpus", "0"]), ("init", ["--recipe", "no/such.yaml"]), ("init", ["--gpus", "7"]),
    ("async_save", ["--nproc", "0"]), ("async_save", ["--save-every", "x"]),
    ("replica_soak", ["--steps", "100", "--kills", "8"]), ("replica_soak", ["--rejoin-after-s", "0"]),
    ("replica_soak", ["--name", "../x"]), ("replica_soak", ["--kills", "0"]),
    ("failure_cost", ["--kill-step", "30", "--save-every", "40"]), ("failure_cost", ["--kill-step", "200"]),
    ("failure_cost", ["--repeats", "0"]), ("failure_cost", ["--name", "a b"]),
]


def test_every_benchmark_rejects_bad_input_in_one_line(capsys, monkeypatch):
    """Bad options end in exit status 2 and one line on stderr naming the problem, before any
    process is started (a launch here fails the test) or any result written."""
    import importlib

    from hybridpar.benchmarks import _dist, results_io

    def forbidden(*args, **kwargs):
        raise AssertionError(f"launched or wrote despite bad input: {args!r}")

    monkeypatch.setattr(_dist, "torchrun", forbidden)
    monkeypatch.setattr(_dist, "wait_for_quiet", forbidden)
    monkeypatch.setattr(results_io, "write_result", forbidden)
    monkeypatch.setattr(subprocess, "run", forbidden)
    monkeypatch.setattr(subprocess, "Popen", forbidden)
    covered = set()
    for name, argv in BAD_BENCH_INVOCATIONS:
        module = importlib.import_module(f"hybridpar.benchmarks.{name}")
        monkeypatch.setattr(module, "write_result", forbidden, raising=False)
        with pytest.raises(SystemExit) as done:
            module.main(argv)
        captured = capsys.readouterr()
        assert done.value.code == 2, (name, argv, captured.err)
        lines = captured.err.splitlines()
        assert len(lines) == 1 and lines[0].strip(), (name, argv, captured.err)
        assert lines[0].startswith(f"hybridpar bench {name}: error: "), (name, argv, lines)
        assert "Traceback" not in captured.err and not captured.out, (name, argv, captured)
        covered.add(name)
    from hybridpar.benchmarks.cli import available

    assert covered == set(available())


def test_results_are_replaced_whole_or_not_at_all(tmp_path):
    from hybridpar.files import replacing

    target = tmp_path / "r.csv"
    target.write_text("old\n")
    with pytest.raises(RuntimeError):
        with replacing(target) as f:
            f.write("half")
            raise RuntimeError("crash while writing")
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["r.csv"]
    with replacing(target, newline="") as f:
        f.write("new\n")
    assert target.read_text() == "new\n" and oct(target.stat().st_mode & 0o777) == "0o644"


@pytest.mark.parametrize("name", ["overhead", "comm"])
def test_a_gpu_sized_model_is_refused_before_launch(name, capsys, monkeypatch):
    import importlib

    from hybridpar.benchmarks import _dist

    monkeypatch.setattr(_dist, "torchrun", lambda *a, **k: pytest.fail("launched"))
    with pytest.raises(SystemExit) as done:
        importlib.import_module(f"hybridpar.benchmarks.{name}").main(["--model", "llama3-8b"])
    err = capsys.readouterr().err.strip()
    assert done.value.code == 2 and err.count("\n") == 0 and "use a CPU model such as tiny" in err, err
