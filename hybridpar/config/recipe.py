"""Recipes: one YAML file that says what to train and how to lay it out.

```yaml
name: tiny
model: tiny            # a preset name (topology.models.PRESETS), a .json/.yaml path, or a mapping of ModelSpec keys
parallel: {tp: 2, pp: 2, dp: 2, cp: 1, vpp: 1, zero: 1, micro_batch: 2, sequence_parallel: false, order: tp-cp-pp-dp,
           recompute: none,  # activation recomputation: none | selective (core attention) | full (whole layers)
           overlap_grad_reduce: true,    # DP gradient reduction during the last backward (hybridpar.grad_sync)
           overlap_param_gather: true}   # ZeRO 1/2 weight gather behind the next forward (hybridpar.param_gather)
train: {global_batch: 16, seq_len: 32, steps: 5, lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 2,
        lr_decay: cosine,   # cosine | linear | constant | wsd (with wsd_decay_steps, wsd_decay) (hybridpar.config.optim)
        weight_decay: 0.1, grad_clip: 1.0, seed: 0, precision: auto}
data: {source: synthetic}   # or {source: embedded, tokenizer: byte} / {source: indexed, path: PREFIX}
cluster: {gpu: h100-80gb, gpus_per_node: 8,   # a GPU recipe: refuses to train without CUDA unless --allow-cpu
          gpus: 128}   # the fleet it is planned for: the default of plan/memory --gpus and launch --nodes
checkpoint: {save: true, save_every: 50, keep_last: 0,   # into OUT/ckpt (or --save-dir): hybridpar.checkpoint
             init_from_hf: hf/llama}   # start from Hugging Face weights (hybridpar.checkpoint.hf_import)
generate: {prompt: "Ham.\n", tokens: 200, temperature: 0.0}    # a sample after the last step (hybridpar.generate)
eval: {every: 50, batches: 2}   # held-out loss (hybridpar.observe.evaluation); indexed data needs data.held_out
```

Every section and key is optional except ``model`` and ``train.global_batch``/``seq_len``;
unknown keys, wrong types and every layout rule of ``topology.plan.Plan`` are errors, found
by ``load_recipe``/``Recipe.validate`` before any process starts. ``parallel.dp`` may be left
out: it is then derived from the world size (dp = world / (tp x cp x pp)).

Extension points: a new section is one dataclass in ``SECTIONS`` (hybridpar/config/sections.py); data sources are whatever ``hybridpar.data.make_token_source`` knows.
"""
from __future__ import annotations

import math
import re

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Optional, Union, get_args, get_origin, get_type_hints

from hybridpar.topology.hardware import HardwareError, load_gpu
from hybridpar.topology.layout import ORDERS
from hybridpar.topology.models import PRESETS, ModelSpec, ModelSpecError, load_model, model_from_dict
from hybridpar.topology.plan import Plan
from hybridpar.topology.software import HYBRIDPAR
from hybridpar.topology.spec_files import read_mapping

from hybridpar.config.mixture import BLOCK, block_counts
from hybridpar.config.optim import LR_DECAYS, WSD_DECAYS, OptimConfig, OptimizerSettings
from hybridpar.config.sections import (PRECISIONS, SECTIONS, TOP_KEYS, ZERO_STAGES, CheckpointSection, ClusterSection,
                                       DataSection, EvalSection, GenerateSection, ParallelSection, ReliabilitySection,
                                       TrainSection)
from hybridpar.errors import UsageError


