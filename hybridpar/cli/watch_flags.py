"""``hybridpar train``'s flags for what the user watches: the per-step monitor and the final sample.

- ``--sample-prompt TEXT``, ``--sample-tokens N``: override the recipe's ``generate:`` section
  (``hybridpar.recipe.GenerateSection``); N > 0 prints a sample of the trained model after the
  last step and writes OUT/sample.txt (hybridpar.generate).
- ``--progress``/``--no-progress``: force the rank-0 tqdm bar on or off (default: on when stdout
  is a terminal). Per-step FLOP/s, MFU and the planner's predicted step time are always logged
  (hybridpar.metrics).
- ``--profile-steps A-B`` (or ``N``), ``--profile-ranks R,...|all``: a torch.profiler trace of those
  steps on those ranks (default rank 0) into OUT/profile/ (hybridpar/observe/profile.py).
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
    p.add_argument("--profile-steps", metavar="A-B",
                   help="torch.profiler trace of steps A to B (or one step N) into OUT/profile/, for chrome://tracing")
    p.add_argument("--profile-ranks", metavar="R,...|all", help="the ranks --profile-steps traces (default 0)")


def profile_settings(args, steps: int, world: int):
    """The ProfileSettings of --profile-steps/--profile-ranks for a run of ``steps`` steps on ``world`` ranks."""
    from hybridpar.config.run import ProfileSettings

    text, ranks_text = getattr(args, "profile_steps", None), getattr(args, "profile_ranks", None)
    if text is None:
        if ranks_text is not None:
            raise UsageError("--profile-ranks chooses the ranks --profile-steps traces: add --profile-steps A-B")
        return ProfileSettings()
    first, _, last = text.partition("-")
    try:
        first, last = int(first), int(last or first)
    except ValueError:
        raise UsageError(f"--profile-steps takes a step N or a range A-B (e.g. 5-7), got {text!r}") from None
    if not 1 <= first <= last <= steps:
        raise UsageError(f"--profile-steps {text}: the steps must run from 1 to the run's last step {steps}, first "
                         "to last (e.g. 5-7)")
    ranks = [0]
    if ranks_text is not None:
        if ranks_text == "all":
            ranks = []
        else:
            try:
                ranks = sorted({int(r) for r in ranks_text.split(",")})
            except ValueError:
                raise UsageError(f"--profile-ranks takes global ranks (e.g. 0,7) or all, got {ranks_text!r}") from None
            outside = [r for r in ranks if not 0 <= r < world]
            if outside:
                raise UsageError(f"--profile-ranks {outside[0]} is outside the world of {world} ranks (0..{world - 1})")
    return ProfileSettings(first, last, ranks)


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
