"""Every accommodation megatron-core needs to run on CPU ranks (gloo), in one place.

megatron-core is written for CUDA. On a CPU-only torch build it breaks in a few known places
(see shared/docs/stack-notes.md, "megatron-core on CPU with gloo"):

1. It allocates on ``torch.cuda.current_device()`` (RoPE frequencies, TP gather buffers,
   pipeline receive buffers) or on ``device="cuda"`` (the schedules' token counter).
   -> ``torch.cuda.current_device`` returns the CPU device, and a torch-function mode rewrites
   any other CUDA device argument (``"cuda"``, ``"cuda:0"``, ``0``) of a torch call to ``"cpu"``.
2. Its model-parallel RNG tracker saves and restores the CUDA generator.
   -> a tracker with the same seeds and names that forks the CPU generator.
3. Pipeline p2p calls ``torch.cuda.synchronize()``. -> a no-op on CPU (and the config sets
   ``batch_p2p_sync=False`` anyway).
   Context-parallel RoPE builds its chunk index with ``pin_memory=True`` (rope_utils.py), which
   needs CUDA. -> the torch-function mode drops ``pin_memory``.
4. Activation recomputation (``tensor_parallel.checkpoint`` / ``CheckpointFunction``: selective
   and full recompute) saves the CUDA generator's state in forward and restores it around the
   rerun in backward: "Torch not compiled with CUDA enabled". -> there is no CUDA generator, so
   its state is ``None`` and restoring it is a no-op; the CPU generator and the tracker's
   (CPU) states are saved and restored by the same code, so a rerun draws the same numbers.

``apply()`` does all of it, once per process, and only when CUDA is not available: the same
runtime code then runs unchanged on NCCL/GPU, where ``apply()`` does nothing.

Strict device mode (``HYBRIDPAR_STRICT_DEVICE=1``, set by the test suite): on a GPU, a tensor
created without ``device=`` lands on the CPU while the rank computes on its GPU, and the first op
that mixes the two fails. On CPU ranks both are the CPU, so such a bug stays hidden. In strict
mode ``enter_strict_device_mode()`` (called by ``launch.init_distributed`` on every rank) makes
the CPU rank's *default* device ``meta``: the rank still computes on ``cpu`` (``Mesh.device``),
every tensor created without a device lands on ``meta``, and mixing it with real tensors, moving
it, or reading its values fails as it would on a GPU.
"""
from __future__ import annotations

import contextlib
import os
import sys

import torch
from torch.overrides import TorchFunctionMode

from hybridpar.compat import megatron as megatron_compat
from hybridpar.compat import torch as torch_compat

_APPLIED = False
_MODE = None
_STRICT_MODE = None
STRICT_DEVICE_ENV = "HYBRIDPAR_STRICT_DEVICE"


def on_cpu() -> bool:
    return not torch.cuda.is_available()


def strict_device_requested() -> bool:
    return os.environ.get(STRICT_DEVICE_ENV, "") not in ("", "0")


class MixedDeviceError(RuntimeError):
    """A torch call mixed a tensor created without a device (on ``meta``) with real tensors."""


class NoMetaMixing(TorchFunctionMode):
    """Refuses any torch call that mixes ``meta`` tensors with tensors on a real device. Some
    kernels (``F.embedding``, ``matmul``) accept a meta operand beside CPU ones and return
    garbage instead of failing: on a GPU the same call fails with "Expected all tensors to be on
    the same device", and so it does here.

    Only hybridpar's own code (and its tests and benchmarks) is held to this: a tensor that
    megatron-core, DeepSpeed or torch create without a device is host-side bookkeeping there
    (megatron reads a mask type back with ``.item()``, counts tokens in a CPU scalar), correct on a
    GPU, so it stays on the CPU. So does a device-less scalar (0-dim) anywhere: CUDA kernels accept
    CPU scalars beside device tensors."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _CONSTRUCTORS and kwargs.get("device") is None:
            if not _called_from_project():
                return func(*args, **dict(kwargs, device="cpu"))
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and out.device.type == "meta" and out.dim() == 0:
                return func(*args, **dict(kwargs, device="cpu"))
            return out
        devices = {a.device.type for a in _tensors(args, kwargs)}
        if "meta" in devices and len(devices) > 1:
            name = getattr(func, "__name__", str(func))
            raise MixedDeviceError(
                f"{name}: a tensor created without device= (strict device mode puts it on meta) meets "
                f"tensors on {', '.join(sorted(devices - {'meta'}))}; on a GPU this fails the same way")
        return func(*args, **kwargs)


_PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep  # the repository
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _called_from_project() -> bool:
    """Whether the first caller outside torch (and this module) is a file of this repository."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if not (path.startswith(_TORCH) or path == __file__):
            return path.startswith(_PROJECT) and "site-packages" not in path
        frame = frame.f_back
    return False


_CONSTRUCTORS = torch_compat.device_constructors()


