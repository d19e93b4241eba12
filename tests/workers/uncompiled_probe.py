"""One process for tests/integration/test_rank_start.py: what a CPU rank's start imports and binds once
hybridpar.compat.cpu has imported the libraries uncompiled. Prints one JSON line."""
from __future__ import annotations

import json
import sys

import torch

from hybridpar.launch.local import init_distributed, shutdown


def main() -> None:
    init_distributed()  # imports megatron-core and DeepSpeed's Muon module with torch.compile off
    import deepspeed.runtime.zero.stage_1_and_2  # noqa: F401  (what the rank imports next)
    import megatron.core.jit
    from deepspeed.runtime.zero.muon.original_muon import muon_update
    from megatron.core.fusions.fused_bias_geglu import bias_geglu

    import hybridpar.runtime.job  # noqa: F401
    import hybridpar.runtime.loop  # noqa: F401

    def compiled(fn) -> bool:
        return hasattr(fn, "_torchdynamo_orig_callable")

    print(json.dumps({
        "inductor_loaded": "torch._inductor.compile_fx" in sys.modules,
        "torch_compile_restored": torch.compile.__module__ == "torch" and torch.compile.__name__ == "compile",
        "jit_fuser_identity": megatron.core.jit.jit_fuser(len) is len,
        "megatron_fusion_compiled": compiled(bias_geglu),
        "deepspeed_muon_compiled": compiled(muon_update),
    }))
    shutdown(barrier=False)


if __name__ == "__main__":
    main()
