"""The sections of a recipe file, one frozen dataclass each, with their defaults
(hybridpar/config/recipe.py reads a file into them and checks it; docs/training.md tables every key)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hybridpar.topology.layout import DEFAULT_ORDER

from hybridpar.config.optim import OptimizerSettings

PRECISIONS = ("auto", "fp32", "bf16")
ZERO_STAGES = (0, 1, 2)


@dataclass(frozen=True)
class ParallelSection:
    tp: int = 1
    pp: int = 1
    dp: Optional[int] = None  # None: world / (tp x cp x pp)
    cp: int = 1
    vpp: int = 1
    zero: int = 1
    micro_batch: int = 1
    sequence_parallel: bool = False
    order: str = DEFAULT_ORDER
    recompute: str = "none"  # none | selective | full (hybridpar.model.transformer_config)
    # DP gradient reduction issued bucket by bucket during the last backward (hybridpar.grad_sync);
    # false: DeepSpeed reduces after the backward.
    overlap_grad_reduce: bool = True
    # ZeRO 1/2: the updated weights gathered bucket by bucket behind the next forward
    # (hybridpar.param_gather); false: DeepSpeed gathers them inside its step.
    overlap_param_gather: bool = True


@dataclass(frozen=True)
class TrainSection(OptimizerSettings):
    """Batch, length, seed and precision, with AdamW and its schedule (config/optim.py's fields)."""

    global_batch: int = 0
    seq_len: int = 0
    steps: int = 10
    seed: int = 0
    precision: str = "auto"  # auto: fp32 on CPU, bf16 on GPU
    tied_embeddings: Optional[bool] = None  # None: the model's own setting (untied for Llama)


@dataclass(frozen=True)
class DataSection:
    source: str = "synthetic"  # synthetic | embedded | indexed (hybridpar.data.make_token_source)
    path: Optional[str] = None
    tokenizer: Optional[str] = None
    data_dir: Optional[str] = None
    cache_dir: Optional[str] = None
    # A mixture of indexed datasets instead of one path: {prefix: weight} (hybridpar.data.blend).
    blend: Optional[dict] = None
    # Share of an indexed or embedded dataset's sequences kept out of training for evaluation:
    # megatron's validation split, the last sequences in file order (hybridpar.data.held_out).
    held_out: float = 0.0


@dataclass(frozen=True)
class ClusterSection:
    """The GPUs the recipe is for. A recipe that names a GPU refuses to train on a machine without
    CUDA unless ``--allow-cpu`` (commands/train.py); without one it is a CPU recipe, and the planner
    figures it shows are for the planner's default GPU."""

    gpu: Optional[str] = None
    gpus_per_node: int = 8
    # The GPU count the layout was planned for: the default of --gpus (plan, memory) and --nodes
    # (launch). Training takes its world size from the launcher, and an unpinned dp follows it.
    gpus: Optional[int] = None


@dataclass(frozen=True)
class CheckpointSection:
    """Whether and how often to save (hybridpar.checkpoint), and where the first weights come from.
    Checkpoints go to the run directory's ckpt/ (``--out``), or to ``--save-dir``;
    ``--save-every``/``--keep-last``/``--no-save``/``--sync-save``/``--init-from-hf`` override."""

    save: bool = False
    save_every: int = 0  # 0: only after the last step (and at an early stop)
    keep_last: int = 0  # 0: keep every checkpoint
    async_save: bool = True  # periodic saves written in the background while training goes on
    # A Hugging Face Llama directory to take the initial weights from (``--init-from-hf``);
    # optimizer state starts fresh; ignored when the run resumes from a checkpoint.
    init_from_hf: Optional[str] = None


@dataclass(frozen=True)
class ReliabilitySection:
    """Failure handling (hybridpar.reliability_cli); ``--timeout-s``/``--check-replicas``/``--on-drift`` override."""

    timeout_s: int = 600  # process-group timeout: a stuck collective fails after this long
    check_replicas: int = 0  # every N steps, check DP replicas are bit-identical (0: never)
    on_drift: str = "stop"  # stop (exit 3) | warn
    # A lost DP replica is dropped and the survivors go on (hybridpar.reliability.replica_loss);
    # local runs only (hybridpar train --nproc).
    tolerate_replica_loss: bool = False
    rejoin_after_s: Optional[float] = None  # start a lost replica again this many seconds later


@dataclass(frozen=True)
class GenerateSection:
    """A text sample from the trained model after the last step (hybridpar.generate);
    ``--sample-prompt``/``--sample-tokens`` override."""

    prompt: str = ""
    tokens: int = 0  # 0: no sample
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: whole vocabulary
    seed: int = 0


@dataclass(frozen=True)
class EvalSection:
    """Loss on held-out data (hybridpar.observe.evaluation): after every ``every`` steps and after
    the last, the mean loss over ``batches`` global batches of held-out sequences, the same ones
    each time; ``--eval-every`` overrides. Indexed and embedded data hold them out with
    ``data.held_out``; synthetic data draws them from a stream of their own."""

    every: int = 0  # 0: never
    batches: int = 1


SECTIONS = {"parallel": ParallelSection, "train": TrainSection, "data": DataSection, "cluster": ClusterSection,
            "checkpoint": CheckpointSection, "reliability": ReliabilitySection, "generate": GenerateSection,
            "eval": EvalSection}
TOP_KEYS = ("name", "model", *SECTIONS)
