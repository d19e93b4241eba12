"""Hugging Face Llama <-> hybridpar's canonical parameters: names, slices, config (pure Python).

Each canonical parameter (hybridpar/runtime/model.py) is cut along one axis into *segments*, each a
contiguous run of one HF tensor along the same axis:

- ``linear_qkv`` [(heads + 2 kv) x head_dim, hidden], laid out per query group as
  ``[q of the group's heads; k; v]`` (megatron), <- ``q_proj``/``k_proj``/``v_proj`` rows, group by group;
- ``linear_fc1`` [2 ffn, hidden] = ``[gate; up]`` <- ``gate_proj``, ``up_proj``;
- every other weight is one HF tensor whole (``linear_proj`` = ``o_proj``, ``linear_fc2`` =
  ``down_proj``, norms, embedding, output layer = ``lm_head``).

Both use RoPE on non-interleaved halves, so no row permutation is needed. The axis is the TP
split axis (rows, or columns for ``linear_proj``/``linear_fc2``), so a TP shard, whatever rows
``model.shard_positions`` gives it, is read as slices of HF tensors (hf_import.py), and an export
writes each HF tensor from one full canonical tensor (hf_export.py).
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

from hybridpar.checkpoint.files import CheckpointError

# hybridpar.model.ModelOptions.norm_eps: the RMSNorm epsilon every hybridpar model uses.
NORM_EPS = 1e-5
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
ROW_SPLIT = {"embedding.word_embeddings.weight", "output_layer.weight"}


@dataclass(frozen=True)
class Segment:
    hf_name: str
    start: int  # along the axis, in the canonical tensor
    length: int
    hf_start: int  # along the axis, in the HF tensor


@dataclass(frozen=True)
class CanonicalParam:
    cname: str
    shape: tuple  # full (one-process) shape
    axis: int
    segments: tuple

    def hf_shapes(self) -> dict[str, tuple]:
        """Each HF tensor this parameter makes, with its shape."""
        out = {}
        for s in self.segments:
            shape = list(self.shape)
            shape[self.axis] = max(out.get(s.hf_name, (0,) * len(shape))[self.axis], s.hf_start + s.length)
            out[s.hf_name] = tuple(shape)
        return out


def _whole(cname: str, shape: tuple, hf_name: str, axis: int = 0) -> CanonicalParam:
    return CanonicalParam(cname, shape, axis, (Segment(hf_name, 0, shape[axis], 0),))


def canonical_layout(spec, tied: bool) -> list[CanonicalParam]:
    """Every canonical parameter of ``spec`` (a topology ModelSpec, SwiGLU) with its HF segments."""
    if spec.mlp != "swiglu":
        raise CheckpointError(f"model {spec.name} has a {spec.mlp} MLP: Hugging Face's Llama needs SwiGLU")
    h, hn, ng, f = spec.hidden, spec.head_dim, spec.kv_heads, spec.ffn_hidden
    per = spec.heads // ng
    out = [_whole("embedding.word_embeddings.weight", (spec.vocab, h), "model.embed_tokens.weight")]
    for i in range(spec.layers):
        c, hf = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = []
        for g in range(ng):
            at = g * (per + 2) * hn
            qkv += [Segment(hf + "self_attn.q_proj.weight", at, per * hn, g * per * hn),
                    Segment(hf + "self_attn.k_proj.weight", at + per * hn, hn, g * hn),
                    Segment(hf + "self_attn.v_proj.weight", at + (per + 1) * hn, hn, g * hn)]
        fc1 = (Segment(hf + "mlp.gate_proj.weight", 0, f, 0), Segment(hf + "mlp.up_proj.weight", f, f, 0))
        out += [
            _whole(c + "input_layernorm.weight", (h,), hf + "input_layernorm.weight"),
            CanonicalParam(c + "self_attention.linear_qkv.weight", ((spec.heads + 2 * ng) * hn, h), 0, tuple(qkv)),
            _whole(c + "self_attention.linear_proj.weight", (h, spec.heads * hn), hf + "self_attn.o_proj.weight", axis=1),
            _whole(c + "pre_mlp_layernorm.weight", (h,), hf + "post_attention_layernorm.weight"),
            CanonicalParam(c + "mlp.linear_fc1.weight", (2 * f, h), 0, fc1),
            _whole(c + "mlp.linear_fc2.weight", (h, f), hf + "mlp.down_proj.weight", axis=1),
        ]
    out.append(_whole("decoder.final_layernorm.weight", (h,), "model.norm.weight"))
    if not tied:
        out.append(_whole("output_layer.weight", (spec.vocab, h), "lm_head.weight"))
    return out


# --- config.json ----------------------------------------------------------------------------
def hf_config(spec, tied: bool, seq_len: int, dtype: str, eos_token_id: int | None) -> dict:
    """A ``LlamaConfig`` as config.json: ``rope_theta`` for transformers 4.x and vLLM,
    ``rope_parameters`` for transformers 5."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": spec.vocab, "hidden_size": spec.hidden, "intermediate_size": spec.ffn_hidden,
        "num_hidden_layers": spec.layers, "num_attention_heads": spec.heads, "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim, "hidden_act": "silu", "max_position_embeddings": seq_len,
        "rms_norm_eps": NORM_EPS, "rope_theta": float(spec.rope_theta),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(spec.rope_theta)},
        "tie_word_embeddings": tied, "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
        "bos_token_id": None, "eos_token_id": eos_token_id, "pad_token_id": None,
        "dtype": dtype, "torch_dtype": dtype, "use_cache": True,
    }


