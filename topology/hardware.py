"""GPU catalogue: peaks, memory, link bandwidths and GPUs per node, each with its source.

Source tags as in ../shared/docs/formulas.md: [V] read in a primary source, [S] secondary
material only, [R] recalled. Bandwidths are per GPU and per direction unless named otherwise.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .attention_tables import FLASH_TABLES, UNFUSED_TABLES, reference_rate
from .collectives import TABLES
from .spec_files import names_a_file, read_mapping

GIB = 1024**3
# Host link of a GPU file that gives none: PCIe Gen4 x16 per direction (A100's, below), the slowest
# of the catalogue, so a newer part on Gen5 is costed at up to twice its copy time, never less.
DEFAULT_HOST_LINK_GBPS = 32.0


class HardwareError(ValueError):
    """An unknown GPU or a precision the GPU cannot run."""


@dataclass(frozen=True)
class GPU:
    name: str
    bf16_tflops: float  # dense tensor-core peak for bf16/fp16 (no 2:4 sparsity)
    fp8_tflops: float | None  # dense fp8 peak; None: no fp8 tensor cores
    memory_gib: float  # usable device memory (what nvidia-smi reports)
    hbm_tbps: float  # peak HBM bandwidth, TB/s
    nvlink_gbps: float  # NVLink bandwidth per GPU per direction, GB/s
    network_gbps: float  # scale-out NIC bandwidth per GPU per direction, GB/s
    gpus_per_node: int
    sms: int  # streaming multiprocessors: a GEMM's tiles are spread over these (wave quantisation)
    # Largest fraction of the dense peak that a large, well-shaped bf16 GEMM sustains on this
    # part ("maximum achievable matmul FLOPS", MAMF, measured by sweeping shapes with
    # ml-engineering's mamf-finder.py). It captures clocks under the power limit and kernel
    # efficiency, neither of which is in the marketing peak.
    gemm_fraction: float
    # Fraction of the dense peak a causal FlashAttention-2-class kernel reaches fwd+bwd.
    attention_fraction: float
    # Host link (GPU <-> CPU memory) per direction, GB/s: what a device-to-host copy of the optimizer
    # state crosses (topology/redundancy.py); pinned copies reach about links.LINK_EFFICIENCY of it.
    host_link_gbps: float = DEFAULT_HOST_LINK_GBPS
    # The two fractions above are measured in bursts on one GPU, at its boost clock. A training step
    # keeps every GPU of a node at its power limit for minutes, where the SM clock settles lower:
    # the sustained matmul rate (MSMF, ml-engineering's mamf-finder.py with all GPUs of the node
    # computing) over the burst one (MAMF). Tensor-core work (GEMMs, attention) runs at this share
    # of its burst rate; memory-bound kernels do not depend on the SM clock. 1.0 where no
    # measurement exists.
    sustained_clock: float = 1.0
    # A table of NCCL collectives measured on this GPU's NVLink node (a key of collectives.TABLES): what
    # collectives inside one node take, by operation, group size and bytes (links.collective_time). None:
    # NCCL's latency model and LINK_EFFICIENCY of nvlink_gbps.
    nvlink_collectives: str | None = None
    # MAMF of an fp8 GEMM (float8_e4m3fn operands) as a fraction of the dense fp8 peak; None: no fp8
    # measurement, the bf16 gemm_fraction is assumed.
    fp8_gemm_fraction: float | None = None
    # Whether an fp8 GEMM takes its operands only as the TN layout, so that each backward GEMM needs a transposed
    # fp8 copy (Hopper, Ada), or in any layout from the one rowwise copy (Blackwell: "supports multiple GEMM
    # layouts natively, eliminating the need for explicit transposes", Transformer Engine's docs, fp8_current_
    # scaling "Transpose handling"; TE 2.2 quantizer.cpp: create_transpose = columnwise_usage &&
    # !non_tn_fp8_gemm_supported()) [V]. topology/fp8.py counts the casts either way.
    fp8_transposes: bool = True
    # A measured attention kernel's rate by sequence length (a key of attention_tables.FLASH_TABLES):
    # how attention_fraction, its rate at 8K, changes with the sequence (kernels.attention_shape_factor).
    # None: FlashAttention's amortisation of its per-block cost.
    attention_curve: str | None = None
    # The most one NCCL ring carries across a node's boundary, GB/s per direction, on a cluster whose NCCL
    # enters and leaves each node over one NIC per ring whatever the ring's members there (measured on that
    # cluster). None: a ring's channels spread over the NICs of its members on the node (links.dp_link_gbps).
    network_ring_gbps: float | None = None
    # A measured table of unfused attention (scores in HBM) on this GPU (attention_tables.UNFUSED_TABLES): how much
    # slower than its roofline a stack without FlashAttention runs it (kernels.unfused_attention_slowdown). None: the
    # roofline.
    unfused_attention: str | None = None

    def gemm_fraction_for(self, operand_bytes: int) -> float:
        """The MAMF fraction of a GEMM whose operands take ``operand_bytes`` (1: fp8)."""
        if operand_bytes == 1 and self.fp8_gemm_fraction is not None:
            return self.fp8_gemm_fraction
        return self.gemm_fraction

    def peak_tflops(self, precision: str) -> float:
        if precision == "fp8":
            if self.fp8_tflops is None:
                raise HardwareError(f"{self.name} has no fp8 tensor cores; use --precision bf16")
            return self.fp8_tflops
        if precision == "fp32":
            raise HardwareError("the planner models 16-bit or fp8 training; use --precision bf16, fp16 or fp8")
        return self.bf16_tflops

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB


# A100 SXM: 312 TFLOP/s dense bf16 (Narayanan et al. 2021 §5) [V]; no fp8. HBM2 40 GB at
# 1.555 TB/s, HBM2e 80 GB at 2.039 TB/s (A100 datasheet) [S]. NVLink 3: 600 GB/s per GPU
# bidirectional = 300 per direction [S]. DGX A100: 8 x 200 Gb/s HDR per node = 25 GB/s per GPU
# (Narayanan §5, Korthikanti §6) [V]. 108 SMs (A100 whitepaper) [S]. MAMF 267.9 TFLOP/s = 0.859
# of peak (Bekman, ml-engineering "Maximum Achievable FLOPS" table) [S]. Sustained: no all-GPUs-busy
# measurement is stored for A100; one A100 looping an 8192^3 bf16 matmul on random inputs holds 257
# TFLOP/s, 295 on zeros, i.e. it is power-limited at 400 W (Horace He, "Strangely, Matrix
# Multiplications on GPUs Run Faster When Given 'Predictable' Data", 2024) [S]: 257 / 267.9 = 0.959,
# an upper bound for a busy node. Attention: FlashAttention-2's measured rate on one A100 80GB SXM4, causal,
# forward and backward (attention_tables "a100-fa2") [S]: 0.583 of peak at 8K, 0.497 at 2K; unfused attention
# (scores in HBM) as PyTorch's standard attention measured on the same GPU ("a100-pytorch") [S]. Host link:
# PCIe Gen4 x16, 64 GB/s bidirectional = 32 per direction (A100 datasheet) [S].
# All-reduce inside a node over all 8 GPUs: nccl-tests on one 8 x A100-SXM4-40GB NVSwitch node
# (topology/collectives.py) [S]; other groups and operations keep the model.
_A100_ATTENTION = "a100-fa2"
_A100 = dict(bf16_tflops=312.0, fp8_tflops=None, nvlink_gbps=300.0, network_gbps=25.0,
             gpus_per_node=8, sms=108, gemm_fraction=0.859,
             attention_fraction=round(reference_rate(_A100_ATTENTION), 3), host_link_gbps=32.0,
             sustained_clock=round(257 / 267.9, 3), nvlink_collectives="a100-nvlink3", attention_curve=_A100_ATTENTION,
             unfused_attention="a100-pytorch")

# H100 SXM: 989 dense bf16, 1979 dense fp8; 80 GB HBM3 at 3.35 TB/s; NVLink 4 900 GB/s per GPU
# bidirectional; 8 x 400 Gb/s compute NICs per node = 50 GB/s per GPU (NVIDIA dgxc-benchmarking
# README) [V]. 132 SMs [S]. MAMF 792.1 TFLOP/s = 0.801 of peak (Bekman table) [S]; fp8 (float8_e4m3fn) MAMF
# 1,402.6 of 1,979 = 0.709, H200 1,453.4 = 0.734 (the same table's FP8 part, torch 2.7) [S]; the
# sustained share below, measured with bf16, is kept for fp8: one H200 alone sustains 0.864 of its fp8 burst
# (1,288.7 of 1,491.9) and 0.842 of its bf16 one (708.5 of 841.9), one B200 0.814 and 0.822 (ml-engineering
# compute/accelerator/README.md, "MAMF & MSMF" tables, torch 2.13) [S]: +2.6% and -1.0%, opposite ways and
# inside the 1-2% each of the four figures reproduces to. Sustained: with
# all 8 GPUs of a node running matmuls (mamf-finder-all-gpus.py, 5 rounds, n = 40), H200 bf16 -
# the same GH100 at the same 700 W - sustains 698.6 TFLOP/s where its burst reaches 823.9, SM
# clocks 1405-1527 MHz against the 1980 MHz boost: 0.848 (ml-engineering,
# compute/accelerator/benchmarks/README.md, "What we measured: alone vs all-8 concurrent") [S]. A later
# revision of that README reports another H200 node at 755.5 of 852.1 (0.887, clocks 1850-1938 MHz, its GPUs
# 3.4% apart): the sustained rate differs from node to node (4.6% between these two), and a synchronous job runs
# at its slowest GPU's, so the lower node's figure is kept.
# FlashAttention on H100: FA2 reaches ~35-40% of peak, FA3 ~75% (Shah et al. 2024) [S]: 0.5 assumed. cuDNN
# 9.19 measured on one H200 reaches 0.57 at 8K (attention_tables "h200-cudnn-9.19", a GPU file can name it); it
# postdates the kernels every validated Hopper run used, so the catalogue keeps the assumption. Unfused
# attention: PyTorch's standard attention measured on one H100 80GB SXM5 ("h100-pytorch") [S].
# Host link (H100, and H200/H800 SXM, which share the board interface): PCIe Gen5 x16, 128 GB/s
# bidirectional = 64 per direction (NVIDIA H100/H200 SXM datasheets) [S].
# Collectives inside a node: OpenXLA's table measured on 8 compute-capability-9.0 GPUs, NVLink 4 through
# NVSwitch (topology/collectives.py) [V]; H800, whose NVLink is cut, keeps the model.
_H100 = dict(bf16_tflops=989.0, fp8_tflops=1979.0, nvlink_gbps=450.0, network_gbps=50.0,
             gpus_per_node=8, sms=132, gemm_fraction=0.801, attention_fraction=0.5, host_link_gbps=64.0,
             sustained_clock=round(698.6 / 823.9, 3), nvlink_collectives="h100-nvlink4",
             fp8_gemm_fraction=round(1402.6 / 1979, 3), unfused_attention="h100-pytorch")

# B200 (HGX, 1,000 W): 2,250 dense bf16, 4,500 dense fp8 TFLOP/s; HBM3e at 8 TB/s; NVLink 5
# 1.8 TB/s per GPU bidirectional = 900 per direction (glennklockwood.com B200 notes; Vultr HGX B200
# overview) [S]; nvidia-smi shows 179 GiB (Vultr) [S]. DGX B200: 8 x 400 Gb/s ConnectX-7 compute
# NICs = 50 GB/s per GPU [R]; 148 SMs [R]. GEMMs: MAMF 1,745 TFLOP/s = 0.776 of peak (Bekman table,
# torch 2.7.1) [S]; fp8 MAMF 3,432.5 of 4,500 = 0.763 (its FP8 part) [S]; OpenXLA's measured sm_100 table (xla/service/gpu/model/matmul_interpolator_data.h)
# stops at 4,096 and peaks at 1,670. Sustained with all 8 GPUs computing: 1,426.4 TFLOP/s against a
# 1,751.2 burst = 0.815 (ml-engineering benchmarks README, B200 bf16, n = 40) [S]. Attention: cuDNN 9.10's
# fused attention measured on one B200 at 512 to 128K (attention_tables "b200-cudnn-9.10") [S]: 0.444 of
# peak at 8K, 0.33 at 4K, 0.51-0.53 at 16-32K, 0.50 at 128K. Host link: PCIe Gen5 x16 = 64 GB/s per direction
# [R].
_B200_ATTENTION = "b200-cudnn-9.10"
_B200 = dict(bf16_tflops=2250.0, fp8_tflops=4500.0, nvlink_gbps=900.0, network_gbps=50.0,
             gpus_per_node=8, sms=148, gemm_fraction=0.776,
             attention_fraction=round(reference_rate(_B200_ATTENTION), 3), host_link_gbps=64.0,
             sustained_clock=round(1426.4 / 1751.2, 3), fp8_gemm_fraction=round(3432.5 / 4500, 3),
             attention_curve=_B200_ATTENTION, fp8_transposes=False)

CATALOGUE: dict[str, GPU] = {
    "a100-40gb": GPU("a100-40gb", memory_gib=40.0, hbm_tbps=1.555, **_A100),
    "a100-80gb": GPU("a100-80gb", memory_gib=80.0, hbm_tbps=2.039, **_A100),
    # nvidia-smi reports 81,559 MiB on an H100 80GB [R].
    "h100-80gb": GPU("h100-80gb", memory_gib=79.6, hbm_tbps=3.35, **_H100),
    # H800: H100 compute (dense bf16 assumed 989 [R]) with NVLink cut to 400 GB/s bidirectional
    # = 200 per direction [S]; DeepSeek-V3 §3.2.2 measures 160 GB/s NVLink (= 0.8 x 200, cf.
    # LINK_EFFICIENCY in cost.py) and 50 GB/s InfiniBand per GPU [V].
    "h800-80gb": GPU("h800-80gb", memory_gib=79.6, hbm_tbps=3.35,
                     **{**_H100, "nvlink_gbps": 200.0, "network_gbps": 50.0, "nvlink_collectives": None}),
    # H200: GH100 compute as H100 (989 / 1979 dense), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s
    # bidirectional, 700 W (formulas.md §7) [S]; nvidia-smi shows 143,771 MiB [R].
    "h200-141gb": GPU("h200-141gb", memory_gib=140.4, hbm_tbps=4.8,
                      **{**_H100, "fp8_gemm_fraction": round(1453.4 / 1979, 3)}),
    "b200-180gb": GPU("b200-180gb", memory_gib=179.0, hbm_tbps=8.0, **_B200),
}

ALIASES = {"h100": "h100-80gb", "h100-sxm": "h100-80gb", "a100": "a100-80gb", "h200": "h200-141gb",
           "h800": "h800-80gb", "b200": "b200-180gb"}
# torch.cuda.get_device_name() substrings -> catalogue names, most specific first.
DEVICE_NAMES = (("B200", "b200-180gb"), ("H200", "h200-141gb"), ("H800", "h800-80gb"), ("H100", "h100-80gb"),
                ("A100-SXM4-40GB", "a100-40gb"), ("A100-PCIE-40GB", "a100-40gb"), ("A100", "a100-80gb"))


def file_gpu_name(base: str, source: str) -> str:
    """The name of a GPU file built on a catalogue GPU: "h100-80gb (mine)" for base h100-80gb in mine.yaml."""
    return f"{base} ({Path(source).stem})"


def catalogue_base(name: str) -> str:
    """The catalogue GPU a GPU's name stands for: a GPU file built on one (file_gpu_name) is that GPU."""
    return name.split(" (")[0]


