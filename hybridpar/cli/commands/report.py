"""`hybridpar report RUN_DIR [RUN_DIR ...]`: summary table and loss/throughput curves of a training run,
or of several side by side (one table each, their curves overlaid: a scaling experiment's runs)."""
from __future__ import annotations

import math
import os

from hybridpar.errors import UsageError
from hybridpar.files import why_not_writable

HELP = "summarize a run's metrics.jsonl and draw loss and throughput curves to PNG"


def add_arguments(p):
    p.add_argument("run_dirs", metavar="RUN_DIR", nargs="+",
                   help="a training run's output directory (holds metrics.jsonl); several are compared")
    p.add_argument("--out", metavar="DIR",
                   help="where to write loss.png and throughput.png (default: RUN_DIR; required with several runs)")
    p.add_argument("--by-tokens", action="store_true",
                   help="draw against tokens seen instead of steps (runs of different batch sizes), from each plan.json")
    p.add_argument(
        "--loss-baseline", type=float, metavar="NATS", help="draw a reference loss, e.g. the corpus' unigram entropy"
    )
    p.add_argument("--no-plots", action="store_true", help="print the summary only")


def run(args) -> int:
    from hybridpar.observe.report import foreign_plots, format_summary, load_metrics, plot_runs, summarize, tokens_per_step

    baseline, dirs = args.loss_baseline, args.run_dirs
    ignored = [flag for flag, value in (("--out", args.out), ("--loss-baseline", baseline),
                                        ("--by-tokens", args.by_tokens or None)) if value is not None]
    if args.no_plots and ignored:
        verb = "shapes" if len(ignored) == 1 else "shape"
        raise UsageError(f"{' and '.join(ignored)} only {verb} the plots, which --no-plots leaves out: drop one or the other")
    if baseline is not None and not 0 <= baseline < math.inf:
        raise UsageError(f"--loss-baseline is a loss in nats per token, a finite number >= 0; got {baseline}")
    same = next((d for i, d in enumerate(dirs) if os.path.abspath(d) in map(os.path.abspath, dirs[:i])), None)
    if same is not None:
        raise UsageError(f"{same} is given twice: name each run once")
    if len(dirs) > 1 and not args.no_plots and not args.out:
        raise UsageError(f"{len(dirs)} runs are compared in one pair of plots: give --out DIR for them (or --no-plots)")
    runs = [(d, load_metrics(d)) for d in dirs]
    tokens = [tokens_per_step(d) for d in dirs] if args.by_tokens else None
    out = args.out or dirs[0]
    why = None if args.no_plots else why_not_writable(out)
    if why:  # before the summary: a refused command prints nothing else
        raise UsageError(f"cannot write {out} ({why}); choose another --out")
    # In the run directory the plots are the run's own; elsewhere a plot report did not write is kept.
    elsewhere = os.path.abspath(out) != os.path.abspath(dirs[0]) or len(dirs) > 1
    foreign = foreign_plots(out) if elsewhere and not args.no_plots else []
    if foreign:
        one = len(foreign) == 1
        raise UsageError(f"{' and '.join(foreign)} exist{'s' if one else ''} and hybridpar report did not write "
                         f"{'it' if one else 'them'}; choose another --out")
    for name, records in runs:
        if len(runs) > 1:
            print(f"== {name}")
        print(format_summary(summarize(records)))
    if not args.no_plots:
        try:
            os.makedirs(out, exist_ok=True)
        except OSError as err:
            raise UsageError(f"cannot create {out}: {err.strerror}; choose another --out") from None
        labelled = runs if len(runs) > 1 else [("", runs[0][1])]
        for path in plot_runs(labelled, out, baseline, tokens):
            print(f"wrote {path}")
    return 0
