"""The resolved run: the one object the runtime receives.

``RunPlan`` holds everything a training run does, resolved from the recipe and the command line
before any rank starts: the layout Plan (model, batch, TP/CP/PP/DP, micro-batch, ZeRO,
recomputation, precision), the optimizer and its schedule, the data, the overlaps, where and how
often to save and what to resume from, failure handling, the sample, the held-out evaluation, when
to stop early, what to profile, and the run directory. ``hybridpar train`` builds it once (cli/commands/train.py), writes it to
``OUT/plan.json`` and hands that file to the local ranks, which read it instead of re-parsing
flags; plan.json is thus the complete record of how to reproduce the run.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Optional

from hybridpar.config.optim import OptimConfig
from hybridpar.config.sections import DataSection, EvalSection, GenerateSection, ReliabilitySection
from hybridpar.topology.plan import Plan

FORMAT = "hybridpar-run-plan"


@dataclass(frozen=True)
class CheckpointSettings:
    save_dir: Optional[str] = None  # None: this run saves no checkpoints
    save_every: int = 0  # 0: only after the last step and at an early stop
    keep_last: int = 0  # 0: every checkpoint is kept
    background: bool = True  # periodic saves written on a thread while training goes on
    resume: Optional[str] = None  # the step directory this run continues from
    resumed_step: int = 0
    init_from_hf: Optional[str] = None  # Hugging Face weights a fresh run starts from


@dataclass(frozen=True)
class StopSettings:
    stop_at_step: Optional[int] = None
    exit_after_s: Optional[float] = None


@dataclass(frozen=True)
class ProfileSettings:
    """``--profile-steps A-B --profile-ranks R,..|all`` (observe/profile.py)."""

    first_step: int = 0  # 0: no profile
    last_step: int = 0
    ranks: list = field(default_factory=lambda: [0])  # global ranks; empty: every rank

    @property
    def on(self) -> bool:
        return self.first_step > 0

    def covers(self, rank: int) -> bool:
        return not self.ranks or rank in self.ranks


@dataclass(frozen=True)
class RunPlan:
    name: str
    plan: Plan
    optim: OptimConfig
    seed: int
    data: DataSection
    out: str  # the run directory
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    checkpoint: CheckpointSettings = CheckpointSettings()
    reliability: ReliabilitySection = ReliabilitySection()
    sample: GenerateSection = GenerateSection()
    eval: EvalSection = EvalSection()
    stop: StopSettings = StopSettings()
    profile: ProfileSettings = ProfileSettings()
    progress: Optional[bool] = None  # rank 0's progress bar; None: when stdout is a terminal
    recipe: Optional[str] = None  # the recipe file it came from (provenance only)

    @property
    def steps(self) -> int:
        return self.optim.total_steps

    def to_dict(self) -> dict:
        data = asdict(self)
        data["plan"] = self.plan.to_dict()
        return {"format": FORMAT, **data}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "RunPlan":
        if data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} (format {data.get('format')!r})")
        sections = {"optim": OptimConfig, "data": DataSection, "checkpoint": CheckpointSettings,
                    "reliability": ReliabilitySection, "sample": GenerateSection, "stop": StopSettings,
                    "eval": EvalSection, "profile": ProfileSettings}
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values["plan"] = Plan.from_dict(values["plan"])
        for name, section in sections.items():
            if name in values:
                values[name] = section(**values[name])
        return cls(**values)

    def save(self, path: str) -> None:
        """Write atomically (a temp file renamed into place)."""
        from hybridpar.files import write_atomic

        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_atomic(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: str) -> "RunPlan":
        with open(path) as f:
            return cls.from_dict(json.load(f))
