"""Whole-process wall time of `hybridpar plan` (full search, interpreter start included) for
8 to 16,384 GPUs; median of repeats. Writes benchmarks/results/planner_speed.json.

    hybridpar bench planner_speed [--repeats 5]   (or: python -m hybridpar.benchmarks.planner_speed)
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hybridpar.benchmarks._cli import BenchParser, positive_int
from hybridpar.benchmarks.results_io import write_result

REPO = Path(__file__).resolve().parents[1]
GPUS = (8, 64, 512, 4096, 16384)
MODEL = {8: "llama3-8b", 64: "llama3-70b", 512: "llama3-70b", 4096: "llama3-405b", 16384: "llama3-405b"}


def command(gpus: int) -> list[str]:
    exe = Path(sys.executable).with_name("hybridpar")
    return [str(exe), "plan", "--model", MODEL[gpus], "--gpus", str(gpus)]


def main(argv=None) -> int:
    parser = BenchParser("planner_speed", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_int, default=5)
    args = parser.parse_args(argv)
    rows = []
    for gpus in GPUS:
        cmd = command(gpus)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
        rows.append({"gpus": gpus, "command": " ".join(["hybridpar", *cmd[1:]]),
                     "median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3),
                     "max_s": round(max(times), 3), "repeats": args.repeats})
        print(f"{gpus:>6} GPUs  median {rows[-1]['median_s']:.3f} s  min {rows[-1]['min_s']:.3f} s  ({cmd[3]})")
    path = write_result("planner_speed", {"load_average_1m": round(os.getloadavg()[0], 2), "results": rows},
                        command=" ".join(["hybridpar bench planner_speed", *(argv or [])]))
    print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
