"""Every option of every `hybridpar` command has help text (its errors, run as a process:
tests/integration/test_cli_errors.py)."""
import argparse

from hybridpar.cli.main import build_parser


def test_every_option_of_every_command_has_help_text():
    parser = build_parser()
    missing = [f"{name} {action.option_strings or action.dest}" for name, sub in parser.commands.items()
               for action in sub._actions  # noqa: SLF001 - argparse keeps its actions there
               if not isinstance(action, argparse._HelpAction) and not action.help]  # noqa: SLF001
    assert missing == []
    assert len(parser.commands) >= 9


def test_help_texts_print_as_written():
    """A command's one-line help reads the same in `hybridpar --help` and `hybridpar CMD --help`
    (argparse %-formats the first, not the second: `0.5%%` showed doubled in memory's)."""
    parser = build_parser()
    listing = parser.format_help()
    for name, sub in parser.commands.items():
        assert "%%" not in sub.format_help(), name
    assert "%%" not in listing and "0.5%)" in " ".join(listing.split())
