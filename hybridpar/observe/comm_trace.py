"""Record every torch.distributed collective and point-to-point call, with its group and size.

Used by the runtime tests (tests/workers/runtime_worker.py) and the comm benchmark
(benchmarks/comm.py). ``Recorder.install()`` wraps the functions of ``torch.distributed`` (and of
``distributed_c10d``, whose own ``isend``/``irecv`` ``P2POp`` checks against), so megatron-core's
and DeepSpeed's calls, which look the functions up at call time, are seen. Nothing is recorded
unless ``active`` is true.

Each event: ``op``, ``group`` (sorted global ranks), ``numel`` (of the first tensor argument, as
the runtime test reads it), ``bytes`` (the collective's whole logical buffer: the reduced tensor,
the gathered output, the scattered input, or the p2p message) and ``wire_bytes`` (what this rank
sends under bandwidth-optimal ring algorithms: all-reduce 2(n-1)/n, all-gather / reduce-scatter /
reduce / broadcast (n-1)/n of the buffer, a send its message, a receive nothing); p2p events
also carry ``peer``.
"""
from __future__ import annotations

import functools
import inspect
from collections import defaultdict
from contextlib import contextmanager

import torch
import torch.distributed as dist

from hybridpar.compat import torch as torch_compat

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "broadcast", "reduce", "all_to_all", "all_to_all_single", "all_gather_object", "barrier")
P2P = ("isend", "irecv", "send", "recv")
# Group kinds in the order a group is matched (a DP-only world's dp group is also the world).
KINDS = ("tp", "cp", "pp", "dp", "dp_cp", "embedding", "mp")
# ZeRO's DP x CP group carries the DP axis' traffic when cp > 1. With dp = 1 it is the CP group
# itself and a collective's group cannot tell gradients from K/V: it is counted under cp.
AXIS_OF_KIND = {"dp_cp": "dp"}


def _tensor_bytes(t) -> int:
    return int(t.numel() * t.element_size()) if isinstance(t, torch.Tensor) else 0


def sizes(op: str, args: dict, n: int) -> tuple[int, float]:
    """(logical buffer bytes, ring wire bytes sent by this rank) of one call on an n-rank group."""
    first = next((v for v in args.values() if isinstance(v, torch.Tensor)), None)
    if op in P2P:
        b = _tensor_bytes(first)
        return b, float(b) if op in ("isend", "send") else 0.0
    if op == "all_gather":  # (tensor_list, tensor): the input is one rank's share
        buf = _tensor_bytes(args.get("tensor")) * n
    elif op == "reduce_scatter_tensor":  # (output, input): the input is the whole buffer
        buf = _tensor_bytes(args.get("input"))
    elif op == "reduce_scatter":  # (output, input_list)
        buf = _tensor_bytes(args.get("output")) * n
    else:  # all_reduce, broadcast, reduce, all_gather_into_tensor (output first), all_to_all*
        buf = _tensor_bytes(first)
    if n <= 1:
        return buf, 0.0
    factor = 2.0 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
    return buf, factor * buf


class Recorder:
    def __init__(self):
        self.events, self.active, self.saved = [], False, {}
        self._depth = 0  # a call re-entered through a __torch_function__ mode is recorded once

    def install(self) -> "Recorder":
        for name in COLLECTIVES + P2P:
            if hasattr(dist, name) and name not in self.saved:
                orig = getattr(dist, name)
                self.saved[name] = orig
                torch_compat.replace_distributed_function(name, self._wrap(name, orig))
        return self

    def uninstall(self) -> None:
        for name, orig in self.saved.items():
            torch_compat.replace_distributed_function(name, orig)
        self.saved = {}

    @contextmanager
    def recording(self):
        self.events.clear()
        self.active = True
        try:
            yield self.events
        finally:
            self.active = False

    def _wrap(self, name, orig):
        sig = inspect.signature(orig)

        @functools.wraps(orig)
        def wrapper(*args, **kwargs):
            if self.active and self._depth == 0:
                self.events.append(self._event(name, sig.bind_partial(*args, **kwargs).arguments))
            self._depth += 1
            try:
                return orig(*args, **kwargs)
            finally:
                self._depth -= 1

        return wrapper

    def _event(self, name: str, arguments: dict) -> dict:
        group = arguments.get("group")
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        event = {"op": name, "group": sorted(ranks)}
        tensor = next((v for v in arguments.values() if isinstance(v, torch.Tensor)), None)
        event["numel"] = int(tensor.numel()) if tensor is not None else 0
        event["bytes"], event["wire_bytes"] = sizes(name, arguments, len(ranks))
        for key in ("dst", "src", "group_dst", "group_src"):
            if arguments.get(key) is not None and name in P2P:
                peer = arguments[key]
                if key.startswith("group_"):
                    peer = ranks[peer]
                event["peer"] = int(peer)
        return event


def group_kind(ranks: list[int], members: dict, world: int) -> str:
    """Name a group by the mesh's members (kind -> this rank's group), else 'world' / 'other'."""
    ranks = sorted(ranks)
    for kind in KINDS:
        if sorted(members.get(kind) or []) == ranks and len(ranks) > 1:
            return kind
    if len(ranks) == world:
        return "world"
    return "self" if len(ranks) == 1 else "other"


def summarize(events: list[dict], members: dict, world: int, scalar_numel: int = 8) -> dict:
    """Per group kind: calls, buffer bytes and ring wire bytes; tensors of at most
    ``scalar_numel`` elements (losses, norms, flags) are counted under ``<kind>_scalar``."""
    out = defaultdict(lambda: {"calls": 0, "bytes": 0, "wire_bytes": 0.0})
    for e in events:
        if e["op"] in ("barrier", "all_gather_object"):
            continue
        kind = group_kind(e["group"], members, world)
        kind = AXIS_OF_KIND.get(kind, kind)
        if e["numel"] <= scalar_numel:
            kind += "_scalar"
        row = out[kind]
        row["calls"] += 1
        row["bytes"] += e["bytes"]
        row["wire_bytes"] += e["wire_bytes"]
    return dict(out)
