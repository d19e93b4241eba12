"""hybridpar.compat.{deepspeed,megatron,torch}: every internal of a dependency that hybridpar relies
on, checked against what is installed, and nothing outside hybridpar/compat/ touching them.

One process, no ranks. An upgrade that drops, renames or re-signs an internal fails here with one
line naming the dependency, its version, the internal and what hybridpar does with it, instead
of failing inside a training run.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.metadata
import inspect
import re
from pathlib import Path

import pytest
from packaging.version import Version

from hybridpar.compat import deepspeed as deepspeed_compat
from hybridpar.compat import megatron as megatron_compat
from hybridpar.compat import torch as torch_compat
from hybridpar.compat.declared import ASSIGNED, FIELD, MEMBER, READ, Internal, Reliance

ROOT = Path(__file__).resolve().parents[2]
RELIANCES = [m.RELIES_ON for m in (deepspeed_compat, megatron_compat, torch_compat)]
DEPENDENCIES = ("deepspeed", "megatron", "torch")


# --- checking a declaration against the installed package ---------------------------------------
def _resolve(owner: str):
    module, _, path = owner.partition(":")
    obj = importlib.import_module(module)
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part)
    return obj


def _source(obj) -> str:
    """The source of ``obj``, and of the classes it inherits from in the same package."""
    if not inspect.isclass(obj):
        return inspect.getsource(obj)
    package = obj.__module__.split(".")[0]
    return "\n".join(inspect.getsource(c) for c in obj.__mro__ if c.__module__.split(".")[0] == package)


def _leading_params(fn) -> list[str]:
    names = list(inspect.signature(fn).parameters)
    return names[1:] if names[:1] == ["self"] else names


def problem(reliance: Reliance, internal: Internal) -> str | None:
    """None, or the one line that says what changed."""
    version = importlib.metadata.version(reliance.distribution)
    head = f"{reliance.distribution} {version}: {internal.label}"
    tail = f"; {internal.used_for}"
    try:
        owner = _resolve(internal.owner)
    except (ImportError, AttributeError):
        return f"{reliance.distribution} {version}: {internal.owner.replace(':', '.')} is gone{tail}"
    if internal.kind == MEMBER:
        if not hasattr(owner, internal.name):
            return f"{head} is gone{tail}"
        member = getattr(owner, internal.name)
        if internal.value is not None and member != internal.value:
            return f"{head} is {member!r}, not {internal.value!r}{tail}"
        if internal.params:
            got = _leading_params(member)[:len(internal.params)]
            if got != list(internal.params):
                now, ours = ", ".join(got), ", ".join(internal.params)
                return f"{head} now takes ({now}), where hybridpar passes ({ours}){tail}"
    elif internal.kind == ASSIGNED:
        if not re.search(rf"\.{re.escape(internal.name)}\s*=(?!=)", _source(owner)):
            return f"{head} is no longer set{tail}"
    elif internal.kind == READ:
        if not re.search(rf"\b{re.escape(internal.name)}\b", _source(owner)):
            return f"{head} is no longer used there{tail}"
    elif internal.kind == FIELD:
        if internal.name not in {f.name for f in dataclasses.fields(owner)}:
            return f"{head} is no longer a field{tail}"
    else:
        raise ValueError(f"unknown kind {internal.kind!r}")
    return None


def _cases():
    for reliance in RELIANCES:
        for internal in reliance.internals:
            yield pytest.param(reliance, internal, id=f"{reliance.distribution}:{internal.label}:{internal.kind}")


@pytest.mark.parametrize("reliance", RELIANCES, ids=lambda r: r.distribution)
def test_installed_version_is_in_the_tested_range(reliance):
    version = importlib.metadata.version(reliance.distribution)
    low, high = reliance.tested
    assert Version(low) <= Version(version) < Version(high), (
        f"{reliance.distribution} {version} is outside the range hybridpar was tested with (>={low},<{high}): "
        f"check the internals listed in hybridpar.compat (the other tests here), then widen `tested`")


@pytest.mark.parametrize("reliance,internal", _cases())
def test_every_declared_internal_is_there(reliance, internal):
    message = problem(reliance, internal)
    assert message is None, message


def test_the_check_names_what_changed():
    """The checker itself can fail: a missing member, a changed signature, an unset attribute."""
    fake = Reliance("packaging", ("0", "999"), ())
    version = importlib.metadata.version("packaging")
    gone = Internal("packaging.version:Version", "setup_buckets",
                    "hybridpar.zero.engine defers ZeRO-2's reduction through it")
    assert problem(fake, gone) == (f"packaging {version}: Version.setup_buckets is gone; "
                                   "hybridpar.zero.engine defers ZeRO-2's reduction through it")
    resigned = Internal("packaging.version:Version", "__init__", "x", MEMBER, ("text",))
    assert "now takes (version), where hybridpar passes (text)" in problem(fake, resigned)
    unset = Internal("packaging.version:Version", "_no_such_field", "x", ASSIGNED)
    assert "Version._no_such_field is no longer set" in problem(fake, unset)
    assert problem(fake, Internal("packaging.version:Version", "_epoch", "x", ASSIGNED)) is None
    assert problem(fake, Internal("packaging.version:Version", "__init__", "x", MEMBER, ("version",))) is None


# --- nothing outside compat/ touches them ---------------------------------------------------------
# Names hybridpar also gives its own things (plan.grad_accum, an optimizer's .state, a tensor's
# .numel()): seeing one says nothing about a dependency. The rest are scanned by name anywhere.
GENERIC = {"run", "shutdown", "optimizer", "device", "add", "fork", "reset", "parse_args", "__init__", "start",
           "numel", "grad_accum", "isend", "build_shm_op"}
# Read outside compat on purpose, declared in compat/megatron.py so an upgrade is still named:
ALLOWED = {
    # hybridpar's SDPA attention is a DotProductAttention: it reads what its base class set up
    "runtime/attention.py": {"num_attention_heads_per_partition", "num_query_groups_per_partition",
                             "hidden_size_per_partition", "softmax_scale"},
    # megatron's marks on parameters, read like megatron's own tensor_model_parallel/partition_dim
    "runtime/model.py": {"shared_embedding"},
    "zero/engine.py": {"zero_out_wgrad"},
}
SCANNED = {i.name for r in RELIANCES for i in r.internals} - GENERIC


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def violations(source: str, where: str) -> list[str]:
    """What in ``source`` touches a dependency's internals: a declared internal's name (attribute,
    or getattr/hasattr/setattr string); a private module, name or attribute of deepspeed, megatron
    or torch; an assignment to an attribute of one of their modules or objects."""
    tree = ast.parse(source)
    deps, compat, found = set(), set(), []

    def report(node, what):
        found.append(f"{where}:{node.lineno}: {what}: go through hybridpar.compat")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in DEPENDENCIES:
                    deps.add((alias.asname or alias.name).split(".")[0])
                    if any(map(_is_private, alias.name.split("."))):
                        report(node, f"imports the private module {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module == "hybridpar.compat":
            compat.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in DEPENDENCIES:
            deps.update(alias.asname or alias.name for alias in node.names)
            if any(map(_is_private, node.module.split("."))):
                report(node, f"imports from the private module {node.module}")
            for alias in node.names:
                if _is_private(alias.name):
                    report(node, f"imports {node.module}.{alias.name}")
    allowed = ALLOWED.get(where, set())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Attribute) and _root(node.value) not in compat:  # compat's own names
            names.append(node.attr)
            if _is_private(node.attr) and _root(node.value) in deps:
                report(node, f"reads the private {_root(node.value)}...{node.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2:
            if node.func.id in ("getattr", "hasattr", "setattr", "delattr") and isinstance(node.args[1], ast.Constant):
                names.append(node.args[1].value)
            if node.func.id in ("setattr", "delattr") and _root(node.args[0]) in deps:
                report(node, f"changes an attribute of {_root(node.args[0])}")
        for name in names:
            if name in SCANNED and name not in allowed:
                report(node, f"touches the dependency internal {name!r}")
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            if isinstance(target, ast.Attribute) and _root(target) in deps:
                report(node, f"assigns to {_root(target)}...{target.attr}")
    return found


def test_no_module_outside_compat_touches_a_dependency_internal():
    package = ROOT / "hybridpar"
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package).as_posix()
        if not where.startswith("compat/"):
            found += violations(path.read_text(), where)
    assert not found, "\n".join(found)


def test_the_scan_can_fail():
    bad = ("import torch.distributed as dist\n"
           "from torch.testing._internal.distributed.fake_pg import FakeStore\n"
           "from megatron.core.tensor_parallel import random as mrandom\n"
           "x = dist.group.WORLD._get_backend(None)\n"
           "dist.all_reduce = None\n"
           "setattr(mrandom, name, None)\n"
           "opt.bit16_groups_flat\n"
           "getattr(p, '_hp_mapping', None)\n")
    found = violations(bad, "x.py")
    assert sorted(int(line.split(":")[1]) for line in found) == [2, 4, 4, 5, 6, 7, 8], found
    fine = ("from hybridpar.compat import deepspeed as deepspeed_compat\n"
            "deepspeed_compat.setup_buckets(opt)\nopt.run()\nplan.grad_accum\nself._own = 1\n")
    assert violations(fine, "x.py") == []
