"""kernels: this GPU's achievable matmul and causal-attention rates, written as a GPU file for `hybridpar plan --gpu`.

`hybridpar bench kernels [--out my-gpu.yaml] [--sizes 4096,8192,12288,16384] [--seconds 0.2]
[--soak 60] [--seq-len 8192] [--heads 32] [--head-dim 128]` on a machine with a CUDA GPU (it exits 2 without
one). The planner's two least certain numbers are how close a GPU's GEMMs and its attention kernel
come to the dense bf16 peak (topology/hardware.py gemm_fraction, attention_fraction): this
measures both on the GPU at hand, in the planner's own FLOP counts, and writes them as a GPU file
(`base:` the catalogue entry of this GPU, the fractions) that `hybridpar plan --gpu FILE` reads.
* matmul: bf16 A (M x K) @ B (K x N) for every M, N, K of --sizes, --seconds each after a warm-up
  (the fastest is the burst rate, MAMF, as ml-engineering's mamf-finder.py measures it: the file's
  gemm_fraction); then the fastest shape runs --soak seconds without pause, and the median over the
  second half, once clocks and temperature have settled under the power limit, is the sustained
  rate; sustained / burst is the file's sustained_clock (what a training step sees).
* attention: torch SDPA (FlashAttention on CUDA), causal, batch 1, forward and backward, counted
  as the planner counts it (topology/flops.py causal_attention_flops, backward
  FLASH_BACKWARD_RATIO x the forward).
Also writes benchmarks/results/kernels.json (every shape's rate, device, versions).
To see what a full node sustains, run one per GPU at once (CUDA_VISIBLE_DEVICES=i, --out per GPU):
the siblings' power and heat lower each GPU's sustained clock, and the slowest GPU sets the step.
"""
from __future__ import annotations

import itertools
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from hybridpar.topology.flops import causal_attention_flops
from hybridpar.topology.kernels import FLASH_BACKWARD_RATIO
from hybridpar.topology.hardware import get_gpu

from hybridpar.benchmarks._cli import BenchParser, int_list, positive_float, positive_int
from hybridpar.benchmarks.results_io import write_result
from hybridpar.files import head_of, replacing

DEFAULT_SIZES = (4096, 8192, 12288, 16384)


