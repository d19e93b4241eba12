"""Whether a checkpoint fits this run: same model (any layout), described in one line."""
from __future__ import annotations

from hybridpar.checkpoint.files import CheckpointError, Manifest

_RANK_KEYS = ("tp", "cp", "pp", "dp", "vpp", "order")  # equal: every rank has the same coordinates


def layout_text(plan: dict) -> str:
    return (f"tp {plan['tp']} x pp {plan['pp']} x dp {plan['dp']}"
            + (f" (vpp {plan['vpp']})" if plan.get("vpp", 1) > 1 else "") + f", ZeRO-{plan['zero_stage']}")


def model_difference(saved: dict, mine: dict) -> list[str]:
    keys = sorted((set(saved) | set(mine)) - {"name"})
    return [f"{k} {saved.get(k)} (checkpoint) vs {mine.get(k)} (this run)" for k in keys if saved.get(k) != mine.get(k)]


def check_compatible(manifest: Manifest, plan, step_dir: str) -> None:
    """Raise CheckpointError when ``step_dir`` holds another model than ``plan``'s."""
    diff = model_difference(manifest.plan["model"], plan.model.to_dict())
    if diff:
        raise CheckpointError(f"checkpoint {step_dir} is of another model: {'; '.join(diff)}")


def same_ranks(manifest: Manifest, plan) -> bool:
    return all(manifest.plan.get(k) == getattr(plan, k) for k in _RANK_KEYS)
