#!/usr/bin/env bash
# Prepare, on a machine with pip access, what the lent GPU machine lacks (it has python3.12 with a
# CUDA torch but no network): wheels for DeepSpeed, megatron-core and their missing dependencies,
# in .whl/ (git-ignored through .git/info/exclude). Then run scripts/gpu_session.sh there with the
# device tool, carrying .whl:  run(command="bash scripts/gpu_session.sh", carry=[".whl"], timeout_s=600)
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
    -d .whl megatron-core==0.16.1 hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
    typing-inspection==0.4.5 typing-extensions==4.16.0
# DeepSpeed publishes no wheel: build its pure-Python one (ops are JIT-built on the GPU machine).
DS_BUILD_OPS=0 .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w .whl deepspeed==0.19.8
# hybridpar itself, installed there from its own wheel (the repository's folders are not its package layout).
rm -f .whl/hybridpar-*.whl
.venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w .whl .
ls -la .whl
du -sh .whl