def seconds_per_call(fn, seconds: float, synchronize, settle: float = 0.0) -> float:
    """Median seconds of one call of fn over blocks of calls filling about ``seconds``, after a
    warm-up call; ``synchronize`` waits for the device (a no-op on CPU). ``settle``: the leading
    fraction of the blocks left out (a soak's first part, before clocks and temperature settle)."""
    fn()
    synchronize()
    start = time.perf_counter()
    fn()
    synchronize()
    per_call = max(time.perf_counter() - start, 1e-7)
    block = max(1, int(seconds / 5 / per_call))  # about five blocks in ``seconds``, more when settling
    if settle:
        block = max(1, block // 4)
    samples = []
    deadline = time.perf_counter() + seconds
    while len(samples) < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(block):
            fn()
        synchronize()
        samples.append((time.perf_counter() - start) / block)
    return statistics.median(samples[int(len(samples) * settle):])


def matmul_tflops(m: int, k: int, n: int, device: str, dtype, seconds: float, settle: float = 0.0) -> float:
    import torch

    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    c = torch.empty(m, n, device=device, dtype=dtype)
    t = seconds_per_call(lambda: torch.mm(a, b, out=c), seconds, _synchronizer(device), settle)
    return 2.0 * m * k * n / t / 1e12


def attention_tflops(seq: int, heads: int, head_dim: int, device: str, dtype, seconds: float) -> float:
    """Causal SDPA forward + backward, in the planner's FLOPs per second."""
    import torch
    import torch.nn.functional as F

    q, k, v = (torch.randn(1, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, heads, seq, head_dim, device=device, dtype=dtype)

    def step():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)
        q.grad = k.grad = v.grad = None

    t = seconds_per_call(step, seconds, _synchronizer(device))
    return causal_attention_flops(1, seq, seq, heads, head_dim) * (1 + FLASH_BACKWARD_RATIO) / t / 1e12


def _synchronizer(device: str):
    import torch

    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def sweep(sizes, device: str, dtype, seconds: float) -> list[dict]:
    """Every (M, K, N) of sizes and its rate, fastest first."""
    rows = [{"m": m, "k": k, "n": n, "tflops": matmul_tflops(m, k, n, device, dtype, seconds)}
            for m, k, n in itertools.product(sizes, repeat=3)]
    return sorted(rows, key=lambda r: -r["tflops"])


def gpu_file_text(base: str, gemm_fraction: float, attention_fraction: float, sustained_clock: float,
                  comment: str) -> str:
    """A GPU file (topology.hardware.load_gpu): the catalogue GPU as measured."""
    return (f"# {comment}\nbase: {base}\ngemm_fraction: {gemm_fraction:.3f}\n"
            f"attention_fraction: {attention_fraction:.3f}\nsustained_clock: {sustained_clock:.3f}\n")


MARKER = "# measured by `hybridpar bench kernels`"


def _written_here(path: Path) -> bool:
    """Whether the file at path is a GPU file this benchmark wrote (its first line, gpu_file_text's comment)."""
    return head_of(path, len(MARKER.encode())) == MARKER.encode()


def fraction(tflops: float, peak: float, what: str) -> float:
    """Measured rate over the catalogue peak; above 1 means the catalogue's peak is low for this
    part, and the file keeps 1 (the planner's ceiling) and says so."""
    if tflops > peak:
        print(f"note: {what} measured {tflops:.0f} TFLOP/s, above the catalogue's {peak:.0f}; written as 1.0",
              file=sys.stderr)
    return min(1.0, tflops / peak)


def main(argv=None) -> int:
    p = BenchParser("kernels", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu-measured.yaml", help="the GPU file to write (default gpu-measured.yaml)")
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                   help="matmul dimensions to sweep, comma-separated (default 4096,8192,12288,16384)")
    p.add_argument("--seconds", type=positive_float, default=0.2, help="timing per shape (default 0.2)")
    p.add_argument("--soak", type=positive_float, default=60.0,
                   help="seconds the fastest shape then runs without pause; the rate over its second half is "
                   "the sustained one written to the file (default 60)")
    p.add_argument("--seq-len", type=positive_int, default=8192)
    p.add_argument("--heads", type=positive_int, default=32)
    p.add_argument("--head-dim", type=positive_int, default=128)
    args = p.parse_args(argv)
    sizes = int_list(p, "--sizes", args.sizes)
    if min(sizes) < 1:
        p.error(f"--sizes {args.sizes}: matmul dimensions must be positive integers")
    out = Path(args.out)
    if out.suffix not in (".yaml", ".yml"):
        p.error(f"--out {args.out}: the GPU file is YAML; name it .yaml or .yml")
    if not out.parent.is_dir():
        p.error(f"--out {args.out}: folder {out.parent} does not exist")
    if out.exists() and not _written_here(out):
        p.error(f"--out {args.out} exists and was not written by this benchmark; choose another name")
    from hybridpar.benchmarks.gpu import this_gpu

    found = this_gpu("kernels")
    if found is None:
        return 2
    import torch

    props, base = found
    peak = get_gpu(base).peak_tflops("bf16")
    rows = sweep(sizes, "cuda", torch.bfloat16, args.seconds)
    attention = attention_tflops(args.seq_len, args.heads, args.head_dim, "cuda", torch.bfloat16, args.seconds * 5)
    best = rows[0]
    sustained = matmul_tflops(best["m"], best["k"], best["n"], "cuda", torch.bfloat16, args.soak, settle=0.5)
    gemm_f = fraction(best["tflops"], peak, "matmul")
    sustained_clock = min(1.0, sustained / best["tflops"])
    attention_f = fraction(attention, peak, "attention")
    date = datetime.now(timezone.utc).date().isoformat()
    comment = (f"{MARKER[2:]} on {props.name}, {date}: matmul {best['m']}x{best['k']}x{best['n']} "
               f"at {best['tflops']:.0f} TFLOP/s in a burst, {sustained:.0f} sustained over {args.soak:g} s, causal attention (seq {args.seq_len}, {args.heads} heads of "
               f"{args.head_dim}) at {attention:.0f}, peak {peak:.0f}")
    with replacing(out) as f:
        f.write(gpu_file_text(base, gemm_f, attention_f, sustained_clock, comment))
    print(comment)
    print(f"wrote {out}: gemm_fraction {gemm_f:.3f}, attention_fraction {attention_f:.3f}, sustained_clock "
          f"{sustained_clock:.3f} (catalogue: {get_gpu(base).gemm_fraction}, {get_gpu(base).attention_fraction}, "
          f"{get_gpu(base).sustained_clock}); "
          f"use it with `hybridpar plan --gpu {out}`")
    write_result("kernels", {"device": props.name, "catalogue_gpu": base, "peak_bf16_tflops": peak,
                             "matmul": rows, "matmul_sustained_tflops": sustained, "soak_s": args.soak,
                             "attention_tflops": attention, "gemm_fraction": gemm_f,
                             "attention_fraction": attention_f, "sustained_clock": sustained_clock,
                             "gpu_file": str(out)},
                 command=("hybridpar bench kernels " + " ".join(argv or [])).strip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
