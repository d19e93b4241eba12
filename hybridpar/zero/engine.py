"""DeepSpeed ZeRO on the DP axis: one engine per pipeline stage, AdamW, LR schedule, clipping.

Each rank wraps its stage's model chunks in one DeepSpeed engine whose ``mpu`` is the mesh's
adapter, so ZeRO partitions optimizer state (stage 1) and gradients (stage 2) over the DP group
only (DP x CP with context parallelism: CP ranks hold the same weights), and averages gradients
there. megatron's schedule runs the
micro-batches on the raw chunks; DeepSpeed does not manage gradient accumulation
(``managed_gradient_accumulation: false``): ``StageEngine.step()`` is the one boundary per
global batch, where DeepSpeed applies AdamW.

DP reduction (``overlap_grad_reduce``, the default): ``grad_sync.OverlappedGradReduction``
reduces the gradients over DP (x CP) in buckets issued from the last micro-batch's backward, and
``finish_grad_reduction()`` waits for them before the model-parallel sums. ZeRO-0: each bucket is
all-reduced. ZeRO 1/2: each gradient element is reduced only to the DP rank whose DeepSpeed
partition holds it (``partitions``: the bytes of a reduce-scatter, half an all-reduce's), and
``step()`` hands DeepSpeed that flat partition as its averaged gradient; the few parameters whose
model-parallel sums need the averaged gradient whole (sequence-parallel norm weights, a tied
embedding on the end stages: ``whole_grad_params``) are all-reduced as at ZeRO-0. DeepSpeed's
own reduction is switched off (``_hand_dp_reduction_to_grad_sync``); its norm, clipping, step and
weight all-gather are unchanged. With the overlap off, DeepSpeed reduces in ``step()`` as
described below (its ZeRO-1/2 bucketing, in which every bucket is all-reduced in full).

Weight gather (``overlap_param_gather``, the default, ZeRO 1/2 with DP x CP > 1):
``param_gather.DeferredParamGather`` skips DeepSpeed's all-gather of the updated weights inside
its step and issues the same bytes after it, in forward order: per bucket, broadcasts from each
partition's owner (one in-place all-gather where a bucket holds a whole group); forward pre-hooks wait for each bucket, so the next step's forward overlaps
them. ``sync_weights()`` waits for all of them (``Job.chunks`` calls it for every reader outside
the training step).

Every DeepSpeed default that changes the math is set explicitly (gradient_clipping,
predivide/prescale, communication dtype, loss scaling, bf16/fp16).

Gradient-norm clipping is global over all TP/PP shards and equal to one-process clipping:
- ZeRO 1/2: DeepSpeed's own norm: squared norms of each partition, summed over the DP (x CP)
  group and then over the replica's distinct shards (``mpu.get_model_parallel_group()`` = tp x pp); a parameter
  replicated across TP counts on TP rank 0 only; the last stage's copy of a tied embedding is
  marked ``ds_pipe_replicated`` and not counted.
- ZeRO 0: DeepSpeed's stage-0 path cannot skip pipeline copies, so DeepSpeed's clipping is off
  (0.0) and ``ClippedAdamW`` clips the DP-reduced gradients with the same rules (``grad_norm``).

ZeRO-2 here: DeepSpeed reduces gradients in per-parameter hooks during backward, which breaks
when an outside schedule runs several micro-batches (and DeepSpeed's own pipeline engine
refuses ZeRO-2). hybridpar removes those hooks: gradients accumulate locally over the
micro-batches, and at the step boundary every gradient is reduced once into its owner's DP
partition (DeepSpeed's bucketed reduction: with its default ``use_multi_rank_bucket_allreduce`` each
bucket is all-reduced in full and each rank keeps its partition), then the optimizer steps. Same math, one
reduction per step; the cost is a full gradient buffer during accumulation (as ZeRO-1).

bf16: gradients accumulate over the micro-batches in fp32, as megatron-core's ``main_grad``
(``_fp32_grad_accumulation``). Each bf16 parameter may hold a gradient of any dtype (torch's
``Tensor.grad_dtype = None``; a torch without it keeps bf16 accumulation and warns): the first
micro-batch's gradient becomes ``p.grad`` and is cast to fp32 once (a post-accumulate hook,
registered before grad_sync's), every later one is added into that fp32 ``p.grad`` by autograd's
in-place accumulation, which casts on the fly: 10 bytes of HBM traffic per parameter and
micro-batch, as megatron's unfused ``main_grad.add_(grad)``, where ``grad_dtype = float32`` makes
autograd materialise an fp32 copy of each gradient first (18 bytes; here only for the embedding a
one-stage model's output layer shares, whose two gradients per backward autograd would otherwise
sum in bf16 before accumulating). No bf16 running sum; gradients that autograd computes in fp32,
e.g. the RMSNorm weights', are not rounded to bf16 first; pipeline.py's model-parallel sums run in
fp32). The price: 4 bytes per parameter for the gradient during accumulation instead of 2
(megatron's ``main_grad`` costs the same). At the step boundary ZeRO 1/2 use DeepSpeed's own fp32
accumulation path (``gradient_accumulation_dtype`` fp32, ``use_grad_accum_attribute``, switched on
after DeepSpeed builds its ZeRO optimizer, whose per-parameter hooks are removed): the fp32
``p.grad`` is handed over as ``p.grad_accum``, copied
into an fp32 bucket, reduced to its owner in fp32 (``communication_data_type``) and added into an
fp32 gradient partition that feeds the norm, the clipping and the fp32 master step: no bf16
rounding of the summed gradient anywhere (tests/integration/test_bf16.py). DeepSpeed's config option
``data_types.grad_accum_dtype: fp32`` is not used: at ZeRO-1 it selects another optimizer class
(BF16_Optimizer: no ``reduce_gradients``, different partition bookkeeping), at ZeRO-2 it still
stages the one deferred reduction in a bf16 bucket, and at ZeRO-0 DeepSpeed refuses it. ZeRO-0 in
bf16: DeepSpeed wraps ``ClippedAdamW`` in its bf16 optimizer (FP16_UnfusedOptimizer), which
all-reduces the fp32 ``p.grad`` in fp32 and copies it into fp32 master gradients. Known
copy of megatron's TP attributes onto its fp32 masters keeps ``ClippedAdamW``'s norm over every TP
shard, and the AdamW step the wrapper runs on zero gradients at construction is undone
(``_label_fp32_masters``). fp32 runs are untouched.
"""
from __future__ import annotations