def catalogue_for_device(device_name: str, memory_gib: float | None = None) -> str | None:
    """The catalogue GPU of a CUDA device name ("NVIDIA H100 80GB HBM3" -> h100-80gb), or None; an
    A100 whose name gives no size is told apart by its memory when that is given."""
    for needle, name in DEVICE_NAMES:
        if needle.lower() in device_name.lower():
            if name == "a100-80gb" and memory_gib is not None and memory_gib < 50:
                return "a100-40gb"
            return name
    return None


def get_gpu(name: str) -> GPU:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in CATALOGUE:
        raise HardwareError(f"unknown GPU {name!r}; choose one of {', '.join(CATALOGUE)}, or give a .json/.yaml GPU file")
    return CATALOGUE[key]


# A GPU file describes hardware the catalogue lacks, or a catalogue GPU as measured on one's own
# cluster: "base" names a catalogue entry whose values the file's keys replace (e.g. a measured
# gemm_fraction from mamf-finder, the NICs of one's nodes); without "base" every field is given.
_GPU_FIELDS = tuple(f.name for f in fields(GPU))
_FRACTIONS = ("gemm_fraction", "attention_fraction", "sustained_clock", "fp8_gemm_fraction")
_COUNTS = ("gpus_per_node", "sms")
# Keys that name a measured table, or null: what each must name, and the names there are.
_TABLE_KEYS = {"attention_curve": ("a measured table", FLASH_TABLES),
               "unfused_attention": ("a measured table of unfused attention", UNFUSED_TABLES),
               "nvlink_collectives": ("a measured table", tuple(TABLES))}


