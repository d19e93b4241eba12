"""`hybridpar report RUN_DIR`: summary table and loss/throughput curves of a training run."""
from __future__ import annotations

import math
import os

from hybridpar.errors import UsageError
from hybridpar.files import why_not_writable

HELP = "summarize a run's metrics.jsonl and draw loss and throughput curves to PNG"


def add_arguments(p):
    p.add_argument("run_dir", metavar="RUN_DIR", help="the training run's output directory (holds metrics.jsonl)")
    p.add_argument("--out", metavar="DIR", help="where to write loss.png and throughput.png (default: RUN_DIR)")
    p.add_argument(
        "--loss-baseline", type=float, metavar="NATS", help="draw a reference loss, e.g. the corpus' unigram entropy"
    )
    p.add_argument("--no-plots", action="store_true", help="print the summary only")


def run(args) -> int:
    from hybridpar.observe.report import foreign_plots, format_summary, load_metrics, plot, summarize

    baseline = args.loss_baseline
    ignored = [flag for flag, value in (("--out", args.out), ("--loss-baseline", baseline)) if value is not None]
    if args.no_plots and ignored:
        verb = "shapes" if len(ignored) == 1 else "shape"
        raise UsageError(f"{' and '.join(ignored)} only {verb} the plots, which --no-plots leaves out: drop one or the other")
    if baseline is not None and not 0 <= baseline < math.inf:
        raise UsageError(f"--loss-baseline is a loss in nats per token, a finite number >= 0; got {baseline}")
    records = load_metrics(args.run_dir)
    out = args.out or args.run_dir
    why = None if args.no_plots else why_not_writable(out)
    if why:  # before the summary: a refused command prints nothing else
        raise UsageError(f"cannot write {out} ({why}); choose another --out")
    # In the run directory the plots are the run's own; elsewhere a plot report did not write is kept.
    elsewhere = os.path.abspath(out) != os.path.abspath(args.run_dir)
    foreign = foreign_plots(out) if elsewhere and not args.no_plots else []
    if foreign:
        one = len(foreign) == 1
        raise UsageError(f"{' and '.join(foreign)} exist{'s' if one else ''} and hybridpar report did not write "
                         f"{'it' if one else 'them'}; choose another --out")
    print(format_summary(summarize(records)))
    if not args.no_plots:
        try:
            os.makedirs(out, exist_ok=True)
        except OSError as err:
            raise UsageError(f"cannot create {out}: {err.strerror}; choose another --out") from None
        for path in plot(records, out, args.loss_baseline):
            print(f"wrote {path}")
    return 0