import torch
import torch.distributed as dist

from hybridpar.compat import deepspeed as deepspeed_compat
from hybridpar.config.optim import OptimConfig
from hybridpar.zero.grad_sync import DEFAULT_BUCKET_NUMEL, OverlappedGradReduction
from hybridpar.zero.param_gather import DeferredParamGather
from hybridpar.zero.partitions import PartitionHandOff


def _fp32_grad(p: torch.Tensor) -> None:
    """Post-accumulate hook: the first micro-batch's gradient (stolen by autograd as is) becomes
    fp32; later ones are added into it in place, cast on the fly."""
    if p.grad is not None and p.grad.dtype != torch.float32:
        p.grad = p.grad.float()


NORM_ATTRIBUTES = ("tensor_model_parallel", "partition_dim", "partition_stride", "ds_pipe_replicated",
                   "sequence_parallel", "shared_embedding")


def counted_in_norm(p, tp_rank: int) -> bool:
    """Whether this rank counts ``p``'s gradient in the global norm (each element exactly once)."""
    if getattr(p, "ds_pipe_replicated", False):
        return False
    return bool(getattr(p, "tensor_model_parallel", False)) or tp_rank == 0


def grad_norm(params, mesh) -> torch.Tensor:
    """L2 norm of the full model's gradient from this replica's shards (sum over the replica)."""
    sq = torch.zeros((), dtype=torch.float32, device=mesh.device)
    for p in params:
        if p.grad is not None and counted_in_norm(p, mesh.tp_rank):
            sq += p.grad.detach().float().pow(2).sum()
    if mesh.size("mp") > 1:
        dist.all_reduce(sq, group=mesh.group("mp"))
    return sq.sqrt()


