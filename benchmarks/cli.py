"""`hybridpar bench NAME [options]`: run one benchmark module from benchmarks/; `--list` lists them.

A subcommand that the benchmarks package gives hybridpar's command line (setup.py's
``hybridpar.commands`` entry point): the benchmarks depend on hybridpar, never the other way."""
from __future__ import annotations

import importlib
import pkgutil

from hybridpar.errors import UsageError

HELP = "run a benchmark from benchmarks/ (results go to benchmarks/results/); --list shows them"
_NOT_BENCHMARKS = {"results_io", "cli"}


def add_arguments(p):
    p.add_argument("name", nargs="?", help="benchmark name (see --list)")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument("options", nargs="...", help="options passed to the benchmark")


def available() -> dict[str, str]:
    import hybridpar.benchmarks as benchmarks

    names = {}
    for info in pkgutil.iter_modules(benchmarks.__path__):
        if info.name.startswith("_") or info.name in _NOT_BENCHMARKS:
            continue
        module = importlib.import_module(f"hybridpar.benchmarks.{info.name}")
        names[info.name] = (module.__doc__ or "").strip().splitlines()[0] if module.__doc__ else ""
    return names


def run(args) -> int:
    try:
        names = available()
    except ImportError as err:
        raise UsageError(f"benchmarks are not importable ({err}); run from the repository root") from None
    if args.list or not args.name:
        for name, doc in sorted(names.items()):
            print(f"{name:<16} {doc}")
        return 0
    if args.name not in names:
        raise UsageError(f"unknown benchmark {args.name!r}; available: {', '.join(sorted(names))}")
    module = importlib.import_module(f"hybridpar.benchmarks.{args.name}")
    return int(module.main(args.options) or 0)
