"""`hybridpar export-hf CHECKPOINT OUT_DIR`: a checkpoint as a Hugging Face LlamaForCausalLM."""
from __future__ import annotations

import re

from hybridpar.errors import UsageError

HELP = "write a checkpoint (any layout) as a Hugging Face Llama directory: config, safetensors, tokenizer"

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def add_arguments(p):
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a step-NNNNNN directory, or a save directory (its latest)")
    p.add_argument("out_dir", metavar="OUT_DIR", help="the Hugging Face directory to create (must be absent or empty)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in OUT_DIR (never a run, its checkpoints, or a directory holding them)")
    p.add_argument("--tokenizer", help="byte, or a tokenizer.json (default: the run's, from the checkpoint's run.json)")
    p.add_argument("--dtype", default="fp32", help="fp32 (default) or bf16")
    p.add_argument("--max-shard-size", default="5GB", help="largest safetensors file, e.g. 5GB, 500MB (default 5GB)")


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS or float(m.group(1)) <= 0:
        raise UsageError(f"--max-shard-size must be a positive size such as 5GB or 500MB, got {text!r}")
    return int(float(m.group(1)) * _UNITS[unit])


def run(args) -> int:
    from hybridpar.checkpoint.hf_export import ExportConfig, export_hf

    export_hf(ExportConfig(checkpoint=args.checkpoint, out_dir=args.out_dir, overwrite=args.overwrite,
                           tokenizer=args.tokenizer, dtype=args.dtype, max_shard_bytes=parse_size(args.max_shard_size)))
    return 0