@dataclass(frozen=True)
class Recipe:
    model: ModelSpec
    name: str = "recipe"
    parallel: ParallelSection = field(default_factory=ParallelSection)
    train: TrainSection = field(default_factory=TrainSection)
    data: DataSection = field(default_factory=DataSection)
    cluster: ClusterSection = field(default_factory=ClusterSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    reliability: ReliabilitySection = field(default_factory=ReliabilitySection)
    generate: GenerateSection = field(default_factory=GenerateSection)
    eval: EvalSection = field(default_factory=EvalSection)

    # --- derived ------------------------------------------------------------------------
    def model_parallel_size(self) -> int:
        p = self.parallel
        return p.tp * p.cp * p.pp

    def with_world(self, world: int) -> "Recipe":
        """Fill in dp from the world size, or check it against the world size."""
        p, mp = self.parallel, self.model_parallel_size()
        if p.dp is None:
            if world % mp:
                raise UsageError(f"world size {world} is not divisible by tp x cp x pp = {p.tp} x {p.cp} x {p.pp}")
            return replace(self, parallel=replace(p, dp=world // mp))
        if p.dp * mp != world:
            raise UsageError(
                f"world size {world} != tp x cp x pp x dp = {p.tp} x {p.cp} x {p.pp} x {p.dp} = {p.dp * mp}"
            )
        return self

    def planned_world(self) -> Optional[int]:
        """The world size the recipe states: ``cluster.gpus``, else tp x cp x pp x dp when dp is pinned."""
        if self.cluster.gpus is not None:
            return self.cluster.gpus
        return self.model_parallel_size() * self.parallel.dp if self.parallel.dp is not None else None

    def resolved_precision(self, cuda: bool) -> str:
        """``auto``: bf16 where the run has CUDA, fp32 on CPU ranks."""
        if self.train.precision != "auto":
            return self.train.precision
        return "bf16" if cuda else "fp32"

    def to_plan(self, cuda: bool = False) -> Plan:
        """The layout Plan; ``cuda`` resolves precision ``auto`` (the caller knows the machine)."""
        p, t = self.parallel, self.train
        model = self.model
        if t.tied_embeddings is not None and t.tied_embeddings != model.tied_embeddings:
            model = replace(model, tied_embeddings=t.tied_embeddings)
        return Plan(
            model=model, seq_len=t.seq_len, global_batch=t.global_batch, tp=p.tp, cp=p.cp, pp=p.pp,
            dp=p.dp if p.dp is not None else 1, vpp=p.vpp, micro_batch=p.micro_batch, zero_stage=p.zero,
            sequence_parallel=p.sequence_parallel, precision=self.resolved_precision(cuda), order=p.order,
            recompute=p.recompute,
            **({"gpu": self.cluster.gpu} if self.cluster.gpu else {}), gpus_per_node=self.cluster.gpus_per_node,
        ).with_default_split()

    def optim_config(self) -> OptimConfig:
        t = self.train
        shared = {f.name: getattr(t, f.name) for f in fields(OptimizerSettings)}
        return OptimConfig(**shared, total_steps=t.steps)

    # --- validation ---------------------------------------------------------------------
    def problems(self) -> list[str]:
        """Every reason this recipe cannot run (beyond the world size), each one line."""
        p, t, out = self.parallel, self.train, []
        if p.order not in ORDERS:
            out.append(f"parallel.order {p.order!r} unknown; choose one of {', '.join(ORDERS)}")
        if p.zero not in ZERO_STAGES:
            out.append(f"parallel.zero {p.zero} not supported: use 0, 1 or 2 (ZeRO-3 is not part of this runtime)")
        if p.recompute not in HYBRIDPAR.recompute_modes:
            out.append(f"parallel.recompute must be one of {', '.join(HYBRIDPAR.recompute_modes)}, got {p.recompute!r}")
        if t.precision not in PRECISIONS:
            out.append(f"train.precision must be one of {', '.join(PRECISIONS)}, got {t.precision!r}")
        for key in ("steps", "global_batch", "seq_len"):
            if getattr(t, key) < 1:
                out.append(f"train.{key} must be a positive integer, got {getattr(t, key)}")
        for key in ("warmup_steps", "lr_scale_base_batch", "seed"):
            if getattr(t, key) < 0:
                out.append(f"train.{key} must be >= 0, got {getattr(t, key)}")
        for key in ("min_lr", "weight_decay", "grad_clip", "eps"):
            if getattr(t, key) < 0:
                out.append(f"train.{key} must be >= 0, got {getattr(t, key)}")
        if t.lr <= 0:
            out.append(f"train.lr must be > 0, got {t.lr}: the weights would never change")
        elif t.min_lr > t.lr and t.lr_decay != "constant":
            default = " (its default)" if t.min_lr == TrainSection.min_lr else ""
            out.append(f"train.min_lr {t.min_lr:g}{default} is above train.lr {t.lr:g}: the {t.lr_decay} decay would "
                       f"rise instead; set min_lr <= lr")
        out.extend(self._schedule_problems())
        if p.dp is not None and p.dp < 1:
            out.append(f"parallel.dp must be a positive integer, got {p.dp}")
        if p.tp > 0 and self.model.vocab % p.tp:
            out.append(f"vocab {self.model.vocab} not divisible by tp {p.tp} (vocab-parallel embedding)")
        for key in ("save_every", "keep_last"):
            if getattr(self.checkpoint, key) < 0:
                out.append(f"checkpoint.{key} must be >= 0, got {getattr(self.checkpoint, key)}")
        rel = self.reliability
        if rel.timeout_s < 1:
            out.append(f"reliability.timeout_s must be >= 1 (seconds), got {rel.timeout_s}")
        if rel.check_replicas < 0:
            out.append(f"reliability.check_replicas must be >= 0 (0: never), got {rel.check_replicas}")
        if rel.on_drift not in ("stop", "warn"):
            out.append(f"reliability.on_drift must be stop or warn, got {rel.on_drift!r}")
        out.extend(self._tolerance_problems())
        g = self.generate
        for key in ("tokens", "temperature", "top_k"):
            if getattr(g, key) < 0:
                out.append(f"generate.{key} must be >= 0, got {getattr(g, key)}")
        c = self.cluster
        if c.gpus_per_node < 1:
            out.append(f"cluster.gpus_per_node must be a positive integer, got {c.gpus_per_node}")
        if c.gpu:
            try:
                load_gpu(c.gpu)
            except HardwareError as err:
                out.append(f"cluster.gpu: {err}")
        if self.data.source == "indexed" and not self.data.path and self.data.blend is None:
            out.append("data.source indexed needs data.path (the .bin/.idx prefix) or data.blend")
        out.extend(self._blend_problems())
        out.extend(self._eval_problems())
        if not out:
            plan = self.to_plan_unresolved()
            out.extend(plan.violations())
        return out

    def warnings(self) -> list[str]:
        """Settings that are legitimate in a short trial but rarely meant in a real run (of a recipe
        validated for its world size)."""
        t, p, out = self.train, self.parallel, []
        if t.warmup_steps > t.steps:
            out.append(f"train.warmup_steps {t.warmup_steps} is longer than the run's {t.steps} steps: it ends during "
                       f"warm-up at {t.steps / t.warmup_steps:.1%} of lr {t.lr:g} and never decays (fine for a short "
                       f"trial; set warmup_steps below steps for a real run)")
        world = self.model_parallel_size() * p.dp if p.dp is not None else None
        if self.cluster.gpus is not None and world is not None and world != self.cluster.gpus:
            ranks = f"{world} rank{'s' if world != 1 else ''} (tp {p.tp} x cp {p.cp} x pp {p.pp} x dp {p.dp})"
            out.append(f"the recipe is planned for cluster.gpus {self.cluster.gpus} GPUs and this run has {ranks}: "
                       f"fine for a trial; the planner's figures for the recipe are for {self.cluster.gpus}")
        return out

    def cluster_size_problems(self) -> list[str]:
        """cluster.gpus against the layout as written; flags may change the layout, and training takes the
        launcher's world size, so only the file is held to it (load_recipe)."""
        c, p, mp = self.cluster, self.parallel, self.model_parallel_size()
        if c.gpus is None:
            return []
        if c.gpus < 1:
            return [f"cluster.gpus must be a positive integer, got {c.gpus}"]
        if p.dp is not None and p.dp * mp != c.gpus:
            return [f"cluster.gpus {c.gpus} != tp x cp x pp x dp = {p.tp} x {p.cp} x {p.pp} x {p.dp} = {p.dp * mp}; "
                    f"drop parallel.dp (it then follows the world size) or make the two agree"]
        if mp > 0 and c.gpus % mp:
            return [f"cluster.gpus {c.gpus} is not divisible by tp x cp x pp = {p.tp} x {p.cp} x {p.pp}"]
        if c.gpus > c.gpus_per_node >= 1 and c.gpus % c.gpus_per_node:
            return [f"cluster.gpus {c.gpus} does not fill whole nodes of cluster.gpus_per_node {c.gpus_per_node}"]
        return []

    def _schedule_problems(self) -> list[str]:
        t = self.train
        if t.lr_decay not in LR_DECAYS:
            return [f"train.lr_decay must be one of {', '.join(LR_DECAYS)}, got {t.lr_decay!r}"]
        if t.wsd_decay not in WSD_DECAYS:
            return [f"train.wsd_decay must be one of {', '.join(WSD_DECAYS)}, got {t.wsd_decay!r}"]
        if t.lr_decay != "wsd":
            if t.wsd_decay_steps:
                return [f"train.wsd_decay_steps applies to train.lr_decay wsd, this recipe decays {t.lr_decay}: "
                        f"set lr_decay: wsd or drop wsd_decay_steps"]
            return []
        if t.wsd_decay_steps < 1 or t.warmup_steps + t.wsd_decay_steps > t.steps:
            example = max(1, t.steps // 5)
            return [f"train.lr_decay wsd needs train.wsd_decay_steps, the last steps that decay to min_lr, from 1 to "
                    f"steps - warmup_steps = {max(0, t.steps - t.warmup_steps)}, got {t.wsd_decay_steps} (e.g. "
                    f"{example}, a fifth of the run)"]
        return []

    def _blend_problems(self) -> list[str]:
        d = self.data
        if d.blend is None:
            return []
        example = "e.g. {data/web: 0.7, data/code: 0.3}"
        if d.source != "indexed":
            return [f"data.blend mixes indexed datasets: set data.source indexed (it is {d.source})"]
        if d.path:
            return ["data.path and data.blend both name the data: give one of them"]
        if not isinstance(d.blend, dict) or not d.blend:
            return [f"data.blend must map each dataset prefix to its weight, {example}, got {d.blend!r}"]
        for prefix, weight in d.blend.items():
            if not isinstance(prefix, str) or not prefix:
                return [f"data.blend keys are dataset prefixes (PREFIX.bin/.idx), {example}, got {prefix!r}"]
            ok = isinstance(weight, (int, float)) and not isinstance(weight, bool) and math.isfinite(weight) and weight > 0
            if not ok:
                return [f"data.blend weight of {prefix} must be a positive number, got {weight!r}"]
        counts = block_counts([float(w) for w in d.blend.values()])
        for prefix, count in zip(d.blend, counts):
            if count == 0:
                return [f"data.blend weight of {prefix} is below 1/{BLOCK} of the total: it would never be sampled; "
                        f"raise it or drop the dataset"]
        return []

    def _eval_problems(self) -> list[str]:
        e, d, out = self.eval, self.data, []
        if e.every < 0:
            out.append(f"eval.every must be >= 0 (0: never), got {e.every}")
        if e.batches < 1:
            out.append(f"eval.batches must be a positive integer, got {e.batches}")
        if not 0 <= d.held_out < 1:
            out.append(f"data.held_out is the share of the data kept out of training, from 0 to below 1, got {d.held_out:g}")
        elif d.source == "synthetic" and d.held_out:
            out.append("data.held_out splits indexed and embedded data; synthetic data draws its held-out rows apart "
                       "from training's: drop data.held_out")
        elif d.source != "synthetic" and e.every and not d.held_out:
            out.append(f"eval.every {e.every} needs held-out data: set data.held_out, the share of the sequences kept out "
                       f"of training (e.g. 0.05)")
        return out

    def _tolerance_problems(self) -> list[str]:
        """A run that tolerates the loss of a replica must be able to go on with one fewer and the
        same global batch (more micro-batches per survivor)."""
        rel, p, t = self.reliability, self.parallel, self.train
        if rel.rejoin_after_s is not None and not (rel.tolerate_replica_loss and rel.rejoin_after_s > 0):
            return [f"reliability.rejoin_after_s {rel.rejoin_after_s}: a positive number of seconds, with tolerate_replica_loss"]
        if not rel.tolerate_replica_loss or p.dp is None:
            return []
        if p.dp < 2:
            return [f"--tolerate-replica-loss needs at least 2 DP replicas, this layout has {p.dp}: give a smaller "
                    f"--tp/--pp/--cp or more ranks"]
        if t.global_batch % (p.micro_batch * (p.dp - 1)):
            step = p.micro_batch * p.dp * (p.dp - 1)
            return [f"--tolerate-replica-loss: global batch {t.global_batch} cannot be split over {p.dp - 1} replicas of "
                    f"micro-batch {p.micro_batch} after a loss; use a multiple of {step} (e.g. {step * max(1, t.global_batch // step)})"]
        return []

    def to_plan_unresolved(self) -> Plan:
        """The Plan for checks that do not depend on the machine (precision ``auto`` as fp32)."""
        return self.to_plan(cuda=False)

    def validate(self, world: Optional[int] = None) -> "Recipe":
        recipe = self.with_world(world) if world is not None else self
        problems = recipe.problems()
        if problems:
            raise UsageError(problems[0])
        return recipe


# --- loading --------------------------------------------------------------------------
def _type_ok(value, hint) -> bool:
    if get_origin(hint) is Union:
        return any(_type_ok(value, h) for h in get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:  # YAML reads .nan and .inf as floats: no rate, decay or time is one
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    return True


def _type_name(hint) -> str:
    if get_origin(hint) is Union:
        return " or ".join(_type_name(h) for h in get_args(hint) if h is not type(None))
    return {int: "an integer", float: "a finite number", bool: "true/false", str: "a string"}.get(hint, str(hint))


_YAML_11_EXPONENT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _section(cls, data, name: str):
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise UsageError(f"recipe section '{name}' must be a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    allowed = [f.name for f in fields(cls)]
    unknown = sorted(set(map(str, data)) - set(allowed))
    if unknown:
        raise UsageError(f"unknown key '{name}.{unknown[0]}' in recipe; allowed in '{name}': {', '.join(allowed)}")
    for key, value in data.items():
        if isinstance(value, str) and _YAML_11_EXPONENT.match(value) and _type_ok(1.0, hints[key]):
            value = float(value)  # PyYAML reads 3e-4 (no dot) as text: it is the number written
            data = dict(data, **{key: value})
        if not _type_ok(value, hints[key]):
            raise UsageError(f"recipe key '{name}.{key}' must be {_type_name(hints[key])}, got {value!r}")
        if hints[key] is float and isinstance(value, int):
            data = dict(data, **{key: float(value)})
    return cls(**data)


def _model(value, source: str) -> ModelSpec:
    try:
        if isinstance(value, str):
            if value in PRESETS:
                return PRESETS[value]
            path = Path(value)
            if not path.is_absolute() and source and not path.exists():
                candidate = Path(source).parent / path
                if candidate.exists():
                    path = candidate
            return load_model(str(path))
        if isinstance(value, dict):
            return model_from_dict(value, "model")
    except ModelSpecError as err:
        raise UsageError(str(err)) from None
    raise UsageError(f"recipe key 'model' must be a preset name, a model file or a mapping, got {value!r}")


def recipe_from_dict(data, source: str = "recipe") -> Recipe:
    if not isinstance(data, dict):
        raise UsageError(f"recipe {source}: expected a mapping at the top level, got {type(data).__name__}")
    unknown = sorted(set(map(str, data)) - set(TOP_KEYS))
    if unknown:
        raise UsageError(f"unknown key '{unknown[0]}' in recipe {source}; allowed: {', '.join(TOP_KEYS)}")
    if "model" not in data:
        raise UsageError(f"recipe {source} has no 'model' key")
    name = data.get("name", Path(source).stem)
    if not isinstance(name, str):
        raise UsageError(f"recipe key 'name' must be a string, got {name!r}")
    if not name.strip() or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise UsageError(f"recipe key 'name' must be a plain name (the run directory is runs/NAME), got {name!r}")
    sections = {key: _section(cls, data.get(key), key) for key, cls in SECTIONS.items()}
    return Recipe(model=_model(data["model"], source), name=name, **sections)


def load_recipe(path: str) -> Recipe:
    """Read and check a recipe file (types and keys, cluster.gpus against the layout it writes; layout
    rules via ``Recipe.validate``)."""
    data = read_mapping(path, "recipe", UsageError)
    recipe = recipe_from_dict(data, path)
    problems = recipe.cluster_size_problems()
    if problems:
        raise UsageError(problems[0])
    return recipe


def with_overrides(recipe: Recipe, **flags) -> Recipe:
    """Command-line flags over the recipe. Keys: tp pp dp cp vpp zero micro_batch recompute global_batch steps seed
    eval_every."""
    parallel_keys = {"tp", "pp", "dp", "cp", "vpp", "zero", "micro_batch", "sequence_parallel", "recompute"}
    train_keys = {"global_batch", "steps", "seed", "seq_len", "lr", "precision"}
    par = {k: v for k, v in flags.items() if k in parallel_keys and v is not None}
    tr = {k: v for k, v in flags.items() if k in train_keys and v is not None}
    ev = {"every": flags["eval_every"]} if flags.get("eval_every") is not None else {}
    unknown = set(flags) - parallel_keys - train_keys - {"eval_every"}
    if unknown:
        raise UsageError(f"unknown override(s): {', '.join(sorted(unknown))}")
    if any(k in par for k in ("tp", "pp", "cp")) and "dp" not in par:
        par["dp"] = None  # re-derive dp from the world size for the new model-parallel size
    return replace(recipe, parallel=replace(recipe.parallel, **par), train=replace(recipe.train, **tr),
                   eval=replace(recipe.eval, **ev))
