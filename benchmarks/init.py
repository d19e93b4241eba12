"""init: time to initialise one rank's weights, shard-only on its device against drawing full tensors.

`hybridpar bench init [--recipe recipes/llama3-8b-1node.yaml] [--gpus 8] [--repeats 3]`: for the
recipe's layout on --gpus GPUs, the first pipeline stage (the largest: it holds the embedding) on TP rank 0, the time to
fill every weight matrix of that rank:
- ``shard``: hybridpar's canonical init (hybridpar/canonical_init.py): each rank hashes only its
  shard's elements, on its device (CUDA when present, else this CPU);
- ``full_then_slice``: what it replaced: each full one-process tensor drawn on the CPU from a
  generator seeded by its name (``torch.randn``, one thread), then the rank's TP slice taken.
A transformer layer's matrices have the same shapes in every layer, so each distinct shape is
timed once (median of --repeats) and multiplied by how many the stage holds; both methods are
timed the same way. Writes benchmarks/results/init.json.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from hybridpar.benchmarks._cli import BenchParser, positive_int
from hybridpar.benchmarks.results_io import write_result

ROOT = Path(__file__).resolve().parents[1]


def stage_matrices(plan, stage) -> list[tuple[str, list[int], int, bool, int]]:
    """(name, full shape, TP split dim, gated, count) of each weight matrix of ``stage``."""
    m = plan.model
    q = m.heads * m.head_dim
    out = [("linear_qkv", [q + 2 * m.kv_heads * m.head_dim, m.hidden], 0, False, stage.layers),
           ("linear_proj", [m.hidden, q], 1, False, stage.layers),
           ("linear_fc1", [m.ffn_hidden * (2 if m.mlp == "swiglu" else 1), m.hidden], 0, m.mlp == "swiglu", stage.layers),
           ("linear_fc2", [m.hidden, m.ffn_hidden], 1, False, stage.layers)]
    if stage.has_embedding:
        out.append(("word_embeddings", [m.vocab, m.hidden], 0, False, 1))
    if stage.has_output and not m.tied_embeddings:
        out.append(("output_layer", [m.vocab, m.hidden], 0, False, 1))
    return out


def _timed(fn, device, repeats: int) -> float:
    import torch

    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> int:
    p = BenchParser("init", description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default=str(ROOT / "recipes" / "llama3-8b-1node.yaml"))
    p.add_argument("--gpus", type=positive_int, default=8, help="the world size the recipe's layout is for")
    p.add_argument("--repeats", type=positive_int, default=3)
    args = p.parse_args(argv)
    from hybridpar.errors import UsageError
    from hybridpar.config.recipe import load_recipe

    try:
        plan = load_recipe(args.recipe).validate(args.gpus).to_plan_unresolved()
    except UsageError as err:
        p.error(str(err))
    import torch

    from hybridpar.runtime.canonical_init import fill_normal_
    from hybridpar.runtime.model import shard_positions
    from hybridpar.topology.stages import stages

    torch.set_num_threads(1)  # one rank's share of a node's cores, as the replaced init ran
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    stage, tp = stages(plan)[0], plan.tp
    rows, totals = [], {"shard": 0.0, "full_then_slice": 0.0}
    for name, full, dim, gated, count in stage_matrices(plan, stage):
        param = SimpleNamespace(tensor_model_parallel=True, partition_dim=dim, _hybridpar_gated=gated)
        positions = shard_positions(param, full[dim], 0, tp, device=device)
        shape = list(full)
        shape[dim] //= tp
        out = torch.empty(shape, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32, device=device)
        shard_s = _timed(lambda: fill_normal_(out, full, {dim: positions}, 0, name, 0.02), device, args.repeats)
        cpu_positions = positions.cpu()

        def full_then_slice():
            gen = torch.Generator().manual_seed(hash(name) % 2**31)
            whole = torch.randn(full, generator=gen, device="cpu")
            out.copy_(whole.index_select(dim, cpu_positions))

        full_s = _timed(full_then_slice, device, args.repeats)
        del out
        rows.append({"tensor": name, "full_shape": full, "tp_split_dim": dim, "count": count,
                     "shard_s": shard_s, "full_then_slice_s": full_s})
        totals["shard"] += count * shard_s
        totals["full_then_slice"] += count * full_s
        print(f"{name:<16} {str(full):<18} x{count:<3} shard {shard_s * 1e3:9.1f} ms   full+slice {full_s * 1e3:9.1f} ms",
              flush=True)
    params = sum(r["count"] * r["full_shape"][0] * r["full_shape"][1] for r in rows) // tp
    print(f"{plan.model.name} stage {stage.name} on TP rank 0 of TP{tp}: {params / 1e9:.2f}B weights in matrices; "
          f"shard-only on {device.type}: {totals['shard']:.1f} s; full tensors on the CPU then sliced: "
          f"{totals['full_then_slice']:.1f} s ({totals['full_then_slice'] / totals['shard']:.1f}x)")
    write_result("init", {"recipe": args.recipe, "model": plan.model.name, "tp": tp, "pp": plan.pp,
                          "stage": stage.name, "device": str(device), "rank_matrix_params": params,
                          "tensors": rows, "seconds": totals,
                          "method": "each distinct shape timed once (median of repeats) x its count in the stage"},
                 command=("hybridpar bench init " + " ".join(argv or [])).strip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
