"""The end of every test worker: rank 0 writes results.json atomically, then all ranks leave.
One-process workers (a world of one, output path as argv[1]) run inside ``run_alone``.

A worker leaves with ``os._exit`` once its results are written and its process group destroyed:
the interpreter's teardown of torch, megatron-core and DeepSpeed costs ~1.1 s of CPU per process
and checks nothing (8 ranks on 2 cores: ~4.5 s per launch)."""
import json
import os
import sys

import torch.distributed as dist


def finish(out_dir: str, results: dict) -> None:
    if dist.get_rank() == 0:
        tmp = os.path.join(out_dir, "results.json.tmp")
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1)
        os.replace(tmp, os.path.join(out_dir, "results.json"))
    dist.barrier()
    dist.destroy_process_group()
    _leave()


def run_alone(compute) -> None:
    """A one-process worker: a world of one around ``compute()``, whose dict goes to sys.argv[1]."""
    from hybridpar.launch.local import init_distributed, shutdown

    init_distributed()
    try:
        results = compute()
    finally:
        shutdown()
    with open(sys.argv[1], "w") as f:
        json.dump(results, f)
    _leave()


def _leave() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
