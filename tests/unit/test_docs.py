"""README.md stays a front door and the docs stay true to the tree (pure, no ranks, ~1 s).

- README.md has at most 300 lines;
- its first commands are the project's two: the main job and the test suite (the one .ci/run runs);
- every repository path written in backticks in README.md and docs/*.md exists (globs must match);
- every `hybridpar <command>` README.md names is a subcommand that `hybridpar --help` lists.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
TOP_FOLDERS = ("hybridpar", "topology", "benchmarks", "recipes", "scripts", "tests", "docs")
TOP_FILES = ("README.md", "setup.py", "requirements.txt")

MAIN_JOB = "hybridpar train --recipe recipes/default.yaml --nproc 8"
TEST_SUITE = "python -m pytest -q tests"


def _prose_and_blocks(text: str) -> tuple[str, list[str]]:
    """(text outside fenced code blocks, the fenced blocks)."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    return prose, blocks


def _code_spans(text: str) -> list[str]:
    prose, _ = _prose_and_blocks(text)
    return re.findall(r"`([^`\n]+)`", prose)


def _repository_paths(text: str) -> list[str]:
    """Backticked spans that name a file or folder of this repository."""
    paths = []
    for span in _code_spans(text):
        word = span.strip()
        if " " in word:
            continue
        word = re.sub(r":\d+(-\d+)?$", "", word).rstrip(".,;")  # file.py:120
        if word in TOP_FILES or word.split("/", 1)[0] in TOP_FOLDERS and "/" in word:
            paths.append(word)
    return paths


def _exists(path: str) -> bool:
    if any(c in path for c in "*?["):
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


def test_readme_is_a_front_door():
    lines = README.read_text().count("\n")
    assert lines <= 300, f"README.md has {lines} lines: keep it at most 300, move depth to docs/"


def test_readme_opens_with_the_main_job_and_the_test_suite():
    _, blocks = _prose_and_blocks(README.read_text())
    first = [line for line in blocks[0].splitlines() if line.strip()]
    assert MAIN_JOB in first[0], f"README's first command must be the main job ({MAIN_JOB}), got: {first[0]}"
    assert TEST_SUITE in first[1], f"README's second command must run the test suite ({TEST_SUITE}), got: {first[1]}"
    ci = (ROOT / ".ci" / "run").read_text()
    assert TEST_SUITE in ci, ".ci/run must run the test command README gives"


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: p.name)
def test_every_backticked_repository_path_exists(doc):
    paths = _repository_paths(doc.read_text())
    missing = sorted({p for p in paths if not _exists(p)})
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_the_path_check_sees_paths():
    """The check above must not pass by finding nothing."""
    found = _repository_paths("`hybridpar/zero/grad_sync.py` `tests/test_x.py:12`, `hybridpar plan` `README.md`")
    assert found == ["hybridpar/zero/grad_sync.py", "tests/test_x.py", "README.md"]
    assert len(_repository_paths(README.read_text())) >= 10


def _subcommands(capsys) -> set[str]:
    """The subcommands `hybridpar --help` lists (its parser, in this process)."""
    from hybridpar.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    listed = capsys.readouterr().out.split("positional arguments:", 1)[1].split("options:", 1)[0]
    return set(re.findall(r"^ {4}([a-z][a-z0-9-]*)", listed, flags=re.M))


def test_every_command_readme_names_exists(capsys):
    commands = _subcommands(capsys)
    assert {"plan", "mesh", "train", "data", "launch", "report", "memory", "export-hf"} <= commands
    text = README.read_text()
    prose, blocks = _prose_and_blocks(text)
    code = "\n".join(blocks + _code_spans(text))
    named = set(re.findall(r"(?:^|[\s/`(])hybridpar +([a-z][a-z0-9-]*)", code, flags=re.M))
    assert named, "README names no hybridpar command"
    unknown = sorted(named - commands)
    assert not unknown, f"README names commands `hybridpar --help` does not list: {unknown} (it lists {sorted(commands)})"
    sections = set(re.findall(r"^### `hybridpar ([a-z-]+)`", prose, flags=re.M))
    assert sections == commands, f"one README section per command: missing {sorted(commands - sections)}"
