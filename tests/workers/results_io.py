"""The end of every test worker: rank 0 writes results.json atomically, then all ranks leave."""
import json
import os

import torch.distributed as dist


def finish(out_dir: str, results: dict) -> None:
    if dist.get_rank() == 0:
        tmp = os.path.join(out_dir, "results.json.tmp")
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1)
        os.replace(tmp, os.path.join(out_dir, "results.json"))
    dist.barrier()
    dist.destroy_process_group()