def _tensors(args, kwargs):
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def enter_strict_device_mode() -> bool:
    """On CPU ranks with ``HYBRIDPAR_STRICT_DEVICE=1``: tensors created without a device go to
    ``meta`` and a call that mixes them with real tensors raises ``MixedDeviceError`` (this
    thread; worker threads keep the CPU, as host code on a GPU machine does). Returns True when
    the mode is active."""
    global _STRICT_MODE
    if not (on_cpu() and strict_device_requested()):
        return False
    if _STRICT_MODE is None:
        torch.set_default_device("meta")
        _STRICT_MODE = NoMetaMixing()
        _STRICT_MODE.__enter__()
    return True


def _is_cuda_device(device) -> bool:
    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True  # a bare ordinal means an accelerator device
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return False


class CudaToCpu(TorchFunctionMode):
    """Rewrites CUDA device arguments of every torch call to the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs = dict(kwargs, device="cpu")
        if kwargs.get("pin_memory"):  # pinned host memory needs CUDA
            kwargs = dict(kwargs, pin_memory=False)
        if getattr(func, "__name__", "") in ("cuda",):  # Tensor.cuda() -> stays on the CPU
            return args[0]
        if getattr(func, "__name__", "") == "to" and args and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], "cpu") + tuple(args[2:])
        return func(*args, **kwargs)


def apply() -> bool:
    """Install the CPU accommodations (idempotent). Returns True when they are active."""
    global _APPLIED, _MODE
    if not on_cpu():
        return False
    if _APPLIED:
        return True
    # A device object, not an ordinal: megatron's autograd functions allocate on it in backward,
    # where the torch-function mode below is not active.
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.synchronize = lambda *a, **k: None
    megatron_compat.install_cpu_rng_tracker()
    _MODE = CudaToCpu()
    _MODE.__enter__()  # process-wide for the main thread, where the model and schedules run
    _APPLIED = True
    return True


def _decorator_or_function(model=None, **_options):
    return model if model is not None else (lambda function: function)


def import_libraries_uncompiled() -> None:
    """On CPU ranks, import megatron-core, and the module DeepSpeed's ZeRO imports at its first
    gradient reduction, with the functions they compile at import left as plain Python.

    Both wrap functions in ``torch.compile`` where they define them (megatron/core/jit.py's
    ``jit_fuser`` on every fused function; DeepSpeed's Muon kernels), which loads torch's compiler
    stack (inductor, its lowerings and code generators): about 2 s of CPU per rank. The runtime
    calls none of them: every megatron fusion is off (runtime/model.py) and the optimizer is AdamW.
    For the length of these imports ``torch.compile`` returns what it is given, so those names stay
    plain functions, which would compute the same thing eagerly. On GPU nothing changes."""
    if not on_cpu():
        return
    from hybridpar.compat import deepspeed as deepspeed_compat

    compile_ = torch.compile
    torch.compile = _decorator_or_function
    try:
        if "megatron.core" not in sys.modules:
            import megatron.core  # noqa: F401  (its __init__ imports jit.py and the fusions)
            import megatron.core.models.gpt  # noqa: F401
        deepspeed_compat.import_zero_muon()
    finally:
        torch.compile = compile_


def seed_model_parallel_rng(seed: int, tp_rank: int) -> None:
    """Megatron's seed layout for its tracker: CUDA on GPU, the CPU generator on CPU."""
    from megatron.core import tensor_parallel

    if not on_cpu():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
        return
    megatron_compat.seed_cpu_rng_tracker(seed, tp_rank)


def name_deepspeed_accelerator() -> None:
    """On CPU ranks, tell DeepSpeed its accelerator (DS_ACCELERATOR, its documented switch) instead
    of letting each rank detect it and print "Setting accelerator to CPU" on the way."""
    if on_cpu():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def skip_deepspeed_shm_build() -> None:
    """DeepSpeed's CPU backend JIT-builds a shared-memory comm op at start (~40 s, once per
    cache). It only serves inference all-reduce, which training never calls: skip it on CPU."""
    if not on_cpu():
        return
    from hybridpar.compat import deepspeed as deepspeed_compat

    deepspeed_compat.skip_shm_build()


@contextlib.contextmanager
def meta_build():
    """Modules built inside allocate nothing: megatron-core allocates every weight on
    ``torch.cuda.current_device()`` (``use_cpu_initialization=False``), which returns ``meta`` here,
    and any tensor created without a device lands on ``meta`` too. For the memory audit
    (hybridpar/memory_audit.py) only: the runtime never enters it. On CPU the accommodations of
    ``apply()`` are installed first, so that its own ``current_device`` does not replace this one."""
    apply()
    saved, default = torch.cuda.current_device, torch.get_default_device()
    torch.cuda.current_device = lambda: torch.device("meta")
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.cuda.current_device = saved
        torch.set_default_device(default)