def gpu_from_dict(data: dict, source: str) -> GPU:
    allowed = {"base", *_GPU_FIELDS}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise HardwareError(f"{source}: unknown GPU key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    values = {k: v for k, v in data.items() if k != "base"}
    if "base" in data:
        if not isinstance(data["base"], str):
            raise HardwareError(f"{source}: base must name a catalogue GPU ({', '.join(CATALOGUE)}), got {data['base']!r}")
        base = get_gpu(data["base"])
        values = {**asdict(base), "name": file_gpu_name(base.name, source), **values}
    values.setdefault("name", Path(source).stem)
    values.setdefault("fp8_tflops", None)
    values.setdefault("fp8_gemm_fraction", None)
    values.setdefault("host_link_gbps", DEFAULT_HOST_LINK_GBPS)
    values.setdefault("sustained_clock", 1.0)  # no measurement: burst rates
    if "nvlink_gbps" in data and "nvlink_collectives" not in data:
        values["nvlink_collectives"] = None  # the base's measured node had other links
    values.setdefault("nvlink_collectives", None)
    if "attention_fraction" in data and "attention_curve" not in data:
        values["attention_curve"] = None  # the file's own attention measurement, with the generic shape
    values.setdefault("attention_curve", None)
    values.setdefault("fp8_transposes", True)
    values.setdefault("network_ring_gbps", None)
    values.setdefault("unfused_attention", None)
    missing = [k for k in _GPU_FIELDS if k not in values]
    if missing:
        raise HardwareError(f"{source}: missing GPU key(s) {', '.join(missing)} (or name a catalogue GPU as base)")
    for key, value in values.items():
        if key == "name":
            if not isinstance(value, str) or not value.strip():
                raise HardwareError(f"{source}: name must be a non-empty string, got {value!r}")
            continue
        if key in ("fp8_tflops", "fp8_gemm_fraction", "network_ring_gbps") and value is None:
            continue
        if key in _TABLE_KEYS:
            what, names = _TABLE_KEYS[key]
            if value is not None and not (isinstance(value, str) and value in names):
                raise HardwareError(f"{source}: {key} must name {what} ({', '.join(names)}) or be null, got {value!r}")
            continue
        if key == "fp8_transposes":
            if not isinstance(value, bool):
                raise HardwareError(f"{source}: fp8_transposes must be true (Hopper: fp8 GEMMs need transposed "
                                    f"copies) or false (Blackwell), got {value!r}")
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if key in _COUNTS:
            if not (number and math.isfinite(value) and value == int(value) and value >= 1):
                raise HardwareError(f"{source}: {key} must be a positive integer, got {value!r}")
            values[key] = int(value)
        elif not (number and 0 < value < math.inf) or (key in _FRACTIONS and value > 1):
            bound = ("a share of the burst rate in (0, 1]" if key == "sustained_clock" else
                     "a fraction of the dense peak in (0, 1]" if key in _FRACTIONS else "a positive number")
            raise HardwareError(f"{source}: {key} must be {bound}, got {value!r}")
    if "attention_curve" in data and values["attention_curve"] is not None and "attention_fraction" not in data:
        values["attention_fraction"] = round(reference_rate(values["attention_curve"]), 3)  # the table's level too
    return GPU(**values)


def load_gpu(name_or_path: str) -> GPU:
    """A catalogue name (or alias), or a path to a .json/.yaml/.yml GPU file."""
    if not names_a_file(name_or_path):
        return get_gpu(name_or_path)
    return gpu_from_dict(read_mapping(name_or_path, "GPU", HardwareError), name_or_path)
