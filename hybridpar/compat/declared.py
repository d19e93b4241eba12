"""How a compatibility module says what it relies on; tests/unit/test_compat.py checks it against the
installed dependency, so an upgrade that changes an internal fails there, by name, and not in
the middle of a training run."""
from __future__ import annotations

from dataclasses import dataclass

# How an internal is checked:
MEMBER = "member"      # the owner has it: a module's function or global, a class's method
ASSIGNED = "assigned"  # the owner's source sets ``.name =``: an attribute its instances get at run time
READ = "read"          # the owner's source names it: an attribute hybridpar sets for it, a global it looks up
FIELD = "field"        # a field of the owner, a dataclass


@dataclass(frozen=True)
class Internal:
    owner: str  # "package.module" or "package.module:Class"
    name: str
    used_for: str  # "hybridpar.<module> <does what> through it": the second half of the failure message
    kind: str = MEMBER
    params: tuple[str, ...] = ()  # the leading parameters hybridpar calls it with (a method's after self)
    value: object = None  # what a member must equal, where hybridpar spells it out itself

    @property
    def label(self) -> str:
        return f"{self.owner.rpartition(':')[2] if ':' in self.owner else self.owner}.{self.name}"


@dataclass(frozen=True)
class Reliance:
    distribution: str  # the name pip knows it by
    tested: tuple[str, str]  # versions: the lowest tested, and the first not tested
    internals: tuple[Internal, ...]
