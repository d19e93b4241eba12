"""The direction of dependencies, checked on the code's own imports (AST, no import executed).

- the planner (topology/, hybridpar.topology) imports nothing of hybridpar's runtime, nor torch,
  deepspeed or megatron;
- the config layer (hybridpar/config/) imports no runtime module (runtime, zero, launch,
  checkpoint, data, observe, reliability, compat, cli) and no torch, deepspeed or megatron;
- nothing in hybridpar/ or topology/ imports the benchmarks (they plug a subcommand in through
  an entry point instead);
- no library module names a path under tests/;
- runtime modules get their process groups from the Mesh: megatron's parallel_state (its
  module globals) is read only in runtime/mesh.py, which builds the groups, and in compat/.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "deepspeed", "megatron", "transformers", "safetensors")
RUNTIME = tuple(f"hybridpar.{p}" for p in ("runtime", "zero", "launch", "checkpoint", "data", "observe",
                                           "reliability", "compat", "cli"))


def _python_files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path) -> list[str]:
    """Every module an import statement in ``path`` names (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1]) if path.is_relative_to(ROOT) else ""
    if package.startswith("topology"):
        package = "hybridpar." + package
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.append(module)
            names += [f"{module}.{a.name}" for a in node.names]  # `from pkg import module`
    return names


def _violations(files, forbidden) -> list[str]:
    return [f"{p.name} imports {name}" for p in files for name in _imports(p)
            if any(name == f or name.startswith(f + ".") for f in forbidden)]


def test_the_planner_imports_no_runtime_and_no_heavy_package():
    assert _violations(_python_files("topology"), RUNTIME + HEAVY) == []


def test_the_config_layer_imports_no_runtime_module():
    assert _violations(_python_files("hybridpar/config"), RUNTIME + HEAVY) == []


def test_nothing_in_the_library_imports_the_benchmarks():
    files = _python_files("hybridpar") + _python_files("topology")
    assert _violations(files, ("benchmarks", "hybridpar.benchmarks")) == []


def test_no_library_module_reads_files_under_tests():
    pattern = re.compile(r"""["']tests["']|["']tests/""")
    files = _python_files("hybridpar") + _python_files("topology") + _python_files("benchmarks")
    assert [str(p.relative_to(ROOT)) for p in files if pattern.search(p.read_text())] == []


def test_runtime_modules_take_their_groups_from_the_mesh():
    allowed = {ROOT / "hybridpar" / "runtime" / "mesh.py"} | set(_python_files("hybridpar/compat"))
    files = [p for p in _python_files("hybridpar") if p not in allowed]
    assert _violations(files, ("megatron.core.parallel_state",)) == []


def test_the_rules_catch_a_planted_violation(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import json\nfrom hybridpar.runtime.mesh import Mesh\nfrom megatron.core import parallel_state\n")
    assert _violations([planted], RUNTIME + HEAVY) == ["planted.py imports hybridpar.runtime.mesh",
                                                      "planted.py imports hybridpar.runtime.mesh.Mesh",
                                                      "planted.py imports megatron.core",
                                                      "planted.py imports megatron.core.parallel_state"]
