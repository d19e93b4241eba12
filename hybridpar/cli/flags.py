"""Turning parsed flags back into a command line (what `--nproc N` hands to each rank)."""
from __future__ import annotations


def flags_argv(args, keys) -> list[str]:
    """``--key value`` for every key in ``keys`` that ``args`` has set (underscores become dashes)."""
    out = []
    for key in keys:
        value = getattr(args, key, None)
        if value is not None:
            out += [f"--{key.replace('_', '-')}", str(value)]
    return out
