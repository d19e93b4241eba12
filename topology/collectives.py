"""Measured NCCL collective times inside one NVLink node, by operation, group size and message size.

OpenXLA's collective performance table for compute capability 9.0 (topology/data/nccl_nvlink_sm90.json,
transcribed from xla/service/gpu/model/collective_interpolator_data.h, key sm_90): all-reduce, all-gather
and reduce-scatter of 1 KiB to 2 GiB over groups of 2, 4 and 8 GPUs of one 8-GPU H100-class node, every
GPU of the node in a group at once, as tensor-parallel groups run. It shows what a constant share of
NVLink does not: groups of 2 and 4 reach far less than 8 do (at 256 MiB, 227 and 284 GB/s of all-reduce
bus bandwidth against 372), and mid-size messages less than large ones.

On A100 one measurement (topology/data/nccl_nvlink_a100.json): nccl-tests' all-reduce over the 8 GPUs of one
A100-SXM4-40GB NVSwitch node (an Oracle Cloud tutorial, BM.GPU4.8), 64 B to 8 GiB. It reaches 197-223 GB/s of
bus bandwidth from 64 MiB to 512 MiB and 235 at 8 GiB, where the ring model at 80% of NVLink gives 240 and
more for mid sizes; groups of 2 and 4 and the other operations keep the model.

Bytes follow nccl-tests' convention: each rank's buffer for all-reduce, the gathered output for
all-gather, the input before scattering for reduce-scatter. Between measured sizes the time is
interpolated in log-log; below the smallest it is the smallest's; above the largest it grows at the
largest's throughput. A measured size never takes longer than a larger one (single medians at small
sizes are noisy: e.g. 1 KiB over 2 GPUs took 7x the 2 KiB time), so each size's time is the least of
its own and every larger size's.
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

from .interpolation import between

DATA = Path(__file__).resolve().parent / "data"
# Tables by name (hardware.GPU.nvlink_collectives names one): the node they were measured on.
TABLES = {"h100-nvlink4": DATA / "nccl_nvlink_sm90.json", "a100-nvlink3": DATA / "nccl_nvlink_a100.json"}


@lru_cache(maxsize=None)
def _curves(table: str) -> dict:
    """{(operation, ranks): (log bytes, log seconds)}, each time the least of its and larger sizes'."""
    data = json.loads(TABLES[table].read_text())["tables"]
    curves = {}
    for op, groups in data.items():
        for ranks, rows in groups.items():
            rows = sorted(rows)
            seconds = [b / throughput for b, throughput in rows]
            for i in range(len(seconds) - 2, -1, -1):
                seconds[i] = min(seconds[i], seconds[i + 1])
            curves[op, int(ranks)] = ([math.log(b) for b, _ in rows], [math.log(s) for s in seconds])
    return curves


def measured_time(table: str, op: str, nbytes: float, ranks: int) -> float | None:
    """Seconds of one ``op`` of ``nbytes`` (nccl-tests' convention) over ``ranks`` GPUs of the node the
    table was measured on, or None where the table has no such group."""
    curve = _curves(table).get((op, ranks))
    if curve is None or nbytes <= 0:
        return None
    xs, ys = curve
    x = math.log(nbytes)
    if x <= xs[0]:
        return math.exp(ys[0])
    if x >= xs[-1]:
        return math.exp(ys[-1]) * nbytes / math.exp(xs[-1])
    return math.exp(between(xs, ys, x))
