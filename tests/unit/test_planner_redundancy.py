"""`--tolerate-replica-loss`: the redundancy's bytes and seconds worked out by hand for explicit
plans, the layouts it refuses, and its seconds in the step time (topology/redundancy.py)."""
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from hybridpar.topology.hardware import get_gpu, gpu_from_dict
from hybridpar.topology.models import PRESETS
from hybridpar.topology.plan import Plan, PlanError
from hybridpar.topology.redundancy import KEEP, replica_redundancy, tolerance_problems
from hybridpar.topology.search import Request, evaluate, search
from plan_cli import run

H100 = get_gpu("h100-80gb")
EFF = 0.8  # links.LINK_EFFICIENCY, written out so that a change to it shows here
# Llama 3 8B by hand: hidden 4096, 32 heads of 128, 8 KV heads, FFN 14336 (SwiGLU), vocab 128256.
ATTN = 4096 * 4096 * 2 + 4096 * (8 * 128) * 2  # q and out, k and v
MLP = 3 * 4096 * 14336


def llama8b(**kw) -> Plan:
    return Plan(model=PRESETS["llama3-8b"], seq_len=8192, global_batch=48, **kw)


def last_stage_params(tp: int, pp: int) -> int:
    """The largest pipeline rank of Llama 3 8B (pp > 1): the last, its layers (norm weights
    replicated over TP), the output matrix and the final norm."""
    return 32 // pp * ((ATTN + MLP) // tp + 2 * 4096) + 128256 * 4096 // tp + 4096


def test_zero1_snapshot_exchange_and_host_memory_by_hand():
    # TP2 PP2 DP4 = 16 GPUs, two nodes of 8: replica r holds ranks 4r..4r+3, so replica 1's
    # neighbour (replica 2) is on the other node: the ring crosses the network.
    r = replica_redundancy(llama8b(tp=2, pp=2, dp=4, zero_stage=1), H100)
    n = last_stage_params(tp=2, pp=2)
    assert n == 2_007_633_920
    snapshot = 12 * n / 4  # fp32 master + two AdamW moments, this rank's 1/(dp x cp) partition
    assert r.snapshot_bytes == snapshot == 6_022_901_760
    assert r.copy_bytes == snapshot
    assert r.host_bytes == KEEP * 2 * snapshot == 4 * snapshot
    assert r.d2h_s == pytest.approx(3 * snapshot / (64e9 * EFF), rel=1e-12)  # PCIe Gen5 x16: out, in, out
    # 50 GB/s NIC per GPU and direction, one send/receive pair across nodes (8.4 + 9.6 us, NCCL's model)
    assert r.link == "network"
    assert r.exchange_s == pytest.approx(snapshot / (50e9 * EFF) + 18.0e-6, rel=1e-12)
    assert r.added_s == pytest.approx(3 * 0.1176348 + 0.1505905, abs=1e-6)


def test_zero1_partition_is_one_over_dp_times_cp():
    one = replica_redundancy(llama8b(tp=2, pp=2, dp=4, zero_stage=1), H100)
    with_cp = replica_redundancy(llama8b(tp=2, pp=2, dp=4, cp=2, zero_stage=1), H100)
    whole = 12 * last_stage_params(tp=2, pp=2)
    assert one.snapshot_bytes == whole / 4
    assert with_cp.snapshot_bytes == whole / 8  # ZeRO shards over DP x CP


def test_zero0_copies_the_whole_state_and_exchanges_nothing():
    r = replica_redundancy(llama8b(tp=2, pp=2, dp=4, zero_stage=0), H100)
    whole = 12 * last_stage_params(tp=2, pp=2)
    assert (r.snapshot_bytes, r.copy_bytes, r.exchange_s, r.link) == (whole, 0.0, 0.0, "none")
    assert r.host_bytes == KEEP * whole
    assert r.added_s == r.d2h_s == pytest.approx(whole / (64e9 * EFF), rel=1e-12)


def test_neighbour_on_the_same_node_uses_nvlink_else_the_network():
    # TP1 PP2 DP4 = 8 GPUs: every replica in the one node, the exchange over NVLink (450 GB/s per
    # direction on H100, one send/receive inside a node: 8.4 + 3.4 us).
    inside = replica_redundancy(llama8b(tp=1, pp=2, dp=4, zero_stage=1), H100)
    snapshot = 12 * last_stage_params(tp=1, pp=2) / 4
    assert inside.link == "nvlink" and inside.snapshot_bytes == snapshot
    assert inside.exchange_s == pytest.approx(snapshot / (450e9 * EFF) + 11.8e-6, rel=1e-12)
    # TP8 DP2 = 16 GPUs: a replica per node.
    across = replica_redundancy(llama8b(tp=8, dp=2, zero_stage=1), H100)
    assert across.link == "network"
    assert across.exchange_s == pytest.approx(across.copy_bytes / (50e9 * EFF) + 18.0e-6, rel=1e-12)


