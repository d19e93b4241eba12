#!/usr/bin/env bash
# The GPU checks, in one bounded command for the lent GPU machine (no network there; python3 3.12 with
# a CUDA torch). Prepare here first: `bash scripts/gpu_kit.sh` (wheels in .whl/), then with the device
# tool: run(command="bash scripts/gpu_session.sh", carry=[".whl"], timeout_s=600). Results land in $OUT.
#  1. torch SDPA (FlashAttention) vs megatron's attention on the GPU, fp32 and bf16 (tests/test_attention.py's worker)
#  2. `hybridpar train` of the tiny recipe in bf16 on one GPU (NCCL, DeepSpeed bf16 ZeRO-1): runs, loss falls
#  3. `hybridpar bench gpu`: the ~1B model's tokens/s, TFLOP/s, MFU vs the planner (issue 5 §6, target 40%)
#  0. first, `hybridpar bench kernels`: the GPU's achievable matmul and attention fractions as a GPU file
#     (the planner's compute ceiling, measured; README "kernels")
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hybridpar-gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore DS_BUILD_OPS=0
nvidia-smi -L
python3 -c "import torch, deepspeed, megatron.core as m; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'megatron-core', m.__version__, torch.cuda.get_device_name())" || exit 1
status=0
step() {  # name, seconds, command...
    local name=$1 limit=$2; shift 2
    echo "=== $name"
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$OUT/$name.log"
    echo "=== $name: exit $rc after $((SECONDS - t0)) s"
    [ $rc -eq 0 ] || status=1
}
step kernels 90 python3 -m hybridpar bench kernels --seconds 0.1 --soak 30 --out "$OUT/gpu-measured.yaml"
[ -f "$OUT/gpu-measured.yaml" ] && cat "$OUT/gpu-measured.yaml"
cp benchmarks/results/kernels.json "$OUT/" 2>/dev/null
step attention 120 python3 tests/workers/attention_worker.py "$OUT/attention.json"
[ -f "$OUT/attention.json" ] && cat "$OUT/attention.json"
sed 's/precision: auto.*/precision: bf16/' recipes/tiny.yaml > /tmp/tiny-bf16.yaml
step train_bf16 120 python3 -m hybridpar train --recipe /tmp/tiny-bf16.yaml --nproc 1 --tp 1 --pp 1 --dp 1 --steps 20 \
    --out "$OUT/train_bf16" --no-progress
step bench_gpu 260 python3 -m hybridpar bench gpu
cp benchmarks/results/gpu.json "$OUT/" 2>/dev/null
exit $status
