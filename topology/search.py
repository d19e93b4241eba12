"""Search: enumerate layouts, reject the infeasible with a reason, rank the rest by step time.

Axes: TP, CP, PP (DP follows from the GPU count), micro-batch, virtual stages, ZeRO stage and
recomputation; any may be pinned. Pruning keeps a full 16,384-GPU search well under a second:
* cheap divisibility checks and a lower bound on model-state memory (16 bytes per parameter
  over DP) run before anything is costed;
* per layout, ZeRO stages are tried from the least to the most communication (1, 2, 3) and
  recomputation from none to full; the first combination that fits is the fastest of those
  that follow it (they only add communication or FLOPs), so the rest are skipped (the
  replica-loss redundancy, when asked for, is the same for ZeRO 1, 2 and 3 and any recomputation);
* per-layer times are cached (cost.layer_time), rank groups are never built.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .cost import StepCost, step_cost
from .hardware import GIB, GPU, get_gpu
from .memory import StageMemory, plan_memory
from .models import ModelSpec
from .plan import RECOMPUTE_MODES, Plan, PlanError
from .redundancy import ReplicaRedundancy, batch_problem, replica_redundancy, tolerance_problems
from .software import HYBRIDPAR, PROFILES, Software
from .stages import params_per_rank, stages

AXES = ("tp", "cp", "pp", "dp", "micro_batch", "vpp", "zero_stage", "recompute")
MAX_MICRO_BATCH = 16
MIN_CP_CHUNK = 1024  # tokens per CP rank below which splitting the sequence only adds traffic


@dataclass(frozen=True)
class Evaluated:
    plan: Plan
    memory: StageMemory
    cost: StepCost  # with the redundancy's seconds in the step when there is one
    fits: bool
    redundancy: ReplicaRedundancy | None = None  # planned to tolerate a replica loss

    def to_json(self) -> dict:
        p, c, mem = self.plan, self.cost, self.memory
        extra = {"replica_loss": self.redundancy.to_json()} if self.redundancy else {}
        return {
            "tp": p.tp, "pp": p.pp, "cp": p.cp, "dp": p.dp, "vpp": p.vpp, "micro_batch": p.micro_batch,
            "grad_accum": p.grad_accum, "zero_stage": p.zero_stage, "recompute": p.recompute,
            "memory_gib": mem.gib(),  # every part, and their sum
            "fits": self.fits, "step_time_s": round(c.step_time_s, 4),
            "tokens_per_s": round(c.tokens_per_s, 1), "tflops_per_gpu": round(c.tflops_per_gpu, 1),
            "precision": p.precision, "mfu": round(c.mfu, 4), "bubble_fraction": round(c.bubble_fraction, 4),
            "comm_s": {k: round(v, 4) for k, v in c.comm().items()}, **extra,
        }


@dataclass(frozen=True)
class Rejected:
    tp: int
    pp: int
    cp: int
    dp: int
    reason: str
    need_bytes: float = 0.0  # smallest memory tried, for memory rejections (ranks tightness)

    def to_json(self) -> dict:
        return {"tp": self.tp, "pp": self.pp, "cp": self.cp, "dp": self.dp, "reason": self.reason}


@dataclass
class SearchResult:
    plans: list[Evaluated]
    rejected: list[Rejected]
    evaluated: int = 0  # configurations costed
    examined: int = 0  # configurations considered at all


@dataclass(frozen=True)
class Request:
    model: ModelSpec
    gpus: int
    global_batch: int  # sequences
    seq_len: int = 8192
    gpu: str = "h100-80gb"
    gpus_per_node: int = 8
    precision: str = "bf16"
    pins: dict = field(default_factory=dict)  # axis -> value, axes as in AXES
    software: Software = HYBRIDPAR
    # Scale-out NIC bandwidth per GPU per direction, GB/s, where the cluster differs from the
    # GPU catalogue's DGX-style default (e.g. BLOOM's Jean Zay: 4 x 100 Gb/s per 8 GPUs).
    network_gbps: float | None = None
    # A GPU outside the catalogue, or a catalogue GPU as measured (hardware.load_gpu, a GPU file);
    # None: the catalogue entry named by gpu.
    gpu_spec: GPU | None = None
    # Share of each GPU's memory a plan must leave free (0.1: a plan may use 90%): room for what
    # the memory model cannot see (another allocator, a profiler, a larger batch later).
    headroom: float = 0.0
    # Plan for surviving the loss of a DP replica (redundancy.py): dp >= 2, the batch divisible over
    # dp - 1 replicas too, and each step pays the optimizer-state snapshot and exchange.
    tolerate_replica_loss: bool = False

    def hardware(self) -> GPU:
        gpu = self.gpu_spec or get_gpu(self.gpu)
        return gpu if self.network_gbps is None else replace(gpu, network_gbps=self.network_gbps)

    def memory_budget(self, gpu: GPU) -> float:
        """Bytes a plan may use per GPU."""
        return gpu.memory_bytes * (1 - self.headroom)

    def budget_text(self, gpu: GPU) -> str:
        if not self.headroom:
            return f"the {gpu.name}'s {gpu.memory_gib:.1f} GiB"
        return (f"the {self.memory_budget(gpu) / GIB:.1f} GiB that {self.headroom:.0%} headroom leaves of the "
                f"{gpu.name}'s {gpu.memory_gib:.1f} GiB")


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _choices(req: Request, axis: str, default: list) -> list:
    return [req.pins[axis]] if axis in req.pins else default


def evaluate(plan: Plan, sw: Software = HYBRIDPAR, gpu: GPU | None = None,
             tolerate_replica_loss: bool = False) -> Evaluated:
    gpu = gpu or get_gpu(plan.gpu)
    mem = plan_memory(plan, sw, gpu.fp8_transposes)
    return _costed(plan, mem, sw, gpu, mem.total <= gpu.memory_bytes, tolerate_replica_loss)


def _costed(plan: Plan, mem: StageMemory, sw: Software, gpu: GPU, fits: bool, tolerate: bool) -> Evaluated:
    cost = step_cost(plan, sw, gpu)
    if not tolerate:
        return Evaluated(plan, mem, cost, fits)
    red = replica_redundancy(plan, gpu)
    return Evaluated(plan, mem, cost.with_replica_loss(red.added_s), fits, red)


def _base_plan(req: Request, tp: int, **kw) -> Plan:
    """A plan of the request's model, batch and cluster; sequence parallelism wherever TP > 1 and
    the software has it."""
    return Plan(model=req.model, seq_len=req.seq_len, global_batch=req.global_batch, gpu=req.gpu,
                gpus_per_node=req.gpus_per_node, precision=req.precision, tp=tp,
                sequence_parallel=tp > 1 and req.software.sequence_parallel, **kw)


def search(req: Request, top: int = 5) -> SearchResult:
    gpu = req.hardware()
    m, n, sw = req.model, req.gpus, req.software
    zero = req.pins.get("zero_stage")
    if zero is not None and zero not in sw.zero_stages:
        others = [o.name for o in PROFILES.values() if zero in o.zero_stages]
        if len(sw.zero_stages) == 1:
            runs, pin = f"it runs ZeRO-{sw.zero_stages[0]} only", f"pin --zero {sw.zero_stages[0]}"
        else:
            runs, pin = f"it runs ZeRO {', '.join(map(str, sw.zero_stages))}", "pin one of those"
        raise PlanError(f"ZeRO-{zero} is not part of {sw.label} ({runs}): {pin}, or plan for "
                        f"{' or '.join(others)} with --software")
    recompute = req.pins.get("recompute")
    if recompute is not None and recompute not in sw.recompute_modes:
        raise PlanError(f"recompute {recompute} is not part of {sw.label} (it offers "
                        f"{', '.join(sw.recompute_modes)}): pin one of those")
    for axis in ("tp", "cp", "pp"):
        if axis not in sw.model_parallel_axes and req.pins.get(axis, 1) > 1:
            split = (f"it splits a replica along {', '.join(sw.model_parallel_axes)} only" if sw.model_parallel_axes
                     else "each GPU holds a whole replica")
            raise PlanError(f"{axis} {req.pins[axis]} is not part of {sw.label} ({split}): pin --{axis} 1")
    if not sw.interleaved_pipeline and req.pins.get("vpp", 1) > 1:
        raise PlanError(f"vpp {req.pins['vpp']} is not part of {sw.label} (its pipeline runs 1F1B without virtual "
                        f"stages): pin --vpp 1")
    if all(a in req.pins for a in AXES):
        plan = _base_plan(req, **{a: req.pins[a] for a in AXES})
        plan = _with_split(plan)
        problems = plan.violations() + _layout_problems(plan, n, req.gpus_per_node)
        if req.tolerate_replica_loss:
            problems += tolerance_problems(plan)
        if problems:
            raise PlanError(problems[0])
        return SearchResult([evaluate(plan, sw, gpu, req.tolerate_replica_loss)], [], 1, 1)

    result = SearchResult([], [])
    tps = _choices(req, "tp", [d for d in _divisors(n) if m.heads % d == 0 and m.kv_heads % d == 0
                               and m.ffn_hidden % d == 0 and (d == 1 or "tp" in sw.model_parallel_axes)])
    for tp in tps:
        if tp > req.gpus_per_node:
            result.rejected.append(Rejected(tp, 0, 0, 0, f"tp {tp} beyond a node of {req.gpus_per_node} GPUs"))
            continue
        rest = n // tp if n % tp == 0 else 0
        cps = _choices(req, "cp", [c for c in _divisors(rest) if c == 1 or (
            "cp" in sw.model_parallel_axes and req.seq_len % (2 * c) == 0 and req.seq_len // c >= MIN_CP_CHUNK)]) if rest else []
        for cp in cps:
            rest2 = rest // cp if rest % cp == 0 else 0
            pps = _choices(req, "pp", [p for p in _divisors(rest2) if p <= m.layers and (
                p == 1 or "pp" in sw.model_parallel_axes)]) if rest2 else []
            for pp in pps:
                if rest2 % pp:
                    continue
                dp = rest2 // pp
                if "dp" in req.pins and req.pins["dp"] != dp:
                    continue
                _search_family(req, gpu, tp, cp, pp, dp, result)
    result.plans.sort(key=lambda e: e.cost.step_time_s)
    if not result.plans:
        raise PlanError(no_plan_message(req, result))
    result.plans = result.plans[:top]
    return result


def _with_split(plan: Plan) -> Plan:
    return plan.with_default_split()


def _layout_problems(plan: Plan, gpus: int, per_node: int) -> list[str]:
    out = []
    if plan.world_size != gpus:
        out.append(f"tp x cp x pp x dp = {plan.tp} x {plan.cp} x {plan.pp} x {plan.dp} = "
                   f"{plan.world_size}, not the {gpus} GPUs asked for")
    if plan.tp > per_node:
        out.append(f"tp {plan.tp} beyond a node of {per_node} GPUs")
    return out


def _search_family(req: Request, gpu: GPU, tp: int, cp: int, pp: int, dp: int, result: SearchResult) -> None:
    m, cap = req.model, req.memory_budget(gpu)
    reject = lambda reason, need=0.0: result.rejected.append(Rejected(tp, pp, cp, dp, reason, need))
    if req.global_batch % dp:
        return reject(f"global batch {req.global_batch} not divisible by dp {dp}")
    if req.tolerate_replica_loss and dp < 2:
        return reject(batch_problem(req.global_batch, dp, 1))
    even = m.layers % pp == 0
    if pp > 1 and not even and (m.layers + 2) % pp:
        return reject(f"layers {m.layers} (or {m.layers + 2} with lighter end stages) not divisible by pp {pp}")
    probe = _with_split(_base_plan(req, tp=tp, cp=cp, pp=pp, dp=dp, zero_stage=3))
    floor = max(16 * params_per_rank(probe, s) for s in stages(probe)) / probe.zero_group
    if floor > cap:
        over = f"DP={dp}" if cp == 1 else f"DP x CP = {dp} x {cp}"
        return reject(f"weights, gradients and optimizer alone need {floor / GIB:.1f} GiB per GPU at "
                      f"TP={tp}, PP={pp}, even with ZeRO-3 over {over}", floor)

    per_replica = req.global_batch // dp
    mbs = _choices(req, "micro_batch", [b for b in _divisors(per_replica) if b <= MAX_MICRO_BATCH])
    if req.tolerate_replica_loss:
        survivable = [b for b in mbs if not batch_problem(req.global_batch, dp, b)]
        if not survivable:  # the smallest micro-batch is the easiest to divide by
            return reject(batch_problem(req.global_batch, dp, mbs[0]))
        mbs = survivable
    # ZeRO shards over DP x CP (the CP ranks hold the same weights); with neither there is nothing to shard.
    # A stack without ZeRO (Megatron-LM 2021) replicates the optimizer whatever DP is; one that runs only
    # ZeRO-3 (PyTorch FSDP's FULL_SHARD) runs it over a group of one. (A pinned stage the software lacks
    # was refused in search().)
    sharded = [z for z in (1, 2, 3) if z in req.software.zero_stages] or [0]
    zeros = _choices(req, "zero_stage", [0] if dp * cp == 1 and 0 in req.software.zero_stages else sharded)
    recomputes = _choices(req, "recompute", [r for r in RECOMPUTE_MODES if r in req.software.recompute_modes])
    best_miss = None
    found = False
    for mb in mbs:
        if per_replica % mb:
            continue
        accum = per_replica // mb
        slots_max = m.layers + 2 if pp > 1 else m.layers
        vpps = _choices(req, "vpp", [v for v in (1, 2, 3, 4, 6, 8, 12, 16) if v == 1 or (
            req.software.interleaved_pipeline and pp > 1 and accum % pp == 0
            and (m.layers % (pp * v) == 0 or (m.layers + 2) % (pp * v) == 0) and pp * v <= slots_max)])
        for v in vpps:
            for zero in zeros:
                outcome = _first_fit(req, gpu, result, tp, cp, pp, dp, mb, v, zero, recomputes)
                if isinstance(outcome, Evaluated):
                    found = True
                    if outcome.plan.recompute == "none":
                        break  # more ZeRO sharding only adds communication
                elif isinstance(outcome, str):
                    best_miss = best_miss or (None, outcome)
                    break
                elif outcome is not None and (best_miss is None or best_miss[0] is None
                                              or outcome[0].total < best_miss[0].total):
                    best_miss = outcome
    if found:
        return
    if best_miss is None:
        return reject("no micro-batch / virtual-stage combination divides the batch")
    mem, detail = best_miss
    if mem is None:
        return reject(detail)
    p = detail
    reject(f"needs {mem.total / GIB:.1f} GiB per GPU at TP={tp}, CP={cp}, PP={pp}, DP={dp} at best (ZeRO-{p.zero_stage}, recompute {p.recompute}, "
           f"micro-batch {p.micro_batch}: states {(mem.params + mem.grads + mem.optimizer) / GIB:.0f}, "
           f"activations {mem.activations / GIB:.0f}), above {req.budget_text(gpu)}",
           mem.total)


def _first_fit(req, gpu, result, tp, cp, pp, dp, mb, v, zero, recomputes):
    """The first recomputation mode that fits (the fastest that fits): an Evaluated; else a
    violation message, or (memory, plan) of the smallest miss."""
    smallest = None
    for rc in recomputes:
        result.examined += 1
        plan = _with_split(_base_plan(req, tp=tp, cp=cp, pp=pp, dp=dp, vpp=v, micro_batch=mb,
                                      zero_stage=zero, recompute=rc))
        problems = plan.violations() + (tolerance_problems(plan) if req.tolerate_replica_loss else [])
        if problems:
            return problems[0]
        mem = plan_memory(plan, req.software, gpu.fp8_transposes)
        if mem.total > req.memory_budget(gpu):
            if smallest is None or mem.total < smallest[0].total:
                smallest = (mem, plan)
            continue
        result.evaluated += 1
        found = _costed(plan, mem, req.software, gpu, True, req.tolerate_replica_loss)
        result.plans.append(found)
        return found
    return smallest


def no_plan_message(req: Request, result: SearchResult) -> str:
    gpu = req.hardware()
    memory = [r for r in result.rejected if r.need_bytes]
    if memory:
        tight = min(memory, key=lambda r: r.need_bytes)
        return f"no feasible plan for {req.model.name} on {req.gpus} x {gpu.name}; tightest: {tight.reason}"
    if result.rejected:
        # with --tolerate-replica-loss, a reason that rule gave, where there is one
        lost = [r for r in result.rejected if req.tolerate_replica_loss and "replica loss" in r.reason]
        return f"no feasible plan for {req.model.name} on {req.gpus} GPUs; e.g. {(lost or result.rejected)[0].reason}"
    return f"no layout of {req.gpus} GPUs matches the pinned axes {req.pins}"
