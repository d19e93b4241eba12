"""Every random generator a rank uses, as plain tensors and numbers (weights_only-loadable)."""
from __future__ import annotations

import random

import torch


def capture() -> dict:
    import numpy as np

    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64, device="cpu"), "gauss": gauss},
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "megatron": _megatron_tracker_states(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict) -> None:
    import numpy as np

    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["internal"].tolist()), py["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype("uint32"), n["pos"], n["has_gauss"], n["cached"]))
    if state.get("megatron"):
        from megatron.core.tensor_parallel import random as mrandom

        mrandom.get_cuda_rng_tracker().set_states(dict(state["megatron"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _megatron_tracker_states() -> dict:
    try:
        from megatron.core.tensor_parallel import random as mrandom

        return dict(mrandom.get_cuda_rng_tracker().get_states())
    except Exception:  # noqa: BLE001 - no tracker yet (tests without a model)
        return {}
