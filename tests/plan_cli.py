"""`hybridpar plan` run in-process for the planner's tests: its exit code, stdout and stderr."""
from pathlib import Path

from hybridpar.cli.main import main

REPO = Path(__file__).resolve().parents[1]


def run(argv, capsys):
    code = main(["plan", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err
