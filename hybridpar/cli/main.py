"""The `hybridpar` command: parse, dispatch to a subcommand module, report errors.

Each module in hybridpar/cli/commands/ is one subcommand named after the file (``_`` read as ``-``:
export_hf.py is ``export-hf``). It defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``, and imports torch only inside ``run`` so that `hybridpar plan` stays fast.
Packages built on hybridpar add subcommands of the same form through the ``hybridpar.commands``
entry-point group: the benchmarks' ``bench`` comes that way, so hybridpar never imports them.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import os
import pkgutil
import select
import signal
import sys

from hybridpar.errors import USER_ERRORS
from hybridpar.launch.launcher_death import die_with_launcher

from hybridpar.cli import commands


PLUGIN_GROUP = "hybridpar.commands"


def _plugins() -> dict:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)}


def command_names() -> list[str]:
    core = [m.name.replace("_", "-") for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_")]
    return sorted(set(core) | set(_plugins()))


def _module(name: str):
    plugin = _plugins().get(name)
    if plugin is not None:
        return plugin.load()
    return importlib.import_module(f"hybridpar.cli.commands.{name.replace('-', '_')}")


class _Parser(argparse.ArgumentParser):
    """argparse's own errors in hybridpar's one form: ``hybridpar <command>: error: ...``, one line,
    exit 2; an unknown option names the closest one the command has."""

    def error(self, message):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)

    def parse_args(self, args=None, namespace=None):
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            command = self.commands.get(getattr(parsed, "command", None), self)
            command.error(unknown_message(command, unknown))
        return parsed


def unknown_message(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    flag = unknown[0].split("=", 1)[0]
    known = [s for action in parser._actions for s in action.option_strings if s.startswith("--")]  # noqa: SLF001
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else f" (see `{parser.prog} --help`)"
    return f"unrecognized argument{'s' if len(unknown) > 1 else ''} {' '.join(unknown)}{hint}"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hybridpar", description="Hybrid 3D-parallel LLM training, DP outermost.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    parser.commands = {}
    for name in command_names():
        module = _module(name)
        # argparse %-formats a listed help, not a description
        parser.commands[name] = sub.add_parser(name, help=module.HELP.replace("%", "%%"), description=module.HELP)
        module.add_arguments(parser.commands[name])
    return parser


def main(argv=None) -> int:
    die_with_launcher()
    try:
        try:
            code = _dispatch(argv)
        except SystemExit:  # argparse's exits: its --help text may still sit in the buffer
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # here, where a closed pipe can still be answered
        return code
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        # `hybridpar plan ... | head -1`: end quietly, with the status of a tool that SIGPIPE killed
        # (128 + 13), as `cat` would; stdout goes to /dev/null so the exit flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader is gone (a BrokenPipeError can also come from a socket)."""
    poll = select.poll()
    poll.register(sys.stdout.fileno(), select.POLLOUT)
    return any(event & select.POLLERR for _, event in poll.poll(0))


def _dispatch(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    module = _module(args.command)
    try:
        return int(module.run(args) or 0)
    except USER_ERRORS as err:
        print(f"hybridpar {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
