"""Tokenizing a corpus with `hybridpar data prepare`: batched encoding against one document at a time.

A JSON-lines corpus cut from the embedded plays (``--documents`` lines of 200-1,200 characters) is
prepared with a byte-level BPE tokenizer trained on it (tokenizers' BpeTrainer, ``--vocab`` ids),
first one ``encode`` call per document (what prepare did before it batched), then in prepare's
batches, whose ``encode_batch`` the tokenizers library spreads over every core; both write byte-identical files
(checked here and in tests/unit/test_data_prepare.py). Medians of ``--repeats`` alternating rounds,
the ratio within each round, after an untimed prepare (the first one imports megatron-core). Writes benchmarks/results/data_prepare.json.

    hybridpar bench data_prepare [--documents 20000] [--repeats 3] [--vocab 8000]
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hybridpar.benchmarks._cli import BenchParser, positive_int
from hybridpar.benchmarks.results_io import write_result

REPO = Path(__file__).resolve().parents[1]


def corpus(path: Path, documents: int) -> int:
    """Write the JSON-lines corpus; return its size in bytes."""
    from hybridpar.data.embedded import corpus_files

    text = "".join(open(f, encoding="ascii").read() for f in corpus_files())
    with open(path, "w", encoding="utf-8") as f:
        start = 0
        for i in range(documents):
            length = 200 + (i * 7919) % 1000
            if start + length > len(text):
                start = (start * 31 + 17) % (len(text) // 2)
            f.write(json.dumps({"text": text[start: start + length]}) + "\n")
            start += length
    return path.stat().st_size


def tokenizer(path: Path, corpus_path: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    with open(corpus_path, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<|endoftext|>"]))
    tok.save(str(path))


class OneAtATime:
    """The tokenizer, encoding a batch one document per call."""

    def __init__(self, tok):
        self.tok, self.name, self.vocab_size, self.eod = tok, tok.name, tok.vocab_size, tok.eod

    def encode_batch(self, texts):
        return [self.tok.encode(t) for t in texts]


def main(argv=None) -> int:
    parser = BenchParser("data_prepare", description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=positive_int, default=20_000)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--vocab", type=positive_int, default=8000)
    args = parser.parse_args(argv)
    from hybridpar.data import load_tokenizer, prepare

    with tempfile.TemporaryDirectory(prefix="hybridpar-bench-") as tmp:
        root = Path(tmp)
        size = corpus(root / "corpus.jsonl", args.documents)
        tokenizer(root / "tokenizer.json", root / "corpus.jsonl", args.vocab)
        tok = load_tokenizer(str(root / "tokenizer.json"))
        # untimed: the first prepare imports megatron-core's indexed_dataset (seconds), which no mode should pay
        prepare([str(root / "corpus.jsonl")], str(root / "warm-up"), tok, progress=False)
        times = {"one_at_a_time": [], "batched": []}
        ratios, tokens = [], None
        for _ in range(args.repeats):
            for mode, encoder in (("one_at_a_time", OneAtATime(tok)), ("batched", tok)):
                start = time.perf_counter()
                data = prepare([str(root / "corpus.jsonl")], str(root / mode), encoder, progress=False)
                times[mode].append(time.perf_counter() - start)
                tokens = data.tokens
            ratios.append(times["one_at_a_time"][-1] / times["batched"][-1])
        same = all((root / f"one_at_a_time{e}").read_bytes() == (root / f"batched{e}").read_bytes() for e in (".bin", ".idx"))
    medians = {mode: statistics.median(t) for mode, t in times.items()}
    for mode, median in medians.items():
        print(f"{mode:<14} median {median:.3f} s  {tokens / median / 1e6:.2f} M tokens/s  ({size / median / 1e6:.1f} MB/s)")
    print(f"batched is {statistics.median(ratios):.2f}x faster (median of {args.repeats} paired rounds); "
          f"identical files: {same}; {os.cpu_count()} CPUs")
    path = write_result("data_prepare", {
        "documents": args.documents, "corpus_bytes": size, "tokens": tokens, "vocab": args.vocab,
        "batch_documents": sys.modules["hybridpar.data.prepare"].BATCH_DOCUMENTS, "cpus": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2),
        "median_s": {m: round(v, 4) for m, v in medians.items()}, "all_s": {m: [round(x, 4) for x in t] for m, t in times.items()},
        "speedup_median": round(statistics.median(ratios), 3), "identical_files": same},
        command=" ".join(["hybridpar bench data_prepare", *(argv or [])]))
    print(f"wrote {path.relative_to(REPO)}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
