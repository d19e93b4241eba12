"""``hybridpar train``'s reliability flags: --timeout-s, --check-replicas, --on-drift.

The recipe may set the same things (``reliability: {timeout_s: 120, check_replicas: 50,
on_drift: stop}``, ``hybridpar.recipe.ReliabilitySection``); flags win. ``timeout_s`` is the
process-group timeout: a collective whose peers stopped answering fails after that long
instead of hanging (a peer that died outright is usually noticed at once, see docs/training.md
"Reliability"). Fault injection for tests (``HYBRIDPAR_FAULT``) is in ``hybridpar.faults``.
"""
from __future__ import annotations

from dataclasses import replace

from hybridpar.errors import UsageError

FLAGS = ("timeout_s", "check_replicas", "on_drift", "tolerate_replica_loss", "rejoin_after_s")


def add_arguments(p) -> None:
    p.add_argument("--timeout-s", type=int, help="process-group timeout in seconds: a stuck collective fails after this (default 600)")
    p.add_argument("--check-replicas", type=int, metavar="N",
                   help="every N steps, check that all DP replicas hold bit-identical parameters (0: never)")
    p.add_argument("--on-drift", choices=("stop", "warn"), help="when replicas differ: stop (exit 3, default) or warn and go on")
    p.add_argument("--tolerate-replica-loss", action="store_true", default=None,
                   help="when a rank dies, drop its DP replica and go on with the others (docs/training.md)")
    p.add_argument("--rejoin-after-s", type=float, metavar="SECONDS",
                   help="with --tolerate-replica-loss: start a lost replica again after SECONDS; it joins at a step boundary")


def apply(recipe, args):
    for key in ("timeout_s", "check_replicas"):
        value = getattr(args, key, None)
        if value is not None and (value < 0 or (value == 0 and key == "timeout_s")):
            low = "a positive integer" if key == "timeout_s" else ">= 0"
            raise UsageError(f"--{key.replace('_', '-')} must be {low}, got {value}")
    changes = {k: getattr(args, k) for k in FLAGS if getattr(args, k, None) is not None}
    recipe = replace(recipe, reliability=replace(recipe.reliability, **changes)) if changes else recipe
    if getattr(args, "on_drift", None) and not recipe.reliability.check_replicas:
        raise UsageError(f"--on-drift {args.on_drift} says what to do when a replica check finds drift, and this run checks "
                         "none: add --check-replicas N")
    return recipe
