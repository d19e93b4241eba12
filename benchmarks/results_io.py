"""Writing benchmark results: JSON with the command, date, machine and versions, written atomically."""
from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from hybridpar.files import replacing  # the benchmarks' CSV and chart writers take it from here

RESULTS_DIR = Path(__file__).resolve().parent / "results"
_PACKAGES = ("torch", "deepspeed", "megatron-core", "hybridpar")


def environment() -> dict:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "versions": versions,
    }


def write_result(name: str, payload: dict, command: str | None = None, directory: Path = RESULTS_DIR) -> Path:
    """Write ``payload`` plus provenance to ``directory/name.json`` (temp file, then rename)."""
    record = {"benchmark": name, "command": command or " ".join([Path(sys.executable).name, *sys.argv]), **environment(), **payload}
    target = directory / f"{name}.json"
    with replacing(target) as f:
        json.dump(record, f, indent=2, sort_keys=False)
        f.write("\n")
    return target