class ClippedAdamW(torch.optim.AdamW):
    """AdamW that first clips the (already DP-reduced) gradients by the global norm (ZeRO 0)."""

    def __init__(self, params, mesh, max_norm: float, **kwargs):
        super().__init__(params, **kwargs)
        self._mesh, self._max_norm = mesh, max_norm
        self._global_grad_norm = None

    @torch.no_grad()
    def step(self, closure=None):
        params = [p for g in self.param_groups for p in g["params"]]
        norm = grad_norm(params, self._mesh)
        self._global_grad_norm = norm
        if self._max_norm > 0:
            coef = torch.clamp(self._max_norm / (norm + 1e-6), max=1.0)
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)
        return super().step(closure)


def deepspeed_config(zero_stage: int, micro_batch: int, grad_accum: int, dp: int, grad_clip: float, bf16: bool,
                     bucket: int = 50_000_000) -> dict:
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": micro_batch * grad_accum * dp,
        "managed_gradient_accumulation": False,
        "gradient_clipping": grad_clip if zero_stage > 0 else 0.0,  # explicit: DeepSpeed's default is 1.0
        "prescale_gradients": False,
        "gradient_predivide_factor": 1.0,
        "communication_data_type": "fp32",
        "fp16": {"enabled": False},
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {
            "stage": zero_stage,
            "overlap_comm": False,
            "contiguous_gradients": True,
            "reduce_scatter": True,
            "reduce_bucket_size": bucket,
            "allgather_bucket_size": bucket,
        },
        "steps_per_print": 10**12,
        "wall_clock_breakdown": False,
    }


