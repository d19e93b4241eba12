"""`hybridpar data prepare`: tokenize text into megatron-core's indexed format (.bin/.idx)."""
from __future__ import annotations

from hybridpar.errors import UsageError

HELP = "prepare training data: tokenize text or JSON lines into megatron .bin/.idx files"


def add_arguments(p):
    sub = p.add_subparsers(dest="data_command", metavar="ACTION", parser_class=type(p), help="prepare or info")
    sub.required = True
    prep = sub.add_parser(
        "prepare",
        help="tokenize INPUT files (or the embedded corpus) into PREFIX.bin/.idx",
        description=(
            "Tokenize plain-text files (each file is one document) or JSON-lines files (.jsonl/.json, "
            "one document per line) into megatron-core's indexed dataset PREFIX.bin + PREFIX.idx, "
            "with an end-of-document token after every document."
        ),
    )
    prep.add_argument("inputs", nargs="*", metavar="INPUT", help="text or JSON-lines files")
    prep.add_argument("--embedded", action="store_true", help="prepare the shipped corpus (three Shakespeare plays)")
    prep.add_argument("--tokenizer", default="byte", help="'byte' (built in, vocab 257) or a tokenizer.json path")
    prep.add_argument("--eod-token", help="end-of-document token of a tokenizer.json (default: found by name)")
    prep.add_argument("--out", required=True, metavar="PREFIX", help="writes PREFIX.bin, PREFIX.idx, PREFIX.meta.json")
    prep.add_argument("--json-key", default="text", help="key holding the text in JSON lines (default: text)")
    prep.add_argument("--quiet", action="store_true", help="no progress bar")
    prep.add_argument("--overwrite", action="store_true", help="replace a dataset already prepared at PREFIX")
    info = sub.add_parser("info", help="documents, tokens and unigram entropy of a prepared PREFIX")
    info.add_argument("prefix", metavar="PREFIX", help="path prefix of PREFIX.bin/.idx")
    info.add_argument("--held-out", type=float, metavar="SHARE",
                      help="also show what a recipe's data.held_out SHARE keeps out of training (sequences, tokens)")


def run(args) -> int:
    return info(args) if args.data_command == "info" else prepare_data(args)


def info(args) -> int:
    import os

    from hybridpar.data.prepare import read_meta
    from hybridpar.data.stats import bits_to_nats, entropy_bits, token_counts

    if not (os.path.isfile(args.prefix + ".bin") and os.path.isfile(args.prefix + ".idx")):
        raise UsageError(f"no {args.prefix}.bin/.idx: give the --out PREFIX of `hybridpar data prepare`")
    if args.held_out is not None and not 0 < args.held_out < 1:
        raise UsageError(f"--held-out is a share of the sequences, above 0 and below 1, got {args.held_out:g}")
    meta = read_meta(args.prefix)
    counts = token_counts(args.prefix)  # checks the .bin against the .idx first
    bits = entropy_bits(counts)
    print(f"{args.prefix}: {int(counts.sum())} tokens", end="")
    print(f", {meta.documents} documents, tokenizer {meta.tokenizer} (vocab {meta.vocab_size})" if meta else "")
    print(f"unigram entropy {bits:.4f} bits = {bits_to_nats(bits):.4f} nats per token")
    if args.held_out is not None:
        print(_held_out_line(args.prefix, args.held_out))
    return 0


def _held_out_line(prefix: str, share: float) -> str:
    """The split a recipe's ``data.held_out: share`` gives (hybridpar/data/held_out.py), in sequences and tokens."""
    from hybridpar.data.held_out import split_counts
    from hybridpar.data.index_check import sequence_lengths

    lengths = [int(n) for n in sequence_lengths(prefix)]
    train, held = split_counts(len(lengths), share)
    if not held or not train:
        return (f"data.held_out {share:g}: of {len(lengths)} sequences it {'holds out none' if not held else 'leaves none to train on'}"
                f" (one sequence is {1 / len(lengths):.3g} of them)")
    return (f"data.held_out {share:g}: trains on sequences 0-{train - 1} ({sum(lengths[:train])} tokens), holds out the "
            f"last {held} ({sum(lengths[train:])} tokens)")


def prepare_data(args) -> int:
    from hybridpar.data.prepare import prepare
    from hybridpar.data.tokenizers import load_tokenizer

    if args.embedded and args.inputs:
        raise UsageError("give INPUT files or --embedded, not both")
    if args.embedded:
        from hybridpar.data.embedded import corpus_files

        inputs = corpus_files()
    elif not args.inputs:
        raise UsageError("no input files: give text or JSON-lines files, or --embedded")
    else:
        inputs = args.inputs
    _check_out_prefix(args.out, args.overwrite)
    if args.eod_token is not None and args.tokenizer == "byte":
        raise UsageError("--eod-token names a token of a tokenizer.json; the byte tokenizer's end-of-document id is "
                         "always 256: drop --eod-token or give --tokenizer")
    tokenizer = load_tokenizer(args.tokenizer, args.eod_token)
    data = prepare(inputs, args.out, tokenizer, json_key=args.json_key, progress=not args.quiet)
    print(
        f"wrote {data.prefix}.bin/.idx: {data.documents} documents, {data.tokens} tokens "
        f"(tokenizer {data.tokenizer}, vocab {data.vocab_size}, end-of-document id {data.eod})"
    )
    return 0


def _check_out_prefix(prefix: str, overwrite: bool) -> None:
    import os

    if os.path.basename(prefix) in ("", ".", ".."):
        raise UsageError(f"--out {prefix!r} names no file: give a prefix such as data/corpus "
                         "(writes data/corpus.bin, .idx and .meta.json)")
    existing = [prefix + ext for ext in (".bin", ".idx") if os.path.lexists(prefix + ext)]
    if existing and not overwrite:
        raise UsageError(f"{' and '.join(existing)} already exist (a prepared dataset, which a run may be reading): "
                         "give --overwrite to replace it, or another --out")
