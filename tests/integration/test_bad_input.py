"""Bad input, catalogued: every case is one line on stderr naming the problem, exit code 2,
no traceback, nothing on stdout, nothing written, and no rank started (train validates first);
commands that do not train answer before torch, deepspeed or megatron is imported."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "recipes" / "tiny.yaml")

FILES = {
    "unknown.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32}\nbogus: 1\n",
    "unknown_nested.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32, learning_rate: 1}\n",
    "wrongtype.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32, lr: fast}\n",
    "bool_as_int.yaml": "model: tiny\ntrain: {global_batch: true, seq_len: 32}\n",
    "truncated.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 3",
    "notamapping.yaml": "- model\n- tiny\n",
    "nomodel.yaml": "train: {global_batch: 16, seq_len: 32}\n",
    "negative.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: -32}\n",
    "heads.yaml": "model: {layers: 2, hidden: 96, ffn_hidden: 128, heads: 6, kv_heads: 3, vocab: 320, mlp: swiglu}\n"
                  "parallel: {tp: 4}\ntrain: {global_batch: 4, seq_len: 16}\n",
    "gbatch.yaml": "model: tiny\nparallel: {micro_batch: 2}\ntrain: {global_batch: 15, seq_len: 32}\n",
    "missingdata.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32}\ndata: {source: indexed, path: nowhere/x}\n",
    "smallvocab.yaml": "model: {layers: 2, hidden: 64, ffn_hidden: 128, heads: 4, kv_heads: 2, vocab: 128, mlp: swiglu}\n"
                       "train: {global_batch: 4, seq_len: 16}\ndata: {source: embedded}\n",
    "badsource.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32}\ndata: {source: web}\n",
    "badmodelref.yaml": "model: llama9-1t\ntrain: {global_batch: 16, seq_len: 32}\n",
    "badgpu.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32}\ncluster: {gpu: tpu-v5}\n",
    "zeronode.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32}\ncluster: {gpus_per_node: 0}\n",
    "clusterdp.yaml": "model: tiny\nparallel: {tp: 2, pp: 2, dp: 2}\ntrain: {global_batch: 16, seq_len: 32}\n"
                      "cluster: {gpus: 16}\n",
    "clustermp.yaml": "model: tiny\nparallel: {tp: 2, pp: 2}\ntrain: {global_batch: 16, seq_len: 32}\ncluster: {gpus: 6}\n",
    "clusternode.yaml": "model: tiny\nparallel: {tp: 2}\ntrain: {global_batch: 16, seq_len: 32}\n"
                        "cluster: {gpus: 12, gpus_per_node: 8}\n",
    "nodp.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32}\n",
    "pathname.yaml": "name: ../../elsewhere\nmodel: tiny\ntrain: {global_batch: 16, seq_len: 32}\n",
    "badsample.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32}\ngenerate: {tokens: -5}\n",
    "evalnoheld.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32}\ndata: {source: embedded}\neval: {every: 5}\n",
    "heldsynth.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32}\ndata: {held_out: 0.1}\n",
    "heldone.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32}\ndata: {source: embedded, held_out: 1}\n",
    "heldnone.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32}\ndata: {source: embedded, held_out: 0.05}\n",
    "heldall.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32}\ndata: {source: embedded, held_out: 0.9}\n",
    "heldshort.yaml": "model: tiny\ntrain: {global_batch: 4, seq_len: 80}\ndata: {source: indexed, path: good, held_out: 0.5}\n",
    "evalbatches.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32}\neval: {every: 5, batches: 0}\n",
    "truncated.json": '{"layers": 2, "hidden": 64',
    "incomplete.json": '{"layers": 2, "hidden": 64, "heads": 4}',
    "badmlp.json": '{"layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 2, "vocab": 256, "mlp": "relu"}',
    "binary.yaml": b"\xff\xfe\x00garbage",
    "overpeak_gpu.yaml": "base: h100-80gb\ngemm_fraction: 1.2\n",
    "lr0.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32, lr: 0}\n",
    "lrnan.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32, lr: .nan}\n",
    "twice.yaml": "model: tiny\ntrain:\n  lr: 0.1\n  seq_len: 32\n  lr: 0.2\n",
    "lrneg.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32, lr: -1.0e-3}\n",
    "minlr.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32, lr: 1.0e-3, min_lr: 1.0e-2}\n",
    "minlr_default.yaml": "model: tiny\ntrain: {global_batch: 16, seq_len: 32, lr: 1.0e-5}\n",
    "shortbin.yaml": "model: tiny\nparallel: {tp: 2, pp: 2}\ntrain: {global_batch: 16, seq_len: 32}\n"
                     "data: {source: indexed, path: short}\n",
}

CASES = [
    # plan
    ("plan-unknown-model", "plan --model nope --gpus 8", "unknown model"),
    ("plan-unknown-gpu", "plan --model llama3-8b --gpus 8 --gpu x100", "unknown GPU"),
    ("plan-gpu-file-above-peak", "plan --model llama3-8b --gpus 8 --gpu overpeak_gpu.yaml", "gemm_fraction must be a fraction"),
    ("plan-gpu-file-missing", "plan --model llama3-8b --gpus 8 --gpu nogpu.yaml", "GPU file nogpu.yaml not found"),
    ("plan-truncated-model-file", "plan --model truncated.json --gpus 8", "malformed"),
    ("plan-incomplete-model-file", "plan --model incomplete.json --gpus 8", "missing model key"),
    ("plan-bad-mlp", "plan --model badmlp.json --gpus 8", "mlp"),
    ("plan-gpus-not-node-multiple", "plan --model llama3-8b --gpus 12", "not a multiple"),
    ("plan-zero-gpus", "plan --model llama3-8b --gpus 0", "positive"),
    ("plan-negative-gpus", "plan --model llama3-8b --gpus -8", "positive"),
    ("plan-tp-not-dividing", "plan --model llama3-8b --gpus 8 --tp 3", "does not divide"),
    ("plan-contradictory-batch", "plan --model llama3-8b --gpus 8 --global-batch 8 --global-batch-tokens 100", "not allowed"),
    ("plan-headroom-out-of-range", "plan --model llama3-8b --gpus 8 --headroom 100", "--headroom"),
    ("plan-pins-not-world", "plan --model llama3-8b --gpus 8 --tp 2 --pp 2 --dp 4 --cp 1", "but --gpus is 8"),
    ("plan-tp-comm-overlap-on-hybridpar", "plan --model llama3-8b --gpus 8 --tp-comm-overlap", "userbuffers"),
    ("plan-tp-comm-overlap-without-sp", "plan --model llama3-8b --gpus 8 --tp-comm-overlap --software megatron-lm-2021",
     "does not have"),
    # mesh
    ("mesh-zero-size", "mesh --tp 0", "positive"),
    ("mesh-partial-node", "mesh --tp 3 --dp 3", "not a multiple"),
    ("mesh-rank-outside", "mesh --tp 2 --rank 5", "outside the world"),
    ("mesh-world-too-large", "mesh --tp 100000 --pp 100000 --dp 100000", "above the 1,048,576 ranks"),
    ("mesh-bad-order", "mesh --tp 2 --order dp-tp", "invalid choice"),
    # launch
    ("launch-world-mismatch", f"launch --recipe {TINY} --nodes 3 --gpus-per-node 4 --out o", "world size 12"),
    ("launch-zero-nodes", f"launch --recipe {TINY} --nodes 0 --out o", "--nodes"),
    ("launch-missing-recipe", "launch --recipe none.yaml --nodes 1 --out o", "not found"),
    ("launch-no-nodes-no-stated-world", "launch --recipe nodp.yaml --out o", "--nodes N is required"),
    ("plan-recipe-no-gpus-no-stated-world", "plan --recipe nodp.yaml", "the recipe states no cluster.gpus"),
    # recipe files, through train
    ("recipe-unknown-key", "train --recipe unknown.yaml", "unknown key 'bogus'"),
    ("recipe-unknown-nested-key", "train --recipe unknown_nested.yaml", "train.learning_rate"),
    ("recipe-wrong-type", "train --recipe wrongtype.yaml", "must be a finite number"),
    ("recipe-bool-as-int", "train --recipe bool_as_int.yaml", "global_batch"),
    ("recipe-truncated", "train --recipe truncated.yaml", "malformed"),
    ("recipe-not-a-mapping", "train --recipe notamapping.yaml", "mapping"),
    ("recipe-no-model", "train --recipe nomodel.yaml", "no 'model'"),
    ("recipe-negative-size", "train --recipe negative.yaml", "seq_len"),
    ("recipe-unreadable", "train --recipe binary.yaml", "unreadable"),
    ("recipe-missing", "train --recipe nofile.yaml", "not found"),
    ("recipe-unknown-model", "train --recipe badmodelref.yaml", "unknown model"),
    ("recipe-unknown-source", "train --recipe badsource.yaml", "unknown data source"),
    ("recipe-unknown-gpu", "train --recipe badgpu.yaml --nproc 8", "cluster.gpu: unknown GPU 'tpu-v5'"),
    ("recipe-zero-gpus-per-node", "train --recipe zeronode.yaml --nproc 8", "cluster.gpus_per_node must be a positive"),
    ("recipe-cluster-gpus-against-dp", "train --recipe clusterdp.yaml --nproc 8", "cluster.gpus 16 != tp x cp x pp x dp"),
    ("recipe-cluster-gpus-not-divisible", "train --recipe clustermp.yaml --nproc 8",
     "cluster.gpus 6 is not divisible by tp x cp x pp = 2 x 1 x 2"),
    ("recipe-cluster-gpus-partial-node", "train --recipe clusternode.yaml --nproc 8", "does not fill whole nodes"),
    ("recipe-name-is-a-path", "train --recipe pathname.yaml --nproc 8", "'name' must be a plain name"),
    ("recipe-negative-sample", "train --recipe badsample.yaml --nproc 8", "generate.tokens must be >= 0, got -5"),
    # train layouts
    ("train-tp-not-dividing-world", f"train --recipe {TINY} --nproc 8 --tp 3", "not divisible by tp x cp x pp"),
    ("train-world-mismatch", f"train --recipe {TINY} --nproc 6", "world size 6"),
    ("train-seq-not-divisible-by-2cp", f"train --recipe {TINY} --nproc 3 --cp 3 --tp 1 --pp 1", "seq_len 32 not divisible by 2 x cp = 6"),
    ("train-heads-not-divisible", "train --recipe heads.yaml --nproc 4", "heads 6 not divisible by tp 4"),
    # (--vpp 3 would be valid: 4 layers + embedding + loss = 6 = pp 2 x vpp 3, Llama 3's lighter end stages)
    ("train-layers-not-divisible", f"train --recipe {TINY} --nproc 8 --vpp 4", "layers 4 not divisible"),
    ("train-global-batch", "train --recipe gbatch.yaml", "global batch 15 not divisible"),
    ("train-zero-steps", f"train --recipe {TINY} --steps 0", "--steps"),
    ("train-on-drift-without-checks", f"train --recipe {TINY} --nproc 8 --on-drift warn", "add --check-replicas N"),
    ("train-allow-changes-without-resume", f"train --recipe {TINY} --nproc 8 --allow-changes", "add --resume"),
    ("train-negative-seed", f"train --recipe {TINY} --nproc 8 --seed -1", "--seed must be 0 or a positive integer"),
    ("train-stop-beyond-steps", f"train --recipe {TINY} --nproc 8 --stop-at-step 21", "beyond the run's last step 20"),
    ("train-no-save-and-save-every", f"train --recipe {TINY} --nproc 8 --no-save --save-every 5 --keep-last 1",
     "--no-save contradicts --save-every, --keep-last"),
    ("train-zero3", f"train --recipe {TINY} --nproc 8 --zero 3", "ZeRO-3"),
    ("train-negative-nproc", f"train --recipe {TINY} --nproc -2", "--nproc"),
    ("train-missing-data", "train --recipe missingdata.yaml", "nowhere/x"),
    # profiling
    ("train-profile-steps-backwards", f"train --recipe {TINY} --nproc 8 --profile-steps 5-3", "first to last (e.g. 5-7)"),
    ("train-profile-steps-beyond", f"train --recipe {TINY} --nproc 8 --profile-steps 25", "run's last step 20"),
    ("train-profile-steps-not-a-range", f"train --recipe {TINY} --nproc 8 --profile-steps two", "a step N or a range A-B"),
    ("train-profile-ranks-outside", f"train --recipe {TINY} --nproc 8 --profile-steps 2 --profile-ranks 0,8",
     "--profile-ranks 8 is outside the world of 8 ranks"),
    ("train-profile-ranks-alone", f"train --recipe {TINY} --nproc 8 --profile-ranks all", "add --profile-steps A-B"),
    # held-out evaluation
    ("train-negative-eval-every", f"train --recipe {TINY} --nproc 8 --eval-every -1", "--eval-every must be 0 or a positive"),
    ("eval-without-held-out-data", "train --recipe evalnoheld.yaml", "eval.every 5 needs held-out data: set data.held_out"),
    ("eval-held-out-on-synthetic", "train --recipe heldsynth.yaml", "synthetic data draws its held-out rows"),
    ("eval-held-out-everything", "train --recipe heldone.yaml", "from 0 to below 1, got 1"),
    ("eval-held-out-none", "train --recipe heldnone.yaml", "of the 3 sequences in the embedded corpus holds out none"),
    ("eval-held-out-leaves-nothing", "train --recipe heldall.yaml", "leaves 0 to train on"),
    ("eval-held-out-too-short", "train --recipe heldshort.yaml", "holds out 1 with fewer than 81 tokens"),
    ("eval-zero-batches", "train --recipe evalbatches.yaml", "eval.batches must be a positive integer, got 0"),
    ("train-vocab-mismatch", "train --recipe smallvocab.yaml", "vocab"),
    # a run or export directory that cannot be written: refused before anything is created
    ("train-out-under-a-file", f"train --recipe {TINY} --nproc 8 --out binary.yaml/run", "binary.yaml is a file"),
    ("train-save-dir-under-a-file", f"train --recipe {TINY} --nproc 8 --out fresh --save-dir binary.yaml/ck",
     "binary.yaml is a file"),
    ("train-out-not-creatable", f"train --recipe {TINY} --nproc 8 --out /proc/hybridpar-run",
     "cannot write the run directory /proc/hybridpar-run"),
    ("export-out-under-a-file", "export-hf nowhere binary.yaml/hf", "binary.yaml is a file"),
    ("export-overwrite-a-run", "export-hf nowhere arun --overwrite", "arun holds a training run or checkpoints (metrics.jsonl)"),
    ("export-into-a-run", "export-hf nowhere arun", "--overwrite replaces only an earlier export"),
    # a GPU recipe on a machine without CUDA (this one): no silent CPU run
    ("train-gpu-recipe-without-cuda", f"train --recipe {REPO}/recipes/llama3-8b-1node.yaml --nproc 8", "--allow-cpu"),
    # data and report
    ("data-missing-input", "data prepare nofile.txt --out x/y", "nofile.txt"),
    ("data-info-missing", "data info nowhere/prefix", "nowhere/prefix"),
    ("data-info-held-out-out-of-range", "data info good --held-out 1", "--held-out is a share of the sequences, above 0"),
    ("report-missing-run", "report nowhere", "nowhere"),
    ("report-out-under-a-file", "report arun --out binary.yaml/plots", "binary.yaml is a file"),
    ("report-metrics-file-as-run", "report arun/metrics.jsonl", "is a file: give the run directory"),
    ("report-baseline-negative", "report arun --loss-baseline -1", "--loss-baseline is a loss in nats"),
    ("report-baseline-nan", "report arun --loss-baseline nan", "--loss-baseline is a loss in nats"),
    ("report-out-without-plots", "report arun --out plots --no-plots", "--out only shapes the plots"),
    # schedules (train.warmup_steps longer than the run is a warning: test_orphans.py)
    ("schedule-lr-zero", "train --recipe lr0.yaml", "train.lr must be > 0"),
    ("recipe-lr-nan", "train --recipe lrnan.yaml", "'train.lr' must be a finite number, got nan"),
    ("recipe-key-twice", "train --recipe twice.yaml", "has the key 'lr' twice (line 5)"),
    ("schedule-lr-negative", "train --recipe lrneg.yaml", "train.lr must be > 0"),
    ("schedule-min-lr-above-lr", "train --recipe minlr.yaml", "train.min_lr 0.01 is above train.lr 0.001"),
    ("schedule-default-min-lr-above-lr", "train --recipe minlr_default.yaml", "min_lr 3e-05 (its default)"),
    # prepared data that does not match its index (broken copies of a real `prepare`: see workdir)
    ("train-bin-shorter-than-idx", "train --recipe shortbin.yaml --nproc 8", "short.bin is 260 bytes, but short.idx describes 131 uint16 tokens (262 bytes)"),
    ("data-info-bin-shorter-than-idx", "data info short", "the .bin is truncated"),
    ("data-info-bin-longer-than-idx", "data info long", "the .bin is longer"),
    ("data-info-idx-truncated", "data info cutidx", "cutidx.idx is 58 bytes, but its header describes 2 sequences"),
    ("data-info-not-an-index", "data info notidx", "not a megatron index"),
    ("data-info-meta-disagrees", "data info othermeta", "says 132 tokens in 2 documents"),
    ("data-info-meta-unreadable", "data info badmeta", "badmeta.meta.json is unreadable"),
]
# Commands that must answer without the heavy stack (issue 16 §7).
CHEAP = ("plan", "mesh", "launch", "report", "data")
HEAVY = ("torch", "deepspeed", "megatron")


def heavy_imports(importtime: str) -> list[str]:
    """Top-level heavy packages in a `python -X importtime` report."""
    names = (line.split("|")[-1].strip() for line in importtime.splitlines() if line.startswith("import time:"))
    return sorted({n for n in names if n in HEAVY})


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad_input")
    for name, text in FILES.items():
        (d / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    _broken_datasets(d)
    (d / "arun").mkdir()
    (d / "arun" / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 5.0, "step_time_s": 0.5, "tokens_per_s": 100.0,
                                                          "grad_norm": 1.0, "lr": 1e-3}) + "\n")
    return d


def _broken_datasets(d: Path) -> None:
    """A real prepared dataset (2 documents, 131 byte tokens as uint16: a 262-byte .bin, an 82-byte
    .idx), copied and broken in one way per copy."""
    from hybridpar.data import ByteTokenizer, prepare

    (d / "docs.txt").write_text("To be, or not to be, that is the question:\n" * 2 + "\n")
    (d / "docs2.txt").write_text("Whether 'tis nobler in the mind to suffer\n")
    prepare([str(d / "docs.txt"), str(d / "docs2.txt")], str(d / "good"), ByteTokenizer(), progress=False)

    def copy(name, ext_edit=None):
        for ext in (".bin", ".idx", ".meta.json"):
            shutil.copy(d / f"good{ext}", d / f"{name}{ext}")
        ext, edit = ext_edit
        path = d / f"{name}{ext}"
        path.write_bytes(edit(path.read_bytes()))

    copy("short", (".bin", lambda b: b[:-2]))
    copy("long", (".bin", lambda b: b + b"\0\0"))
    copy("cutidx", (".idx", lambda b: b[:-24]))
    copy("notidx", (".idx", lambda b: b"NOTANIDX" + b[8:]))
    copy("othermeta", (".meta.json", lambda b: json.dumps(dict(json.loads(b), tokens=132)).encode()))
    copy("badmeta", (".meta.json", lambda b: b[:-10]))


def _snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): p.stat().st_size for p in d.rglob("*")}


@pytest.mark.parametrize("name, command, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input(workdir, name, command, expected):
    before = _snapshot(workdir)
    env = dict(os.environ, HYBRIDPAR_DATA_DIR=str(workdir / "data-cache"))
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "hybridpar", *command.split()], cwd=workdir,
                         env=env, capture_output=True, text=True, timeout=120)
    stderr = "".join(line for line in res.stderr.splitlines(True) if not line.startswith("import time:"))
    assert res.returncode == 2, (res.returncode, res.stdout, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr and lines[0].startswith("hybridpar")
    assert expected in lines[0], lines[0]
    assert res.stdout == "", res.stdout  # nothing started: no rank printed its banner
    assert _snapshot(workdir) == before, "a failed command wrote files"
    if command.split()[0] in CHEAP:
        assert heavy_imports(res.stderr) == [], f"{command} imported {heavy_imports(res.stderr)} before answering"


def test_catalogue_is_large():
    assert len(CASES) >= 30
