#!/usr/bin/env bash
# One-time set-up on a fresh machine: a virtualenv in .venv with the pinned stack.
# torch goes first: a bare torch requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import torch, deepspeed, megatron.core, einops, yaml, tqdm, matplotlib, pytest, hybridpar, topology" >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q torch==2.13.0
  .venv/bin/python -m pip install -q -r requirements.txt
  .venv/bin/python -m pip install -q --no-deps -e .
fi
