#!/usr/bin/env bash
# The GPU checks, in one bounded command for a lent GPU machine (no network there; python3 3.12 with a
# CUDA torch). Prepare here first: `bash scripts/gpu_kit.sh` (wheels in .whl/), then with the device
# tool: run(command="bash scripts/gpu_session.sh", carry=[".whl"], timeout_s=600). Results land in $OUT.
# The whole session ends within BUDGET_S (560 s) whatever happens: every step runs under its own
# timeout, cut further to what is left of the budget, and $OUT/session.json records each step's exit
# code and seconds as soon as it ends, so what was measured comes back even when a step fails. Logs and
# results go to $OUT/work/ and end up in $OUT/session.tgz (the device tool brings back 8 files at most).
#  setup       the wheels, and the versions of torch, DeepSpeed and megatron-core
#  kernels     `hybridpar bench kernels`: the GPU's achievable matmul and attention fractions (a GPU file)
#  layer_kernels `hybridpar bench layer_kernels`: every layer GEMM, attention shape, streaming op and kernel
#              boundary the planner costs, timed, beside the planner's prediction
#  attention   torch SDPA (FlashAttention) vs megatron's attention on the GPU, fp32 and bf16; which kernels the
#              context-parallel path's chunk attention runs (Llama 3 70B's TP4 CP2 shape), and its rate
#  train_bf16  the main job's recipe on one GPU in bf16 (NCCL, DeepSpeed bf16 ZeRO-1): checkpoint saves
#              through pinned host memory, the held-out loss, a CUDA profile of steps 5-6, the sample
#              after the last step on rank 0's CPU
#  init        `hybridpar bench init`: the 8B one-node recipe's weights drawn per shard on the GPU
#  bench_gpu   `hybridpar bench gpu`: the ~1B model's tokens/s, TFLOP/s and MFU against the planner
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hybridpar-gpu}
BUDGET_S=${BUDGET_S:-560}
WORK=$OUT/work
mkdir -p "$WORK"
START=$SECONDS
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore DS_BUILD_OPS=0
status=0
records=()

record() {  # name, exit code, seconds: rewrite $OUT/session.json with every step so far
    records+=("{\"step\": \"$1\", \"exit\": $2, \"seconds\": $3}")
    local IFS=,
    printf '{"budget_s": %s, "elapsed_s": %s, "steps": [%s]}\n' "$BUDGET_S" "$((SECONDS - START))" "${records[*]}" \
        > "$OUT/session.json.tmp" && mv "$OUT/session.json.tmp" "$OUT/session.json"
}

step() {  # name, seconds, command...
    local name=$1 limit=$2; shift 2
    local left=$((BUDGET_S - (SECONDS - START) - 5))
    if [ "$left" -lt 10 ]; then
        echo "=== $name: skipped, ${left} s of the budget left"
        record "$name" -1 0
        status=1
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== $name (at most $limit s)"
    local t0=$SECONDS
    timeout --kill-after=5 "$limit" "$@" > "$WORK/$name.log" 2>&1
    local rc=$?
    tail -n 20 "$WORK/$name.log"
    echo "=== $name: exit $rc after $((SECONDS - t0)) s"
    record "$name" "$rc" "$((SECONDS - t0))"
    [ $rc -eq 0 ] || status=1
}

step setup 60 bash -c 'python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && nvidia-smi -L && python3 -c "import torch, deepspeed, megatron.core as m; print(\"torch\", torch.__version__, \"deepspeed\", deepspeed.__version__, \"megatron-core\", m.__version__, torch.cuda.get_device_name())"'
# hybridpar runs installed from its wheel; -P keeps the repository root (whose hybridpar/ folder is the
# runtime alone, not the installed package) off the import path (.whl, scripts/gpu_kit.sh): its benchmarks write their results there
RESULTS=/tmp/site/hybridpar/benchmarks/results
step kernels 70 python3 -P -m hybridpar bench kernels --seconds 0.1 --soak 20 --out "$WORK/gpu-measured.yaml"
cp $RESULTS/kernels.json "$WORK/" 2>/dev/null
step layer_kernels 75 python3 -P -m hybridpar bench layer_kernels
cp $RESULTS/layer_kernels.json "$WORK/" 2>/dev/null
step attention 45 python3 tests/workers/attention_worker.py "$WORK/attention.json"
step train_bf16 90 python3 -P -m hybridpar train --recipe recipes/default.yaml --nproc 1 --tp 1 --pp 1 --dp 1 --steps 20 \
    --out "$WORK/train_bf16" --save-dir "$WORK/train_bf16/ckpt" --save-every 10 --no-progress --eval-every 10 \
    --profile-steps 5-6
rm -rf "$WORK/train_bf16/ckpt"  # the checkpoint files are large; their saves are in the log
step init 45 python3 -P -m hybridpar bench init --recipe recipes/llama3-8b-1node.yaml --gpus 8 --repeats 3
cp $RESULTS/init.json "$WORK/" 2>/dev/null
step bench_gpu 150 python3 -P -m hybridpar bench gpu --steps 20 --warmup 5
cp $RESULTS/gpu.json "$WORK/" 2>/dev/null
tar -czf "$OUT/session.tgz" -C "$OUT" work && rm -rf "$WORK"
echo "session: $((SECONDS - START)) s of $BUDGET_S"
exit $status
