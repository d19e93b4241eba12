"""The `hybridpar` command: parsing, the subcommands (cli/commands/), and the flags that become a run's settings."""
from hybridpar.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
