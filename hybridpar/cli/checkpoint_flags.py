"""``hybridpar train``'s checkpoint flags: where and how often to save, and what to resume from.

Everything here runs before any process group exists (no torch import), so bad input is one
line with exit code 2: a missing resume directory, no complete checkpoint in it, a checkpoint
of another model, already at/after the last step, or trained with other settings (another
--steps, schedule, batch or seed) unless ``--allow-changes``; a Hugging Face directory
(``--init-from-hf``) whose config or tensors do not match the recipe's model.

Checkpoints go to ``<out>/ckpt`` unless ``--save-dir`` says otherwise; saving is on when the
recipe's ``checkpoint.save`` is true or --save-dir / --save-every is given, off with --no-save.
``--resume auto`` continues from the save directory's newest usable checkpoint and starts fresh
when there is none (what a requeued job script runs). A checkpoint that ``latest`` names but that
cannot be used is named, and the older one used instead is announced with the steps it costs.
"""
from __future__ import annotations

import os
import sys
from dataclasses import replace

from hybridpar.config.run import CheckpointSettings
from hybridpar.errors import UsageError

AUTO = "auto"


def add_arguments(p) -> None:
    p.add_argument("--save-dir", help="save checkpoints into this directory instead of OUT/ckpt (turns saving on)")
    p.add_argument("--save-every", type=int, help="save every N steps (and always after the last step; turns saving on)")
    p.add_argument("--keep-last", type=int, help="keep only the newest K checkpoints (default: all)")
    p.add_argument("--no-save", action="store_true", help="save no checkpoints, whatever the recipe says")
    p.add_argument("--sync-save", action="store_true",
                   help="write every checkpoint before training goes on (default: periodic saves in the background)")
    p.add_argument("--resume", help="continue from a checkpoint: a save directory (its latest), one step-NNNNNN, "
                                    "or 'auto': the save directory's latest if there is one, else start fresh")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in a run/save directory that holds an earlier run (deletes its metrics and checkpoints)")
    p.add_argument("--init-from-hf", metavar="DIR",
                   help="start from Hugging Face Llama weights (config.json + safetensors); optimizer state fresh")
    p.add_argument("--allow-changes", action="store_true",
                   help="resume even though --steps, the LR schedule, the global batch or the seed differ from the checkpoint's")


def apply(recipe, args, out: str):
    """(recipe with the flags applied, the run's CheckpointSettings)."""
    for key in ("save_every", "keep_last"):
        value = getattr(args, key, None)
        if value is not None and value < 0:
            raise UsageError(f"--{key.replace('_', '-')} must be >= 0, got {value}")
    if args.no_save:
        saving = [flag for flag, given in (("--save-dir", args.save_dir), ("--save-every", args.save_every is not None),
                                           ("--keep-last", args.keep_last is not None), ("--sync-save", args.sync_save)) if given]
        if saving:
            raise UsageError(f"--no-save contradicts {', '.join(saving)}: give one or the other")
    if getattr(args, "allow_changes", False) and not args.resume:
        raise UsageError("--allow-changes lets a resumed run differ from its checkpoint, and this run resumes nothing: "
                         "add --resume, or drop --allow-changes")
    if args.init_from_hf and args.resume and args.resume != AUTO:
        raise UsageError("--init-from-hf and --resume both give the first weights: choose one")
    keys = ("save_every", "keep_last", "init_from_hf")
    changes = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    if args.save_dir or args.save_every is not None:
        changes["save"] = True
    if args.no_save:
        changes["save"] = False
    if args.sync_save:
        changes["async_save"] = False
    recipe = replace(recipe, checkpoint=replace(recipe.checkpoint, **changes)) if changes else recipe
    save_dir = (args.save_dir or os.path.join(out, "ckpt")) if recipe.checkpoint.save else None
    resume = args.resume
    if resume == AUTO:
        resume = save_dir if save_dir and _has_checkpoint(save_dir) else None
    if not resume:
        if recipe.checkpoint.init_from_hf:  # a fresh start from Hugging Face weights
            from hybridpar.checkpoint.hf_layout import check_hf_dir

            plan = recipe.to_plan_unresolved()
            check_hf_dir(recipe.checkpoint.init_from_hf, plan.model, plan.model.tied_embeddings)
        return recipe, _settings_of(recipe, save_dir)
    from hybridpar.checkpoint import inspect_resume

    found = inspect_resume(resume, recipe.to_plan_unresolved())
    if found.skipped and _is_launcher():
        newest = found.skipped[0]
        print(f"hybridpar train: warning: checkpoint {newest.path} is unusable ({newest.reason}); resuming from "
              f"{found.step_dir} instead: {newest.step - found.manifest.step} step(s) will be trained again",
              file=sys.stderr, flush=True)
    step = found.manifest.step
    if step >= recipe.train.steps:
        raise UsageError(f"checkpoint {found.step_dir} is at step {step}: nothing left to train with --steps {recipe.train.steps}")
    if not args.allow_changes:
        _refuse_changes(found, recipe)
    return recipe, _settings_of(recipe, save_dir, resume=found.step_dir, resumed_step=step)


def _settings_of(recipe, save_dir: str | None, **resumed) -> CheckpointSettings:
    c = recipe.checkpoint
    return CheckpointSettings(save_dir=save_dir, save_every=c.save_every, keep_last=c.keep_last,
                              background=c.async_save, init_from_hf=c.init_from_hf, **resumed)


def _is_launcher() -> bool:
    """Only the launching process (or rank 0 under a cluster launcher) speaks before training."""
    return os.environ.get("RANK", "0") == "0"


def _has_checkpoint(save_dir: str) -> bool:
    from hybridpar.checkpoint.files import complete_steps

    return os.path.isdir(save_dir) and bool(complete_steps(save_dir))


# What a resumed run must share with the run that saved the checkpoint, unless --allow-changes:
# (name, the checkpoint's value, this run's value, the flag or key that sets it).
def _settings(manifest, recipe) -> list[tuple[str, object, object, str]]:
    t, optim = recipe.train, manifest.optim
    return [
        ("total steps", optim.get("total_steps"), t.steps, "--steps"),
        ("peak LR", optim.get("lr"), t.lr, "train.lr"),
        ("minimum LR", optim.get("min_lr"), t.min_lr, "train.min_lr"),
        ("warm-up steps", optim.get("warmup_steps"), t.warmup_steps, "train.warmup_steps"),
        ("LR scaling base batch", optim.get("lr_scale_base_batch"), t.lr_scale_base_batch, "train.lr_scale_base_batch"),
        ("LR decay", optim.get("lr_decay"), t.lr_decay, "train.lr_decay"),
        ("WSD decay steps", optim.get("wsd_decay_steps"), t.wsd_decay_steps, "train.wsd_decay_steps"),
        ("WSD decay shape", optim.get("wsd_decay"), t.wsd_decay, "train.wsd_decay"),
        ("global batch", manifest.plan.get("global_batch"), t.global_batch, "--global-batch"),
        ("seed", manifest.seed, t.seed, "--seed"),
        ("held-out share of the data", manifest.data.get("held_out"), recipe.data.held_out, "data.held_out"),
        ("data blend", manifest.data.get("blend"), recipe.data.blend, "data.blend"),
    ]


def _refuse_changes(found, recipe) -> None:
    for name, saved, now, how in _settings(found.manifest, recipe):
        if saved is not None and saved != now:
            raise UsageError(f"checkpoint {found.step_dir} was trained with {name} {saved}, this run has {now} ({how}): "
                             f"resuming would silently change the run; use {how} {saved}, or pass --allow-changes")
