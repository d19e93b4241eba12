"""``hybridpar train``'s checkpoint flags: --save-dir, --save-every, --keep-last, --resume, --init-from-hf.

Everything here runs before any process group exists (no torch import), so bad input is one
line with exit code 2: a missing resume directory, no complete checkpoint in it, a checkpoint
of another model or already at/after the last step, a missing or truncated file, a Hugging Face
directory whose config or tensors do not match the recipe's model.
"""
from __future__ import annotations

from dataclasses import replace

from ..cli_flags import flags_argv
from ..errors import UsageError

FLAGS = ("save_dir", "save_every", "keep_last", "resume", "init_from_hf")


def add_arguments(p) -> None:
    p.add_argument("--save-dir", help="save checkpoints into this directory (step-NNNNNN/, latest)")
    p.add_argument("--save-every", type=int, help="save every N steps (and always after the last step)")
    p.add_argument("--keep-last", type=int, help="keep only the newest K checkpoints (default: all)")
    p.add_argument("--resume", help="continue from a checkpoint: a save directory (its latest) or one step-NNNNNN")
    p.add_argument("--init-from-hf", metavar="DIR",
                   help="start from Hugging Face Llama weights (config.json + safetensors); optimizer state fresh")


def apply(recipe, args):
    """The recipe with the checkpoint flags applied, and ``--resume`` checked against it."""
    for key in ("save_every", "keep_last"):
        value = getattr(args, key, None)
        if value is not None and value < 0:
            raise UsageError(f"--{key.replace('_', '-')} must be >= 0, got {value}")
    if getattr(args, "init_from_hf", None) and getattr(args, "resume", None):
        raise UsageError("--init-from-hf and --resume both give the first weights: choose one")
    keys = ("save_dir", "save_every", "keep_last", "init_from_hf")
    changes = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    recipe = replace(recipe, checkpoint=replace(recipe.checkpoint, **changes)) if changes else recipe
    if recipe.checkpoint.init_from_hf and not getattr(args, "resume", None):
        from .hf_layout import check_hf_dir

        plan = recipe.to_plan_unresolved()
        check_hf_dir(recipe.checkpoint.init_from_hf, plan.model, plan.model.tied_embeddings)
    if getattr(args, "resume", None):
        from . import inspect_resume

        _, step = inspect_resume(args.resume, recipe.to_plan_unresolved())
        if step >= recipe.train.steps:
            raise UsageError(f"checkpoint {args.resume} is at step {step}: nothing left to train with --steps {recipe.train.steps}")
    return recipe


def argv(args) -> list[str]:
    """The flags again, for the ranks' command line."""
    return flags_argv(args, FLAGS)


def hooks(recipe, args, print_fn=print) -> list:
    """The train() hooks for this run (none when it neither saves nor resumes)."""
    c = recipe.checkpoint
    resume = getattr(args, "resume", None)
    if c.init_from_hf and not resume:
        from .hf_import import HFInit

        init = [HFInit(c.init_from_hf, print_fn=print_fn)]
    else:
        init = []
    if not c.save_dir and not resume:
        return init
    from .hook import CheckpointConfig, Checkpointer

    config = CheckpointConfig(save_dir=c.save_dir, save_every=c.save_every, resume=resume, keep_last=c.keep_last)
    return init + [Checkpointer(config, last_step=recipe.train.steps, recipe=recipe, print_fn=print_fn)]
