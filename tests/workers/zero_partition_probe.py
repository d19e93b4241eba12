"""One process for tests/integration/test_memory_audit.py: the bytes ``memory_audit.count_stage`` derives for a
stage, against what DeepSpeed's ZeRO optimizer really allocates for the same chunks.

Joins a fake world (TP2 x PP2 x DP3: 12 ranks, DP 3 so that the flat groups need padding) as
pipeline rank 0, builds the tiny model's chunks with real CPU weights in bf16, counts them, then
wraps them in hybridpar's StageEngine (DeepSpeed ZeRO-1 or 2) and reads DeepSpeed's flat buffers,
partitions and AdamW state. Prints one JSON line."""
from __future__ import annotations

import json
import sys
import warnings

import os

import torch

warnings.filterwarnings("ignore")


def main(zero_stage: int) -> dict:
    from hybridpar.topology.layout import RankLayout
    from hybridpar.topology.models import PRESETS
    from hybridpar.topology.stages import Stage

    from hybridpar.config.optim import OptimConfig
    from hybridpar.zero.engine import StageEngine
    from hybridpar.observe.memory_audit import count_stage, fake_world
    from hybridpar.runtime.mesh import Mesh
    from hybridpar.runtime.model import ModelOptions, build_model

    layout = RankLayout(tp=2, cp=1, pp=2, dp=3)
    with fake_world(layout.world_size, layout.rank(pp=0)):
        mesh = Mesh.build(layout)
        chunks = build_model(PRESETS["tiny"], mesh, ModelOptions(seq_len=32, dtype=torch.bfloat16))
        counted = count_stage(chunks, Stage(0, 2, True, False), zero_stage, mesh.size("dp_cp"))
        engine = StageEngine(chunks, mesh, OptimConfig(), zero_stage, micro_batch=1, grad_accum=1, bf16=True,
                             overlap_grad_reduce=False, overlap_param_gather=False)
        opt = engine.engine.optimizer
        flat = [t.numel() * t.element_size() for t in opt.bit16_groups_flat]
        masters = [t.numel() * t.element_size() for t in opt.single_partition_of_fp32_groups]
        for master in opt.single_partition_of_fp32_groups:  # AdamW creates its moments at its first step
            master.grad = torch.zeros_like(master)
        opt.optimizer.step()
        states = [v.numel() * v.element_size() for s in opt.optimizer.state.values() for k, v in s.items()
                  if torch.is_tensor(v) and k != "step"]
        mesh.destroy()
    return {"counted": {"weights": counted.weights - counted.extra_bytes, "optimizer": counted.optimizer,
                        "partitions": list(counted.partitions)},
            "deepspeed": {"weights": sum(flat), "optimizer": sum(masters) + sum(states),
                          "partitions": [int(x) for x in opt.partition_size]},
            "groups": list(counted.groups)}


if __name__ == "__main__":
    os.environ.setdefault("LOCAL_RANK", "0")  # DeepSpeed asks for it; no launcher started this process
    print(json.dumps(main(int(sys.argv[1]))))