def test_host_link_by_gpu_and_in_gpu_files(tmp_path):
    assert [get_gpu(g).host_link_gbps for g in ("a100-80gb", "h100-80gb", "h200-141gb", "h800-80gb", "b200-180gb")] \
        == [32.0, 64.0, 64.0, 64.0, 64.0]
    a100 = replica_redundancy(llama8b(tp=8, dp=2, zero_stage=1, gpu="a100-80gb"), get_gpu("a100-80gb"))
    h100 = replica_redundancy(llama8b(tp=8, dp=2, zero_stage=1), H100)
    assert a100.d2h_s == pytest.approx(2 * h100.d2h_s)
    assert gpu_from_dict({"base": "h200"}, "mine.yaml").host_link_gbps == 64.0  # inherited
    assert gpu_from_dict({"base": "h200", "host_link_gbps": 50}, "mine.yaml").host_link_gbps == 50
    full = {"bf16_tflops": 2250, "memory_gib": 180, "hbm_tbps": 8.0, "nvlink_gbps": 900, "network_gbps": 50,
            "gpus_per_node": 8, "sms": 148, "gemm_fraction": 0.8, "attention_fraction": 0.5}
    assert gpu_from_dict(full, "big.json").host_link_gbps == 32.0  # PCIe Gen4 x16, the default
    with pytest.raises(ValueError, match="host_link_gbps must be a positive number"):
        gpu_from_dict({"base": "h100", "host_link_gbps": 0}, "bad.yaml")


def test_layouts_that_cannot_lose_a_replica_are_refused():
    assert "needs dp >= 2" in tolerance_problems(llama8b(tp=8, pp=2, dp=1))[0]
    with pytest.raises(PlanError, match="dp >= 2"):
        replica_redundancy(llama8b(tp=8, pp=2, dp=1), H100)
    # 48 sequences over dp 4 at micro-batch 4 is fine; over the 3 left, 48 / (4 x 3) = 4 still is;
    # 40 over dp 4 at micro-batch 2 is fine, but not over 3 replicas.
    assert tolerance_problems(Plan(model=PRESETS["llama3-8b"], seq_len=8192, global_batch=48, dp=4, micro_batch=4)) == []
    (reason,) = tolerance_problems(Plan(model=PRESETS["llama3-8b"], seq_len=8192, global_batch=40, dp=4, micro_batch=2))
    assert reason.startswith("global batch 40 not divisible by micro-batch x (dp - 1) = 2 x 3")
    # interleaved: 36 sequences over dp 3 = 12 micro-batches, divisible by pp 4; over dp 2, 18 are not
    (reason,) = tolerance_problems(Plan(model=PRESETS["llama3-8b"], seq_len=8192, global_batch=36, dp=3, pp=4, vpp=2))
    assert reason == "after a replica loss (dp 2): interleaved schedule needs micro-batches per step (18) divisible by pp 4"


def test_search_rejects_with_the_numbers_and_keeps_survivable_plans():
    def req(batch, **pins):
        return Request(PRESETS["llama3-8b"], gpus=16, global_batch=batch, pins=pins, tolerate_replica_loss=True)

    with pytest.raises(PlanError, match=r"not divisible by micro-batch x \(dp - 1\) = 1 x 3"):
        search(req(32, tp=4, pp=1, cp=1))  # dp 4; 32 / 3 is not whole
    with pytest.raises(PlanError, match="needs dp >= 2"):
        search(req(32, tp=8, pp=2, cp=1))  # dp 1
    all_pinned = dict(tp=4, pp=1, cp=1, dp=4, micro_batch=1, vpp=1, zero_stage=1, recompute="none")
    with pytest.raises(PlanError, match=r"= 1 x 3"):
        search(req(32, **all_pinned))
    result = search(req(48), top=50)
    assert result.plans and all(e.plan.dp >= 2 and 48 % (e.plan.micro_batch * (e.plan.dp - 1)) == 0
                                and e.redundancy is not None for e in result.plans)
    assert [e.cost.step_time_s for e in result.plans] == sorted(e.cost.step_time_s for e in result.plans)
    assert any("1 x 15" in r.reason for r in result.rejected)  # TP1 DP16: 48 / 15 is not whole


