"""Text from the trained model: gather the canonical weights, sample on rank 0.

``SampleHook`` (a ``train()`` hook) runs after the last step: every rank takes part in
``job.full_state_dict()`` (TP shards gathered, pipeline stages merged: the one-process weights,
whatever the layout), then rank 0 runs ``hybridpar.llama_ref.LlamaReference`` on them, decodes
with the data source's tokenizer, prints the text and writes ``OUT/sample.txt``. Greedy when
``temperature`` is 0, else softmax sampling at that temperature (optionally top-k) from a
generator seeded by ``seed``. The context is the last ``seq_len`` tokens (the model never saw
positions beyond its training length). Only for models whose full weights fit on one rank.
"""
from __future__ import annotations

import os

import torch

from hybridpar.config.sections import GenerateSection
from hybridpar.runtime.llama_ref import LlamaReference, RefOptions


def sample_ids(model: LlamaReference, prompt: list[int], n: int, context: int, vocab: int,
               cfg: GenerateSection) -> list[int]:
    """``n`` new token ids after ``prompt``; ids >= ``vocab`` (model padding) are never chosen."""
    gen = torch.Generator().manual_seed(cfg.seed)
    device = model.device
    ids = list(prompt)
    for _ in range(n):
        logits = model.logits(torch.tensor([ids[-context:]], dtype=torch.long, device=device))[0, -1, :vocab].cpu()
        if cfg.temperature <= 0:
            nxt = int(logits.argmax())
        else:
            logits = logits / cfg.temperature
            if 0 < cfg.top_k < vocab:
                kth = logits.topk(cfg.top_k).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = int(torch.multinomial(logits.softmax(-1), 1, generator=gen))
        ids.append(nxt)
    return ids[len(prompt):]


def generate_text(weights: dict, plan, tokenizer, cfg: GenerateSection, tied: bool | None = None) -> str:
    """The prompt and its continuation, decoded."""
    model = LlamaReference(plan.model, weights, RefOptions(rope_base=plan.model.rope_theta), tied=tied)
    prompt = tokenizer.encode(cfg.prompt) or [tokenizer.eod]
    vocab = min(tokenizer.vocab_size, plan.model.vocab)
    new = sample_ids(model, prompt, cfg.tokens, plan.seq_len, vocab, cfg)
    return cfg.prompt + tokenizer.decode(new)


class SampleHook:
    """``train(..., hooks=[SampleHook(cfg, last_step, out_dir)])``: a sample after the last step."""

    def __init__(self, cfg: GenerateSection, last_step: int, out_dir: str | None = None, print_fn=print):
        self.cfg, self.last_step, self.out_dir, self.print_fn = cfg, last_step, out_dir, print_fn
        self.text: str | None = None

    def on_step(self, job, metrics) -> None:
        if metrics.step != self.last_step or self.cfg.tokens <= 0:
            return
        import torch.distributed as dist

        tokenizer = getattr(job.source, "tokenizer", None)
        if tokenizer is None:  # synthetic tokens: nothing to decode
            if dist.get_rank() == 0 and self.print_fn:
                self.print_fn("sample: skipped (the data source has no tokenizer)")
            return
        weights = job.full_state_dict()  # collective: every rank sends, rank 0 gets them on its CPU
        if dist.get_rank() != 0:
            return
        self.text = generate_text(weights, job.plan, tokenizer, self.cfg, tied=job.tied)
        how = "greedy" if self.cfg.temperature <= 0 else f"temperature {self.cfg.temperature:g}"
        if self.print_fn:
            self.print_fn(f"sample ({self.cfg.tokens} tokens, {how}, model after step {metrics.step}):\n{self.text}")
        if self.out_dir:
            from hybridpar.files import write_atomic

            os.makedirs(self.out_dir, exist_ok=True)
            write_atomic(os.path.join(self.out_dir, "sample.txt"), self.text + "\n")
