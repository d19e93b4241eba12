"""comm: bytes per axis (tp, cp, pp, dp) recorded in real training steps vs the planner's model.

`hybridpar bench comm [--layouts tp2_pp2_dp2_z1,...] [--model tiny]` starts one 8-rank launch
(gloo, fp32, CPU) that runs every layout in turn; for each, one warm-up step, then one step with
every torch.distributed collective and p2p call recorded (hybridpar/comm_trace.py). Per rank and
axis it reports calls, buffer bytes and ring wire bytes, beside topology/traffic.py's
``cost_model_bytes`` (the bytes behind cost.py's time terms, at the run's dtype) and
``runtime_bytes`` (hybridpar's calls, counted exactly), and the DP ring lower bound
2(d-1)/d x gradient bytes. Writes benchmarks/results/comm.json and comm.csv. ``--replan`` recomputes
only the planner columns of the stored comm.json with the current topology/ code (no launch).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys

from dataclasses import replace

from hybridpar.topology.software import HYBRIDPAR, Software
from hybridpar.topology.stages import params_per_rank
from hybridpar.topology.traffic import cost_model_bytes, dp_ring_lower_bound, runtime_bytes

from hybridpar.benchmarks import _dist
from hybridpar.benchmarks._cli import BenchParser, check_fits_in_memory, positive_float, positive_int
from hybridpar.benchmarks._jobs import Layout, make_job, make_plan
from hybridpar.benchmarks.results_io import RESULTS_DIR, replacing, write_result

DEFAULT_LAYOUTS = ("tp2_pp2_dp2_z1,tp2_pp2_dp2_z0,tp2_pp2_dp2_z2,tp2_pp2_dp2_z1_sp,tp2_pp2_dp2_z1_after,"
                   "dp8_z0,dp8_z1,dp8_z1_after,pp4_dp2_z1,cp2_pp2_dp2_z1,cp4_dp2_z1")
AXES = ("tp", "cp", "pp", "dp")
DTYPE_BYTES = 4  # fp32 on CPU; DeepSpeed reduces in fp32 (hybridpar's communication_data_type)


# --- worker (one rank) ----------------------------------------------------------------------
def worker(out: str, layouts: list[str], model: str) -> None:
    import torch.distributed as dist

    from hybridpar.observe.comm_trace import Recorder, summarize
    from hybridpar.launch.local import init_distributed

    _dist.quiet_worker_env()
    init_distributed()
    recorder = Recorder().install()
    results = {}
    for name in layouts:
        layout = Layout.parse(name)
        plan = make_plan(layout, model=model)
        job = make_job(plan, overlap_grad_reduce=not layout.deepspeed_reduces)
        job.train_step(1)
        with recorder.recording() as events:
            job.train_step(2)
        mesh = job.mesh
        mine = {"rank": mesh.rank, "pp_rank": mesh.pp_rank, "tp_rank": mesh.tp_rank, "dp_rank": mesh.dp_rank,
                "cp_rank": mesh.coord.cp,
                "axes": summarize(list(events), mesh.members, dist.get_world_size()),
                "params": sum(p.numel() for c in job.chunks for p in c.parameters())}
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        results[name] = gathered
        job.close()
    recorder.uninstall()
    _dist.finish_worker(out, results)


# --- driver ---------------------------------------------------------------------------------
def pct(measured: float, model: float) -> float | None:
    return None if model == 0 else round(100.0 * (measured - model) / model, 2)


def analyse(name: str, ranks: list[dict], model: str) -> list[dict]:
    """One row per (pipeline rank, axis) from TP/DP rank 0 of each stage."""
    layout = Layout.parse(name)
    plan = make_plan(layout, model=model)
    rows = []
    for r in sorted(ranks, key=lambda r: r["pp_rank"]):
        if r["tp_rank"] or r["dp_rank"] or r.get("cp_rank", 0):
            continue
        exact = runtime_bytes(plan, r["pp_rank"], dtype_bytes=DTYPE_BYTES, grad_bytes=4,
                              bucket_allreduce=layout.deepspeed_reduces)
        stage_n = params_per_rank(plan, _stage_of(plan, r["pp_rank"]))
        cost = cost_model_bytes(plan, planner_software(layout), DTYPE_BYTES, pp_rank=r["pp_rank"])
        for axis in AXES:
            got = r["axes"].get(axis, {"calls": 0, "bytes": 0, "wire_bytes": 0.0})
            row = {"layout": name, "pp_rank": r["pp_rank"], "axis": axis, "calls": got["calls"],
                   "measured_wire": got["wire_bytes"], "measured_buffer": got["bytes"],
                   "runtime_model_wire": exact[axis].wire_bytes, "planner_wire": cost[axis].wire_bytes,
                   "vs_runtime_model_pct": pct(got["wire_bytes"], exact[axis].wire_bytes),
                   "vs_planner_pct": pct(got["wire_bytes"], cost[axis].wire_bytes)}
            if axis == "dp":
                row["dp_ring_lower_bound"] = dp_ring_lower_bound(stage_n, plan.zero_group, 4)
                row["params_counted"] = r["params"]
                row["params_planner"] = stage_n
            rows.append(row)
        scalars = {k: v for k, v in r["axes"].items() if k.endswith("_scalar") or k in ("world", "mp", "other", "embedding")}
        rows.append({"layout": name, "pp_rank": r["pp_rank"], "axis": "scalars+other",
                     "calls": sum(v["calls"] for v in scalars.values()),
                     "measured_wire": sum(v["wire_bytes"] for v in scalars.values()),
                     "detail": scalars})
    return rows


def _stage_of(plan, pp_rank):
    from hybridpar.topology.traffic import _stage

    return _stage(plan, pp_rank)


def planner_software(layout: Layout) -> Software:
    """hybridpar's profile; the '_after' layouts leave the DP reduction to DeepSpeed, which
    all-reduces every gradient bucket in full (the profile's full_grad_allreduce)."""
    return replace(HYBRIDPAR, full_grad_allreduce=layout.deepspeed_reduces)


def replan(result: dict) -> dict:
    """The recorded bytes of ``result`` (a comm.json) with the planner's columns recomputed by
    the current topology/ code; the measurements, their date and machine are kept."""
    for row in result["rows"]:
        if row["axis"] == "scalars+other":
            continue
        layout = Layout.parse(row["layout"])
        plan = make_plan(layout, model=result["model"])
        cost = cost_model_bytes(plan, planner_software(layout), DTYPE_BYTES, pp_rank=row["pp_rank"])
        row["planner_wire"] = cost[row["axis"]].wire_bytes
        row["vs_planner_pct"] = pct(row["measured_wire"], row["planner_wire"])
    return result


def write_csv(rows: list[dict]) -> None:
    with replacing(RESULTS_DIR / "comm.csv", newline="") as f:
        keys = ["layout", "pp_rank", "axis", "calls", "measured_wire", "measured_buffer", "runtime_model_wire",
                "planner_wire", "vs_runtime_model_pct", "vs_planner_pct", "dp_ring_lower_bound"]
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(r for r in rows if r["axis"] != "scalars+other")


def print_table(rows: list[dict]) -> None:
    print(f"{'layout':<20} {'pp':>2} {'axis':<6} {'calls':>6} {'measured B':>12} {'runtime model':>13} {'planner':>12} "
          f"{'vs runtime':>10} {'vs planner':>10} {'DP ring LB':>11}")
    for r in rows:
        if r["axis"] == "scalars+other":
            print(f"{r['layout']:<20} {r['pp_rank']:>2} {'scalar':<6} {r['calls']:>6} {r['measured_wire']:>12,.0f}")
            continue
        lb = f"{r['dp_ring_lower_bound']:>11,.0f}" if "dp_ring_lower_bound" in r else ""
        fmt = lambda p: "n/a" if p is None else f"{p:+.1f}%"
        print(f"{r['layout']:<20} {r['pp_rank']:>2} {r['axis']:<6} {r['calls']:>6} {r['measured_wire']:>12,.0f} "
              f"{r['runtime_model_wire']:>13,.0f} {r['planner_wire']:>12,.0f} {fmt(r['vs_runtime_model_pct']):>10} "
              f"{fmt(r['vs_planner_pct']):>10} {lb}")


def check_layouts(p: BenchParser, args) -> list[str]:
    """The --layouts names, each parsed and planned for --model on --nproc ranks (the worker,
    launched on as many ranks as the layouts need, skips the rank count); else ``p.error``."""
    names = [n.strip() for n in args.layouts.split(",")]
    if any(not n for n in names):
        p.error(f"--layouts {args.layouts!r}: give comma-separated layouts without empty entries, e.g. tp2_pp2_dp2_z1")
    layouts = []
    for name in names:
        if names.count(name) > 1:
            p.error(f"--layouts: {name} is given twice; name each layout once")
        try:
            layout = Layout.parse(name)
        except ValueError as err:
            p.error(f"--layouts: {err}")
        layouts.append(layout)
        if layout.zero not in (0, 1, 2):
            p.error(f"--layouts: {name}: z{layout.zero} is not run here; use z0, z1 or z2 (no ZeRO-3 in this runtime)")
        if not args.worker and not args.replan and layout.world != args.nproc:
            p.error(f"--layouts: {name} needs {layout.world} ranks (tp x cp x pp x dp), not --nproc {args.nproc}; "
                    f"give --nproc {layout.world} or layouts of {args.nproc} ranks")
        try:
            make_plan(layout, model=args.model)
        except ValueError as err:
            p.error(f"--layouts {name} with --model {args.model}: {err}")
    # One layout at a time; each holds a whole training copy per DP x CP rank group.
    check_fits_in_memory(p, args.model, max(layout.dp * layout.cp for layout in layouts))
    return names


def main(argv=None) -> int:
    p = BenchParser("comm", description=__doc__.splitlines()[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--layouts", default=DEFAULT_LAYOUTS,
                   help="comma-separated layouts tpN_cpN_ppN_dpN_zN[_sp][_after], each of --nproc ranks")
    p.add_argument("--model", default="tiny")
    p.add_argument("--nproc", type=positive_int, default=8)
    p.add_argument("--timeout", type=positive_float, default=1200)
    p.add_argument("--replan", action="store_true",
                   help="recompute only the planner columns of the stored results/comm.json (no launch)")
    args = p.parse_args(argv)
    layouts = check_layouts(p, args)
    if args.replan:
        path = RESULTS_DIR / "comm.json"
        result = replan(json.loads(path.read_text()))
        result["replanned"] = "planner columns recomputed by `hybridpar bench comm --replan`"
        with replacing(path) as f:
            f.write(json.dumps(result, indent=2) + "\n")
        write_csv(result["rows"])
        print_table(result["rows"])
        return 0
    if args.worker:
        worker(args.worker, layouts, args.model)
        return 0
    load = _dist.loadavg()
    raw = _dist.torchrun("hybridpar.benchmarks.comm", args.nproc, ["--layouts", args.layouts, "--model", args.model], args.timeout)
    rows = [row for name in layouts for row in analyse(name, raw[name], args.model)]
    print_table(rows)
    cmd = "hybridpar bench comm " + " ".join(a for a in (argv or []))
    write_result("comm", {"model": args.model, "dtype": "fp32", "load_average": load, "rows": rows}, command=cmd.strip())
    write_csv(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
