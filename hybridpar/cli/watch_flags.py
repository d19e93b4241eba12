"""``hybridpar train``'s flags for what the user watches: the per-step monitor and the final sample.

- ``--sample-prompt TEXT``, ``--sample-tokens N``: override the recipe's ``generate:`` section
  (``hybridpar.recipe.GenerateSection``); N > 0 prints a sample of the trained model after the
  last step and writes OUT/sample.txt (hybridpar.generate).
- ``--progress``/``--no-progress``: force the rank-0 tqdm bar on or off (default: on when stdout
  is a terminal). Per-step FLOP/s, MFU and the planner's predicted step time are always logged
  (hybridpar.metrics).
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from hybridpar.errors import UsageError


def add_arguments(p) -> None:
    p.add_argument("--sample-prompt", help="prompt for the sample generated after the last step (recipe generate.prompt)")
    p.add_argument("--sample-tokens", type=int, help="tokens to generate after the last step; 0: no sample (recipe generate.tokens)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="rank 0's progress bar (default: only when stdout is a terminal)")


def apply(recipe, args):
    tokens = getattr(args, "sample_tokens", None)
    if tokens is not None and tokens < 0:
        raise UsageError(f"--sample-tokens must be >= 0, got {tokens}")
    changes = {}
    if getattr(args, "sample_prompt", None) is not None:
        changes["prompt"] = args.sample_prompt
    if tokens is not None:
        changes["tokens"] = tokens
    return replace(recipe, generate=replace(recipe.generate, **changes)) if changes else recipe