def param_groups(chunks, weight_decay: float) -> list[dict]:
    """Weight decay on matrices, none on norm weights (Llama practice)."""
    decay, no_decay = [], []
    for chunk in chunks:
        for p in chunk.parameters():
            if p.requires_grad:
                (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


# bf16: accumulate gradients over micro-batches in fp32 (tests switch it off to measure the
# plain bf16 accumulation it replaces).
FP32_GRAD_ACCUM = True


class StageEngine:
    """This rank's DeepSpeed engine over its pipeline stage's chunks."""

    def __init__(self, chunks: list, mesh, cfg: OptimConfig, zero_stage: int, micro_batch: int, grad_accum: int, bf16: bool,
                 overlap_grad_reduce: bool = True, grad_bucket_numel: int = DEFAULT_BUCKET_NUMEL,
                 whole_grad_params: list | None = None, overlap_param_gather: bool = True):
        import deepspeed

        from hybridpar.compat import cpu

        cpu.skip_deepspeed_shm_build()
        self.chunks, self.mesh, self.cfg, self.zero_stage = chunks, mesh, cfg, zero_stage
        groups = param_groups(chunks, cfg.weight_decay)
        kw = dict(lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)
        if zero_stage == 0:
            optimizer = ClippedAdamW(groups, mesh, cfg.grad_clip, **kw)
        else:
            optimizer = torch.optim.AdamW(groups, **kw)
        # Buckets no larger than the stage (DeepSpeed allocates them whole).
        bucket = int(min(50_000_000, max(1, sum(p.numel() for c in chunks for p in c.parameters()))))
        ds_config = deepspeed_config(zero_stage, micro_batch, grad_accum, mesh.size("dp_cp"), cfg.grad_clip, bf16, bucket)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=torch.nn.ModuleList(chunks),
            optimizer=optimizer,
            config=ds_config,
            mpu=mesh.deepspeed_mpu(),
            dist_init_required=False,
        )
        self.fp32_grad_accum = bool(bf16 and FP32_GRAD_ACCUM)
        self.fp32_masters = self._label_fp32_masters()
        if zero_stage > 0:
            self._remove_deepspeed_grad_hooks()
            deepspeed_compat.reduce_group_norms_together(self.engine.optimizer)  # one all-reduce per axis
        if zero_stage == 2:
            self._defer_zero2_reduction()
        if self.fp32_grad_accum:
            self._fp32_grad_accumulation()
        self.grad_sync, self.buckets_issued_in_backward, self.hand_off = None, 0, None
        # Averaged gradients that model-parallel sums read whole (pipeline.model_parallel_summed_params).
        self.whole_grad_params = list(whole_grad_params or [])
        if overlap_grad_reduce and mesh.size("dp_cp") > 1:
            owners = None
            if zero_stage > 0:
                self.hand_off = PartitionHandOff(self.engine.optimizer, mesh.group("dp_cp"))
                whole = {id(p) for p in self.whole_grad_params}
                owners = {p: runs for p, runs in self.hand_off.pieces.items() if id(p) not in whole}
            # One bucket covering every partition becomes a reduce-scatter, unless some parameters
            # are reduced whole: their zeros would then travel too.
            sizes = self.hand_off.partition_sizes if self.hand_off and not self.whole_grad_params else None
            self.grad_sync = OverlappedGradReduction(self._params(), mesh.group("dp_cp"), grad_bucket_numel, owners, sizes)
            for chunk in chunks:
                chunk.config.no_sync_func = self.grad_sync.no_sync
            self._hand_dp_reduction_to_grad_sync()
        self.param_gather = None
        if overlap_param_gather and zero_stage > 0 and mesh.size("dp_cp") > 1:
            self.param_gather = DeferredParamGather(self.engine.optimizer, chunks, self._params(), mesh.group("dp_cp"),
                                                    grad_bucket_numel)

    def _params(self):
        return [p for c in self.chunks for p in c.parameters() if p.requires_grad]

    def _label_fp32_masters(self) -> dict:
        """ZeRO-0 in bf16: DeepSpeed's bf16 wrapper (FP16_UnfusedOptimizer) steps ``ClippedAdamW`` on
        fp32 master copies of the parameters. Two repairs, both no-ops for every other optimizer:
        - the masters lack megatron's TP attributes that ``grad_norm`` reads: copy them over, so
          every TP shard counts in the norm;
        - the wrapper's ``initialize_optimizer_states`` already ran one AdamW step on zero gradients
          (Adam's step count 1, weight decay applied to the masters once): forget that state and
          restore the masters from the model's weights, so the first real step is AdamW's first.
        Returns {model parameter: its fp32 master} (empty without the wrapper), which
        checkpoint/optim.py saves and loads through."""
        wrapper = self.engine.optimizer
        masters = deepspeed_compat.fp32_masters(wrapper)
        if masters is None:
            return {}
        with torch.no_grad():
            for p, master in masters.items():
                for name in NORM_ATTRIBUTES:
                    if hasattr(p, name):
                        setattr(master, name, getattr(p, name))
                master.copy_(p.float())
        deepspeed_compat.inner_optimizer(wrapper).state.clear()
        return masters

    def _fp32_grad_accumulation(self) -> None:
        """bf16 parameters, fp32 gradients: accumulated in fp32 by autograd, reduced in fp32."""
        if not hasattr(torch.Tensor, "grad_dtype"):
            import warnings

            warnings.warn(f"torch {torch.__version__} has no Tensor.grad_dtype: bf16 gradients accumulate in bf16")
            self.fp32_grad_accum = False
            return
        for p in self._params():
            if p.dtype == torch.float32:
                continue
            p.accum_dtype = torch.float32  # what grad_sync gives a parameter without a gradient
            if getattr(p, "zero_out_wgrad", False):
                # megatron's mark for the embedding that a one-stage model's output layer shares:
                # one backward reaches it twice, and autograd sums the two gradients before
                # accumulating, in fp32 only if it casts each first.
                p.grad_dtype = torch.float32
                continue
            p.grad_dtype = None  # an fp32 .grad on a bf16 parameter; incoming gradients uncast
            p.register_post_accumulate_grad_hook(_fp32_grad)
        if self.zero_stage == 0:
            return
        # DeepSpeed's fp32 accumulation attribute path. Its per-parameter hooks (removed,
        # _remove_deepspeed_grad_hooks) would have moved p.grad into p.grad_accum after every
        # micro-batch, before pipeline.py's model-parallel sums read p.grad; the hand-over happens
        # once, in step().
        deepspeed_compat.accumulate_through_grad_accum(self.engine.optimizer)

    def _remove_deepspeed_grad_hooks(self) -> None:
        """ZeRO 1/2: DeepSpeed hooks every parameter's gradient accumulation and acts after each
        micro-batch's backward: ZeRO-2 reduces there (which breaks under an outside schedule),
        the fp32 accumulation path would move ``p.grad`` away, and at ZeRO-1 the bookkeeping only
        costs time (about 1 ms per step on the tiny model: 54 parameters x 2 micro-batches).
        hybridpar reduces once per step, so the hooks go; ``step()`` (or ZeRO-2's boundary
        reduction) sets up the buckets they used to."""
        deepspeed_compat.remove_grad_hooks(self.engine.optimizer)

    def _defer_zero2_reduction(self) -> None:
        """ZeRO-2: accumulate over micro-batches locally, reduce once at the boundary.

        DeepSpeed's per-parameter reduce hooks are removed, and the hook that DeepSpeed calls at
        the boundary of an unmanaged step (``finalize_gradient_accumulation_boundary``) is
        replaced by one pass of DeepSpeed's own bucketed reduction over every gradient."""
        deepspeed_compat.reduce_zero2_once_at_boundary(self.engine.optimizer)

    def _hand_dp_reduction_to_grad_sync(self) -> None:
        """The gradients DeepSpeed sees are already averaged over DP (x CP) by ``grad_sync``:
        ZeRO-0 skips its all-reduce; ZeRO 1/2 skip their whole boundary reduction (bucketing,
        collective, copies into partitions): ``step()`` installs the partitions ``grad_sync``
        reduced to this rank (``partitions.PartitionHandOff``)."""
        deepspeed_compat.skip_engine_allreduce(self.engine)
        if self.zero_stage == 2:
            deepspeed_compat.skip_zero2_boundary_reduction(self.engine.optimizer)

    def finish_grad_reduction(self) -> None:
        """Wait for the DP reduction issued during the last backward (call before the
        model-parallel gradient sums: they read the averaged gradients). Records how many of the
        buckets the backward issued (``buckets_issued_in_backward``)."""
        if self.grad_sync is not None:
            self.buckets_issued_in_backward = self.grad_sync.finish()

    def sync_weights(self) -> None:
        """Wait for the updated weights still in flight (``overlap_param_gather``): call before
        reading or writing parameters outside the forward."""
        if self.param_gather is not None:
            self.param_gather.wait_all()

    def release(self) -> None:
        """Let the model and optimizer be freed once dropped (a job rebuilt in a new world)."""
        if self.grad_sync is not None:
            self.grad_sync.remove_hooks()

    def set_lr(self, lr: float) -> None:
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr

    def step(self, lr: float) -> float:
        """DP-reduce the accumulated gradients (or, with ``grad_sync``, take the ones
        ``finish_grad_reduction()`` averaged), clip, and apply AdamW. Returns the global grad norm."""
        if self.grad_sync is not None and self.grad_sync.pending:
            raise RuntimeError("finish_grad_reduction() must run before step(): DP reduction still in flight")
        self.sync_weights()  # a gather the forward did not wait for (unused parameters) ends here
        self.set_lr(lr)
        if self.hand_off is not None:
            self.hand_off.install(self.grad_sync.received, self.whole_grad_params)
            self.grad_sync.received = []  # the partitions hold the data now
        elif self.fp32_grad_accum and self.zero_stage > 0:
            deepspeed_compat.hand_over_as_grad_accum(self.engine.optimizer)
        elif self.zero_stage == 1:
            deepspeed_compat.setup_buckets(self.engine.optimizer)  # what the removed hooks did
        if self.param_gather is not None:
            with self.param_gather.deferring():
                self.engine.step()
            self.param_gather.issue()  # the next forward waits for each bucket as it reaches it
        else:
            self.engine.step()
        # ZeRO-0: ClippedAdamW's norm (DeepSpeed's bf16 wrapper around it reports a norm of its own
        # that ignores hybridpar's clipping rules); ZeRO 1/2: DeepSpeed's.
        inner = deepspeed_compat.inner_optimizer(self.engine.optimizer)
        norm = inner._global_grad_norm if isinstance(inner, ClippedAdamW) else self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def zero_grad(self) -> None:
        for chunk in self.chunks:
            for p in chunk.parameters():
                p.grad = None
                deepspeed_compat.clear_grad_accum(p)
