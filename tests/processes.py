"""The processes of a run, read from /proc (Linux): a process's state and parent, a launcher's
descendants, and its rank processes (by their name or the RANK in their environment, not by anything
a launcher logs). Shared by tests/integration/test_orphans.py and test_rank_failure.py."""
from __future__ import annotations

import os
from pathlib import Path


def stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) from /proc, None once the process is gone or a zombie."""
    try:
        state, ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:2]
    except (OSError, ValueError):
        return None
    return None if state in ("Z", "X") else (state, int(ppid))


def _parents() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := stat(int(entry))):
            parents[int(entry)] = st[1]
    return parents


def descendants(root: int) -> set[int]:
    parents = _parents()
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


def rank_pids(launcher: int) -> dict[int, int]:
    """{rank: pid} of the launcher's children that are its ranks: on CPU forked and named
    "hybridpar r<rank>" (hybridpar/launch/forked.py), else started by torch's elastic agent in the
    launcher's process with TORCHELASTIC_RUN_ID and RANK in their environment."""
    ranks = {}
    for pid, ppid in _parents().items():
        if ppid != launcher:
            continue
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            env = dict(v.split("=", 1) for v in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in v)
        except OSError:
            continue
        if name.startswith("hybridpar r") and name[len("hybridpar r"):].isdigit():
            ranks[int(name[len("hybridpar r"):])] = pid
        elif "TORCHELASTIC_RUN_ID" in env and env.get("RANK", "").isdigit():
            ranks[int(env["RANK"])] = pid
    return ranks
