"""Command-line parsing shared by the benchmarks: bad input ends in one line on stderr,
`hybridpar bench NAME: error: MESSAGE`, and exit status 2, before anything is launched or written.
Not a benchmark itself (bench --list skips names starting with '_')."""
from __future__ import annotations

import argparse
import os
import sys


class BenchParser(argparse.ArgumentParser):
    """An ArgumentParser for ``hybridpar bench NAME`` whose errors are one line (no usage block);
    ``--help`` is unchanged."""

    def __init__(self, name: str, **kwargs):
        self.bench = name
        super().__init__(prog=f"hybridpar bench {name}", **kwargs)

    def error(self, message: str):
        message = " ".join(str(message).split())  # one line, whatever the message holds
        if message.startswith(("unrecognized arguments", "the following arguments", "argument ", "expected ",
                               "ambiguous option", "one of the arguments", "not allowed with")):
            message += f" (see `hybridpar bench {self.bench} --help`)"
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def _number(kind, text: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None


def positive_int(text: str) -> int:
    """argparse ``type=``: an integer >= 1."""
    value = _number(int, text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def nonnegative_int(text: str) -> int:
    """argparse ``type=``: an integer >= 0."""
    value = _number(int, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse ``type=``: a finite number > 0."""
    value = _number(float, text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def nonnegative_float(text: str) -> float:
    """argparse ``type=``: a finite number >= 0."""
    value = _number(float, text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def result_name(text: str) -> str:
    """argparse ``type=`` for ``--name``: a file name in benchmarks/results/."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", text):
        raise argparse.ArgumentTypeError(f"{text!r}: use letters, digits, '.', '_' or '-' (a file name in benchmarks/results/)")
    return text


def int_list(parser: argparse.ArgumentParser, flag: str, text: str, allowed=None, hint: str = "") -> list[int]:
    """The integers of a comma-separated option (``--dp 1,2,4``); ``parser.error`` names the first
    entry that is not an integer or not in ``allowed`` (``hint`` says why those)."""
    items = [t.strip() for t in str(text).split(",")]
    if not items or any(not t for t in items):
        parser.error(f"{flag} {text!r}: give a comma-separated list without empty entries, e.g. "
                     f"{flag} {','.join(map(str, sorted(allowed)[:2] if allowed else (1, 2)))}")
    values = []
    for t in items:
        try:
            values.append(int(t))
        except ValueError:
            parser.error(f"{flag} {text}: {t!r} is not an integer")
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        parser.error(f"{flag} {text}: {twice[0]} is given twice; name each value once")
    if allowed is not None:
        for v in values:
            if v not in allowed:
                parser.error(f"{flag} {v}: use {_alternatives(sorted(allowed))}{f' ({hint})' if hint else ''}")
    return values


def _alternatives(values) -> str:
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


# fp32 weights and gradients, Adam's two moments: what one training copy of a parameter holds.
TRAINING_BYTES_PER_PARAM = 16


def check_fits_in_memory(parser: argparse.ArgumentParser, model: str, copies: int) -> None:
    """``parser.error`` unless ``copies`` whole training copies of ``model`` (summed over the
    benchmark's ranks and variants) fit in half of this machine's RAM: a model for GPUs (llama3-8b)
    would otherwise be launched on CPU ranks and killed for memory minutes later."""
    from hybridpar.topology.models import ModelSpecError, load_model

    try:
        spec = load_model(model)
    except ModelSpecError as err:
        parser.error(f"--model {model}: {err}")
    need = TRAINING_BYTES_PER_PARAM * spec.total_params * copies
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > ram / 2:
        parser.error(f"--model {model}: {copies} training copies of its {spec.total_params / 1e6:,.1f}M parameters "
                     f"need {need / 2**30:,.0f} GiB ({TRAINING_BYTES_PER_PARAM} bytes each: fp32 weights, gradients, "
                     f"Adam), over half of this machine's {ram / 2**30:.0f} GiB; use a CPU model such as tiny or tiny-deep")
