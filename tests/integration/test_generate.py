"""Generation and per-step metrics (issue 4 §4, §5).

- hybridpar.llama_ref's plain-PyTorch forward gives megatron-core's logits for the same canonical
  weights (untied and tied, GQA): an independent check of the model and the basis of sampling.
- `hybridpar train` on 4 CPU ranks (TP2 x PP2) for a few steps on the embedded corpus ends with a
  decoded sample in stdout and OUT/sample.txt, and that sample is exactly what the weights in the
  run's final checkpoint (reassembled without any process group) produce; metrics.jsonl carries
  model FLOP/s from topology's formula, MFU null on CPU and the planner's predicted step time, and the
  loss on the recipe's held-out play after the last step, as plain PyTorch computes it from the checkpoint.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from multirank import run_single_process_worker

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def test_reference_forward_equals_megatron(tmp_path):
    results = run_single_process_worker("llama_ref_worker.py", tmp_path / "ref.json")
    for case, r in results.items():
        assert r["shape"] == [2, 24, 320], case
        assert r["max_logit"] > 3.0, case  # sharp, non-trivial logits
        assert r["max_diff"] <= 1e-5 * r["max_logit"], (case, r["max_diff"])
        assert r["rope_control_diff"] > 0.1, case  # a different model is told apart
    assert "output_layer.weight" in results["untied"]["params"]
    assert "output_layer.weight" not in results["tied"]["params"]


def test_train_prints_and_saves_a_sample_of_the_trained_model(tmp_path):
    import torch

    from hybridpar.checkpoint.reshard import read_full_state
    from hybridpar.data import ByteTokenizer
    from hybridpar.config.sections import GenerateSection as SampleConfig
    from hybridpar.observe.sample import generate_text
    from hybridpar.observe.report import load_metrics, summarize
    from hybridpar.topology.flops import model_flops_per_seq
    from hybridpar.topology.plan import Plan
    from hybridpar.topology.search import evaluate

    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    argv = [sys.executable, "-m", "hybridpar", "train", "--recipe", "recipes/default.yaml", "--nproc", "4",
            "--tp", "2", "--pp", "2", "--steps", "3", "--global-batch", "8", "--micro-batch", "4",
            "--sample-tokens", "24", "--sample-prompt", "Ham.\n", "--save-dir", str(ckpt), "--out", str(out)]
    run = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    text = (out / "sample.txt").read_text()[:-1]  # written with a final newline
    assert text.startswith("Ham.\n") and len(text) > len("Ham.\n")
    assert "sample (24 tokens, temperature 0.7, model after step 3):\n" + text in run.stdout  # the recipe's sampling

    # The sample is the trained model's: regenerate it from the step-3 checkpoint's weights.
    plan = Plan.from_dict(json.loads((out / "plan.json").read_text())["plan"])
    weights = {name: t["param"] for name, t in read_full_state(str(ckpt / "step-000003")).items()}
    cfg = SampleConfig(prompt="Ham.\n", tokens=24, temperature=0.7, top_k=20, seed=0)  # recipes/default.yaml
    assert text == generate_text(weights, plan, ByteTokenizer(), cfg)
    greedy = generate_text(weights, plan, ByteTokenizer(), SampleConfig(prompt="Ham.\n", tokens=24))
    assert greedy.startswith("Ham.\n") and len(greedy) > 5

    records = load_metrics(str(out))
    assert [r["step"] for r in records] == [1, 2, 3]
    flops = plan.global_batch * model_flops_per_seq(plan.model, plan.seq_len)
    predicted = evaluate(plan.with_(precision="bf16")).cost.step_time_s
    for r in records:
        assert r["model_flops"] == pytest.approx(flops)
        per_device = r["tflops_per_gpu"] if torch.cuda.is_available() else r["tflops_per_rank"]
        assert per_device == pytest.approx(flops / r["step_time_s"] / 4 / 1e12, rel=1e-6)
        assert r["predicted_step_time_s"] == pytest.approx(predicted) and r["predicted_on"] == "h100-80gb bf16"
        if not torch.cuda.is_available():
            assert r["mfu"] is None
    assert summarize(records).median_tflops_per_gpu > 0

    # The held-out loss (recipes/default.yaml: The Tempest held out, eval every 50 steps and after the last,
    # 2 batches) is the mean cross-entropy of the step-3 weights on those batches, computed here in plain
    # PyTorch from the checkpoint; only the last step evaluated.
    import torch.nn.functional as F

    from hybridpar.data import make_token_source
    from hybridpar.runtime.llama_ref import LlamaReference, RefOptions

    assert ["eval_loss" in r for r in records] == [False, False, True]
    held = make_token_source("embedded", seq_len=plan.seq_len, global_batch_size=plan.global_batch,
                             model_vocab=plan.model.vocab, held_out=0.34).held_out_source()
    reference = LlamaReference(plan.model, weights, RefOptions(rope_base=plan.model.rope_theta))
    losses = [float(F.cross_entropy(reference.logits(b[:, :-1]).reshape(-1, plan.model.vocab), b[:, 1:].reshape(-1)))
              for b in (held.global_batch(1), held.global_batch(2))]
    assert records[2]["eval_loss"] == pytest.approx(sum(losses) / 2, abs=1e-5)
    assert f"loss {records[2]['loss']:.6f} | eval loss {records[2]['eval_loss']:.6f} ({records[2]['eval_time_s']:.2f} s) |" \
        in run.stdout
    assert 0 < records[2]["eval_time_s"] and "eval_time_s" not in records[1]
    assert "metrics: " in run.stdout and "GFLOP/s/rank" in run.stdout and "planner predicts " in run.stdout
