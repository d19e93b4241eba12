"""Import megatron-core's dataset modules without its optimizer's start-up warnings.

Importing any megatron.core module runs megatron/core/__init__.py, which warns four times that
Transformer Engine and Apex are missing; neither matters for data, and the warnings would bury
the one-line errors of `hybridpar data`.
"""
from __future__ import annotations

import importlib
import warnings


def import_megatron(module: str):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Transformer Engine and Apex", category=UserWarning)
        return importlib.import_module(module)
