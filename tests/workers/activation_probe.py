"""One process for tests/integration/test_activation_audit.py: one transformer layer's saved activations
(hybridpar/activation_audit.py) for each case in the JSON list given as argv[1]
([model, tp, seq_len, recompute, cp], ...). Prints one JSON line: a list of results in that order."""
from __future__ import annotations

import json
import sys
import time
import warnings

warnings.filterwarnings("ignore")


def main(cases: list) -> list:
    from hybridpar.topology.models import PRESETS

    from hybridpar.observe.activation_audit import measure

    out = []
    for model, tp, seq, recompute, cp in cases:
        start = time.perf_counter()
        a = measure(PRESETS[model], tp, seq, recompute, cp=cp)
        out.append({"model": model, "tp": tp, "seq_len": seq, "recompute": recompute, "cp": cp, "gpu_bytes": a.gpu_bytes,
                    "cpu_only_bytes": a.cpu_only_bytes, "cpu_bytes": sum(t.cpu_bytes for t in a.tensors),
                    "tensors": len(a.tensors), "seconds": round(time.perf_counter() - start, 1)})
    return out


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
