"""One process for tests/integration/test_device_strict.py: which uses of a tensor created without a device
fail under strict device mode (hybridpar/compat/cpu.py). Prints one JSON line."""
from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from hybridpar.launch.local import init_distributed, shutdown


def _outcome(case) -> str:
    try:
        case()
        return "no error"
    except Exception as err:  # noqa: BLE001 - the kind of error is the result
        return type(err).__name__


def main() -> None:
    init_distributed()
    cpu = torch.device("cpu")
    weight = torch.randn(10, 4, device=cpu)
    ids = torch.tensor([[1, 2]])  # no device: the bug a GPU run would hit
    cases = {
        "embedding": lambda: F.embedding(ids, weight),
        "index": lambda: weight[ids],
        "matmul": lambda: weight @ torch.ones(4, 4),
        "add": lambda: weight + torch.ones(4),
        "cat": lambda: torch.cat([weight, torch.zeros(1, 4)]),
        "to_device": lambda: torch.ones(3).to(cpu),
        "item": lambda: torch.ones(2).sum().item(),
        "old_rmsnorm": lambda: F.rms_norm(weight, (4,), torch.nn.Parameter(torch.ones(4))),
        "scalar_is_host": lambda: (weight * torch.tensor(2.0)).sum().item(),  # a CPU scalar, as on a GPU
    }
    out = {"default_device": str(torch.get_default_device()), "ids_device": str(ids.device)}
    out.update({name: _outcome(case) for name, case in cases.items()})
    out["explicit"] = float((weight @ torch.ones(4, 4, device=cpu)).sum() * 0) == 0.0
    shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
