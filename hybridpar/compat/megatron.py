"""Every use of megatron-core's internals: its RNG tracker's module globals (replaced on CPU
ranks, hybridpar.compat.cpu), and the attributes hybridpar's code reads from megatron's objects.

megatron-core has no public way to give its model-parallel RNG tracker the CPU generator, or to
keep its recomputation from saving the CUDA generator's state: the tracker is a module global
that ``get_cuda_rng_tracker()`` returns, and the CUDA state functions are looked up at call time.
Where a public function does the job it is used: ``get_cuda_rng_tracker()`` to reach the
installed tracker, ``get_data_parallel_rng_tracker_name()`` and
``get_expert_parallel_rng_tracker_name()`` for its names. ``RELIES_ON`` lists the rest, with
the attributes of megatron's objects that hybridpar reads without an API promising them;
tests/unit/test_compat.py checks the installed megatron-core for each. Nothing here imports megatron
before it is called.
"""
from __future__ import annotations

import contextlib

from hybridpar.compat.declared import ASSIGNED, MEMBER, READ, Internal, Reliance

_RANDOM = "megatron.core.tensor_parallel.random"
_TRACKER = f"{_RANDOM}:CudaRNGStatesTracker"
_ATTENTION = "megatron.core.transformer.dot_product_attention:DotProductAttention"
_LANGUAGE_MODULE = "megatron.core.models.common.language_module.language_module:LanguageModule"
_CPU_RNG = "hybridpar.compat.cpu forks the CPU generator in megatron's RNG tracker"
_RECOMPUTE = "hybridpar.compat.cpu keeps recomputation off the CUDA generator"
_SDPA = "hybridpar.runtime.attention's SDPA attention (a DotProductAttention) reads it"
_STATE = "megatron.core.parallel_state"
_FORGET = "hybridpar.runtime.mesh frees a left world's groups (destroy_model_parallel keeps it)"

RELIES_ON = Reliance("megatron-core", ("0.16.1", "0.17"), (
    Internal(_RANDOM, "_CUDA_RNG_STATE_TRACKER", _CPU_RNG),
    Internal(_RANDOM, "_CUDA_RNG_STATE_TRACKER_INITIALIZED", _CPU_RNG),
    Internal(_RANDOM, "_MODEL_PARALLEL_RNG_TRACKER_NAME", _CPU_RNG),
    Internal(_TRACKER, "_is_initialized", _CPU_RNG, ASSIGNED),
    Internal(_TRACKER, "seeds_", _CPU_RNG, ASSIGNED),
    Internal(_TRACKER, "states_", _CPU_RNG, ASSIGNED),
    Internal(_TRACKER, "add", _CPU_RNG, MEMBER, ("name", "seed")),
    Internal(_TRACKER, "fork", _CPU_RNG, MEMBER, ("name",)),
    Internal(_TRACKER, "reset", _CPU_RNG),
    Internal(_RANDOM, "_get_cuda_rng_state", _RECOMPUTE),
    Internal(_RANDOM, "_set_cuda_rng_state", _RECOMPUTE),
    Internal(f"{_RANDOM}:_get_all_rng_states", "_get_cuda_rng_state", _RECOMPUTE + " (looked up at call time)", READ),
    Internal(f"{_RANDOM}:_set_all_rng_states", "_set_cuda_rng_state", _RECOMPUTE + " (looked up at call time)", READ),
    Internal(_ATTENTION, "__init__", _SDPA + " (its constructor's arguments)", MEMBER,
             ("config", "layer_number", "attn_mask_type", "attention_type", "attention_dropout", "softmax_scale",
              "cp_comm_type", "pg_collection")),
    Internal(_ATTENTION, "num_attention_heads_per_partition", _SDPA, ASSIGNED),
    Internal(_ATTENTION, "num_query_groups_per_partition", _SDPA, ASSIGNED),
    Internal(_ATTENTION, "hidden_size_per_partition", _SDPA, ASSIGNED),
    Internal(_ATTENTION, "softmax_scale", _SDPA, ASSIGNED),
    Internal("megatron.core.transformer.torch_norm", "WrappedTorchNorm",
             "hybridpar.runtime.model recognises megatron's torch fallback norm in the layer spec"),
    Internal(_LANGUAGE_MODULE, "zero_out_wgrad",
             "hybridpar.zero.engine casts the tied embedding's two gradients to fp32 first", ASSIGNED),
    Internal(_LANGUAGE_MODULE, "shared_embedding",
             "hybridpar.runtime.model names and marks the last stage's copy of a tied embedding", ASSIGNED),
    Internal(_STATE, "_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP", _FORGET),
    Internal(_STATE, "_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO", _FORGET),
    Internal("megatron.core.models.common.embeddings.rotary_pos_embedding:RotaryEmbedding.forward", "cache_clear",
             _FORGET + "; its lru_cache holds every rotary embedding made"),
))


def destroy_model_parallel() -> None:
    """megatron's ``destroy_model_parallel``, the two group globals it leaves set, and the rotary
    embeddings its ``lru_cache`` keeps (each holds its CP group): a group still referenced is never
    freed, nor its communicator's threads and sockets."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    ps.destroy_model_parallel()
    ps._INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP = None
    ps._INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO = None
    RotaryEmbedding.forward.cache_clear()


def install_cpu_rng_tracker() -> None:
    """megatron's model-parallel RNG tracker, forking the CPU generator; and no CUDA generator
    state saved or restored around recomputation (there is none)."""
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._CUDA_RNG_STATE_TRACKER = _cpu_rng_tracker_class()()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    mrandom._get_cuda_rng_state = lambda *a, **k: None  # read at call time by _get_all_rng_states
    mrandom._set_cuda_rng_state = lambda *a, **k: None


def seed_cpu_rng_tracker(seed: int, tp_rank: int) -> None:
    """The installed CPU tracker, seeded in megatron's layout (``model_parallel_cuda_manual_seed``)."""
    from megatron.core import tensor_parallel
    from megatron.core.tensor_parallel import random as mrandom

    tracker = tensor_parallel.get_cuda_rng_tracker()
    tracker.reset()
    tracker.add(tensor_parallel.get_data_parallel_rng_tracker_name(), seed)
    tracker.add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)
    tracker.add(tensor_parallel.get_expert_parallel_rng_tracker_name(), seed + 2718 + 100 * (tp_rank + 1) + 1)


def uses_torch_fallback_norm(layer_spec) -> bool:
    """Whether megatron's layer spec norms with its torch fallback (neither apex nor TE present)."""
    norm = layer_spec.submodules.input_layernorm
    return getattr(norm, "__name__", "") == "WrappedTorchNorm"


def _cpu_rng_tracker_class():
    import torch
    from megatron.core.tensor_parallel import random as mrandom

    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """megatron's tracker with the CPU generator in place of the CUDA one (same seed layout)."""

        def add(self, name, seed):
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            self.seeds_.add(seed)
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            orig = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(orig)

        @contextlib.contextmanager
        def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            orig = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(orig)

    return CpuRNGStatesTracker