def test_step_time_is_the_step_without_plus_the_added_seconds():
    plan = llama8b(tp=2, pp=2, dp=4, zero_stage=1)
    base, tolerant = evaluate(plan), evaluate(plan, tolerate_replica_loss=True)
    added = replica_redundancy(plan, H100).added_s
    assert base.redundancy is None and tolerant.redundancy.added_s == added
    assert tolerant.cost.step_time_s == pytest.approx(base.cost.step_time_s + added, rel=1e-12)
    assert tolerant.cost.replica_loss_s == added
    assert tolerant.cost.tokens_per_s == pytest.approx(plan.tokens_per_step / tolerant.cost.step_time_s, rel=1e-12)
    assert tolerant.cost.mfu == pytest.approx(base.cost.mfu * base.cost.step_time_s / tolerant.cost.step_time_s,
                                              rel=1e-12)
    assert "replica_loss" not in base.to_json() and tolerant.to_json()["replica_loss"]["added_s"] == round(added, 6)
    # the search ranks by that step
    pins = dict(tp=2, pp=2, cp=1, dp=4, micro_batch=1, vpp=1, zero_stage=1, recompute="none")
    (found,) = search(Request(PRESETS["llama3-8b"], gpus=16, global_batch=48, pins=pins,
                              tolerate_replica_loss=True)).plans
    assert found.cost.step_time_s == pytest.approx(evaluate(found.plan).cost.step_time_s + added, rel=1e-12)


PINNED = ["--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--pp", "2", "--cp", "1", "--dp", "4",
          "--micro-batch", "1", "--vpp", "1", "--zero", "1", "--recompute", "none", "--global-batch", "48"]


def test_cli_flag_json_and_text(capsys):
    code, out, _ = run([*PINNED, "--json"], capsys)
    assert code == 0 and "replica_loss" not in json.loads(out)["plans"][0]
    code, out, _ = run([*PINNED, "--json", "--tolerate-replica-loss"], capsys)
    (plan,) = json.loads(out)["plans"]
    snapshot = 12 * last_stage_params(tp=2, pp=2) / 4
    loss = plan["replica_loss"]
    assert code == 0 and loss["snapshot_bytes"] == loss["copy_bytes"] == snapshot and loss["link"] == "network"
    assert loss["host_gib_per_gpu"] == round(4 * snapshot / 2**30, 3) and loss["keep_steps"] == 2
    d2h, exchange = 3 * snapshot / (64e9 * EFF), snapshot / (50e9 * EFF) + 18e-6
    assert (loss["d2h_s"], loss["exchange_s"], loss["added_s"]) == (round(d2h, 6), round(exchange, 6),
                                                                   round(d2h + exchange, 6))
    code, text, _ = run([*PINNED, "--tolerate-replica-loss"], capsys)
    line = (f"replica-loss redundancy: +{(d2h + exchange) * 1e3:.1f} ms per step (d2h {d2h * 1e3:.1f} ms, "
            f"exchange {exchange * 1e3:.1f} ms), host memory +{4 * snapshot / 2**30:.2f} GiB per GPU")
    assert code == 0 and line in text and "synchronously" in text and "last 2 steps" in text
    code, _, err = run([*PINNED[:-1], "40", "--tolerate-replica-loss"], capsys)
    assert code == 2 and "= 1 x 3" in err and len(err.strip().splitlines()) == 1


def test_recipe_reliability_key_turns_it_on(tmp_path, monkeypatch, capsys):
    """reliability.tolerate_replica_loss (read with getattr: the recipe schema may not have it yet)."""
    import hybridpar.config.recipe as recipe_module

    path = tmp_path / "r.yaml"
    path.write_text("model: llama3-8b\nparallel: {tp: 2, pp: 2, cp: 1, zero: 1, micro_batch: 1}\n"
                    "train: {global_batch: 48, seq_len: 8192}\ncluster: {gpu: h100-80gb, gpus_per_node: 8}\n")
    argv = ["--recipe", str(path), "--gpus", "16", "--json", "--top", "1"]
    assert "replica_loss" not in json.loads(run(argv, capsys)[1])["plans"][0]
    load = recipe_module.load_recipe
    monkeypatch.setattr(recipe_module, "load_recipe",
                        lambda p: replace(load(p), reliability=SimpleNamespace(tolerate_replica_loss=True)))
    (plan,) = json.loads(run(argv, capsys)[1])["plans"]
    assert plan["replica_loss"]["snapshot_bytes"] == 12 * last_stage_params(tp=2, pp=2) / 4
