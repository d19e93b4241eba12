"""The docs quote figures as the code and the committed results give them now.

- every `$ hybridpar plan ...` transcript in docs/*.md: each line it shows is a line the command prints
  today (stdout and stderr; `# excerpt` transcripts leave lines out, never change one);
- docs/benchmarks.md's planner_speed table is benchmarks/results/planner_speed.json's, load included.
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from hybridpar.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))


def transcripts() -> list[tuple[str, str, list[str]]]:
    """(doc name, command line, the lines shown after it) for every fenced `$ hybridpar plan` transcript."""
    found = []
    for doc in DOCS:
        for block in re.findall(r"^```[^\n]*\n(.*?)^```", doc.read_text(), flags=re.S | re.M):
            lines = block.rstrip("\n").splitlines()
            if lines and lines[0].startswith("$ hybridpar plan "):
                found.append((doc.name, lines[0][2:], lines[1:]))
    return found


TRANSCRIPTS = transcripts()


def test_the_docs_have_transcripts():
    assert len(TRANSCRIPTS) >= 2


@pytest.mark.parametrize("doc, command, shown", TRANSCRIPTS, ids=[f"{d}:{c[15:60]}" for d, c, _ in TRANSCRIPTS])
def test_a_transcript_shows_what_the_command_prints(doc, command, shown, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = shlex.split(command.split("#", 1)[0])[2:]  # after `hybridpar plan`
    main(["plan", *argv])
    out = capsys.readouterr()
    printed = set((out.out + out.err).splitlines())
    for line in shown:
        assert line in printed, f"{doc}: `{command}` no longer prints:\n{line}"


def test_planner_speed_table_is_the_committed_measurement():
    result = json.loads((ROOT / "benchmarks" / "results" / "planner_speed.json").read_text())
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    section = text[text.index("## planner_speed"):]
    assert f"at load {result['load_average_1m']}:" in section
    for r in result["results"]:
        row = f"| `{r['command']}` | {r['median_s']:.3f} | {r['min_s']:.3f}-{r['max_s']:.3f} |"
        assert row in section, row
