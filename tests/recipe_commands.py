"""The plan command a Llama 3 recipe states in a comment (`hybridpar plan --recipe recipes/X.yaml
--gpus N [pins]`): the GPU count and pins it was planned for, read by tests/unit/test_recipes.py and
tests/integration/test_memory_audit.py."""
from __future__ import annotations

import re
from pathlib import Path

COMMAND = re.compile(r"`hybridpar plan --recipe (recipes/[\w.-]+\.yaml) --gpus (\d+)((?: --[\w-]+ [\w.-]+)*)`")


def stated_command(path: Path) -> tuple[int, list[str]]:
    """(GPUs, pins) of the one plan command the recipe at ``path`` states."""
    found = COMMAND.findall(path.read_text())
    assert len(found) == 1, f"{path.name} must state the one plan command that chose its layout"
    file, gpus, pins = found[0]
    assert file == f"recipes/{path.name}"
    return int(gpus), pins.split()
