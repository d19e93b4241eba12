#!/usr/bin/env bash
# One-time set-up on a fresh machine: a virtualenv in .venv with the pinned stack.
# torch goes first: a bare torch requirement would pull a multi-GB CUDA build where none is wanted.
# Where `nvidia-smi -L` lists a GPU, torch must be a CUDA build that sees it (an existing CPU build is
# replaced, from HYBRIDPAR_TORCH_INDEX, default PyPI, whose Linux wheels are CUDA builds); elsewhere the
# CPU build. Any pip failure stops the script with pip's own message and a non-zero exit.
# Re-running is cheap: pip finds everything satisfied and installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=2.13.0
PY=.venv/bin/python

fail() { echo "scripts/setup.sh: error: $*" >&2; exit 1; }

pip_install() {  # pip's output is shown only when it fails (it prints setuptools banners otherwise)
    local log
    log=$(mktemp)
    if ! "$PY" -m pip install -q --disable-pip-version-check "$@" >"$log" 2>&1; then
        grep -v "^WARNING: Location" "$log" >&2 || true
        rm -f "$log"
        fail "pip install $* failed (pip's output above)"
    fi
    rm -f "$log"
}

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU "; }

torch_build() {  # cuda | cpu | none
    "$PY" -c "import torch; print('cuda' if torch.version.cuda else 'cpu')" 2>/dev/null || echo none
}

if [ ! -x "$PY" ]; then
    python3 -m venv .venv || fail "python3 -m venv .venv failed"
    pip_install --upgrade pip
fi
if has_gpu; then
    if [ "$(torch_build)" != cuda ]; then
        pip_install --force-reinstall --index-url "${HYBRIDPAR_TORCH_INDEX:-https://pypi.org/simple}" "torch==$TORCH_VERSION"
    fi
    "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" \
        || fail "this machine has a GPU (nvidia-smi) but torch $TORCH_VERSION in .venv cannot use it; set HYBRIDPAR_TORCH_INDEX to a CUDA wheel index that matches the driver, delete .venv and re-run"
elif [ "$(torch_build)" = none ]; then
    pip_install "torch==$TORCH_VERSION"
fi
pip_install -r requirements.txt
# Checked from / so that the repository's own folders do not stand in for the installed packages.
root=$PWD
if ! { [ -x .venv/bin/hybridpar ] && (cd / && "$root/$PY" -c "import hybridpar.topology, hybridpar.benchmarks.cli") >/dev/null 2>&1; }; then
    pip_install --no-deps -e .
fi
