"""Model shapes: presets and loading from JSON/YAML files.

A shape is what the planner and the runtime both need: layers, hidden, ffn_hidden, heads,
kv_heads, vocab and the MLP kind ("swiglu": 3-matrix gated MLP; "gelu": 2-matrix MLP).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from math import inf
from pathlib import Path

from .spec_files import names_a_file, read_mapping

MLP_KINDS = ("swiglu", "gelu")


class ModelSpecError(ValueError):
    """A model name or file that cannot be used."""


@dataclass(frozen=True)
class ModelSpec:
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int
    vocab: int
    mlp: str = "swiglu"
    name: str = "custom"
    tied_embeddings: bool = False
    rope_theta: float = 10000.0  # RoPE base; Llama 3 uses 500,000 (its released config)

    def __post_init__(self):
        for key in ("layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ModelSpecError(f"model {key} must be a positive integer, got {value!r}")
        if isinstance(self.rope_theta, bool) or not isinstance(self.rope_theta, (int, float)) or not 0 < self.rope_theta < inf:
            raise ModelSpecError(f"model rope_theta must be a positive number, got {self.rope_theta!r}")
        if self.mlp not in MLP_KINDS:
            raise ModelSpecError(f"model mlp must be one of {', '.join(MLP_KINDS)}, got {self.mlp!r}")
        if self.hidden % self.heads:
            raise ModelSpecError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ModelSpecError(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "swiglu" else 2

    # Parameter counts of a Llama-style decoder: no biases, RMSNorm weights only.
    @property
    def attention_params_per_layer(self) -> int:
        kv = self.kv_heads * self.head_dim
        return self.hidden * self.hidden * 2 + self.hidden * kv * 2  # q, out, k, v

    @property
    def mlp_params_per_layer(self) -> int:
        return self.mlp_matrices * self.hidden * self.ffn_hidden

    @property
    def params_per_layer(self) -> int:
        return self.attention_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        output = 0 if self.tied_embeddings else self.embedding_params
        return self.layers * self.params_per_layer + self.embedding_params + output + self.hidden

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, ModelSpec] = {
    # Llama 3 shapes: "The Llama 3 Herd of Models", Table 3; vocab 128,256 from the released config.
    "llama3-8b": ModelSpec(32, 4096, 14336, 32, 8, 128256, "swiglu", "llama3-8b", rope_theta=500000.0),
    "llama3-70b": ModelSpec(80, 8192, 28672, 64, 8, 128256, "swiglu", "llama3-70b", rope_theta=500000.0),
    "llama3-405b": ModelSpec(126, 16384, 53248, 128, 8, 128256, "swiglu", "llama3-405b", rope_theta=500000.0),
    # GPT-3 175B: Brown et al. 2020, Table 2.1 (96 layers, d_model 12288, 96 heads, FFN 4x).
    "gpt3-175b": ModelSpec(96, 12288, 49152, 96, 96, 51200, "gelu", "gpt3-175b"),
    # Tiny models that train on CPU ranks (tests, recipes/tiny.yaml).
    "tiny": ModelSpec(4, 64, 176, 4, 2, 320, "swiglu", "tiny"),
    "tiny-deep": ModelSpec(8, 128, 352, 8, 4, 320, "swiglu", "tiny-deep"),
}

_FILE_KEYS = {f.name for f in fields(ModelSpec)}
_REQUIRED_KEYS = ("layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "mlp")


def model_from_dict(data, source: str = "model") -> ModelSpec:
    if not isinstance(data, dict):
        raise ModelSpecError(f"{source}: expected a mapping of model keys, got {type(data).__name__}")
    unknown = sorted(set(data) - _FILE_KEYS)
    if unknown:
        raise ModelSpecError(f"{source}: unknown model key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_FILE_KEYS))}")
    missing = [k for k in _REQUIRED_KEYS if k not in data]
    if missing:
        raise ModelSpecError(f"{source}: missing model key(s) {', '.join(missing)}")
    data = dict(data)
    data.setdefault("name", Path(source).stem if source != "model" else "custom")
    return ModelSpec(**data)


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name, or a path to a .json/.yaml/.yml file with the model keys."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    if not names_a_file(name_or_path):
        raise ModelSpecError(f"unknown model {name_or_path!r}; presets: {', '.join(PRESETS)}, or give a .json/.yaml file")
    return model_from_dict(read_mapping(name_or_path, "model", ModelSpecError), name_or_path)