def read_config(hf_dir: str) -> dict:
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        raise CheckpointError(f"{hf_dir} is not a Hugging Face model directory: no config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"cannot read {path}: {err}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return config


def _rope(config: dict) -> tuple[float, str]:
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    return float(theta), rope.get("rope_type", rope.get("type", "default"))


def config_differences(config: dict, spec, tied: bool) -> list[str]:
    """How a Hugging Face config.json differs from ``spec`` (with LlamaConfig's defaults)."""
    heads = config.get("num_attention_heads")
    theta, rope_type = _rope(config)
    hidden = config.get("hidden_size")
    want = {
        "model_type": ("llama", config.get("model_type")),
        "hidden_size": (spec.hidden, hidden),
        "num_hidden_layers": (spec.layers, config.get("num_hidden_layers")),
        "intermediate_size": (spec.ffn_hidden, config.get("intermediate_size")),
        "num_attention_heads": (spec.heads, heads),
        "num_key_value_heads": (spec.kv_heads, config.get("num_key_value_heads") or heads),
        "head_dim": (spec.head_dim, config.get("head_dim") or (hidden // heads if hidden and heads else None)),
        "vocab_size": (spec.vocab, config.get("vocab_size")),
        "tie_word_embeddings": (tied, bool(config.get("tie_word_embeddings", False))),
        "rope_theta": (float(spec.rope_theta), theta),
        "rope_type": ("default", rope_type),
        "rms_norm_eps": (NORM_EPS, config.get("rms_norm_eps", 1e-6)),
        "hidden_act": ("silu" if spec.mlp == "swiglu" else spec.mlp, config.get("hidden_act", "silu")),
        "attention_bias": (False, bool(config.get("attention_bias", False))),
        "mlp_bias": (False, bool(config.get("mlp_bias", False))),
    }
    return [f"{k} {got} (HF) vs {mine} (recipe)" for k, (mine, got) in want.items() if got != mine]


# --- safetensors files, read without torch ---------------------------------------------------
def weight_files(hf_dir: str) -> dict[str, str]:
    """HF tensor name -> the safetensors file holding it."""
    index = os.path.join(hf_dir, INDEX_FILE)
    if os.path.isfile(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"cannot read {index}: {err!r}") from None
        return {name: os.path.join(hf_dir, file) for name, file in weight_map.items()}
    single = os.path.join(hf_dir, SINGLE_FILE)
    if not os.path.isfile(single):
        raise CheckpointError(f"{hf_dir} has no {SINGLE_FILE} or {INDEX_FILE}: save the model with safetensors "
                              "(save_pretrained's default)")
    return {name: single for name in safetensors_header(single)}


def safetensors_header(path: str) -> dict:
    """The tensor table of a .safetensors file: {name: {"dtype", "shape", "data_offsets"}}."""
    try:
        with open(path, "rb") as f:
            size = struct.unpack("<Q", f.read(8))[0]
            if size > os.path.getsize(path):
                raise ValueError("header longer than the file")
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error) as err:
        raise CheckpointError(f"{path} is not a readable safetensors file: {err}") from None
    header.pop("__metadata__", None)
    return header


def check_hf_weights(hf_dir: str, layout: list[CanonicalParam]) -> dict[str, str]:
    """Every HF tensor the layout needs exists with its shape; returns name -> file."""
    files = weight_files(hf_dir)
    headers: dict[str, dict] = {}
    for p in layout:
        for name, shape in p.hf_shapes().items():
            if name not in files:
                raise CheckpointError(f"{hf_dir} lacks the tensor {name}")
            path = files[name]
            if path not in headers:
                if not os.path.isfile(path):
                    raise CheckpointError(f"{path} is missing (named by {INDEX_FILE})")
                headers[path] = safetensors_header(path)
            got = headers[path].get(name, {}).get("shape")
            if got is None or tuple(got) != shape:
                raise CheckpointError(f"{path}: {name} has shape {got}, this model needs {list(shape)}")
    return files


def check_hf_dir(hf_dir: str, spec, tied: bool) -> dict[str, str]:
    """The pre-launch check of ``--init-from-hf DIR`` against the run's model."""
    if not os.path.isdir(hf_dir):
        raise CheckpointError(f"Hugging Face model directory {hf_dir} does not exist")
    diff = config_differences(read_config(hf_dir), spec, tied)
    if diff:
        raise CheckpointError(f"{hf_dir} is not this recipe's model: {'; '.join(diff)}")
    return check_hf_weights(hf_dir, canonical_layout(spec, tied))
