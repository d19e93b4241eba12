#!/usr/bin/env bash
# One-time set-up on a fresh machine: a virtualenv in .venv with the pinned stack.
# torch goes first: a bare torch requirement would pull a multi-GB CUDA build.
# Re-running is cheap: pip finds everything satisfied and installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
fi
pip_install() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
.venv/bin/python -c "import torch" >/dev/null 2>&1 || pip_install torch==2.13.0
pip_install -r requirements.txt
# Checked from / so that the repository's own folders do not stand in for the installed packages.
root=$PWD
[ -x .venv/bin/hybridpar ] && (cd / && "$root/.venv/bin/python" -c "import hybridpar, topology, benchmarks") >/dev/null 2>&1 \
  || pip_install --no-deps -e .
