"""The model's frozen configuration, read from (and written back to) a Hugging Face `config.json`.

A Qwen3 `config.json` names the decoder's sizes; this module keeps the fields the forward needs
and nothing else, so one frozen `ModelConfig` is hashable and can be a static argument of every
jitted program. Two spellings of the rotary base exist in the wild and both are read:

    {"rope_theta": 1000000.0}                                        (transformers < 5)
    {"rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}}   (transformers >= 5)

Only the "default" rope type is implemented; any other (yarn, linear, dynamic) is a ValueError
rather than a silently different model.

The multi-token-prediction (MTP) draft head is sized by `mtp_num_layers`, read from
`mtp_num_hidden_layers` (Qwen3-Next) or `num_nextn_predict_layers` (DeepSeek-V3); both mean
"decoder blocks inside the draft head" here, and 0 (the default when absent) means no head.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

# config.json keys that this module reads; everything else in a Hugging Face config is ignored.
_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Sizes and constants of a Qwen3 decoder with an optional MTP draft head.

    Attributes:
      vocab_size: rows of the embedding and of the output projection.
      hidden_size: width of the residual stream.
      intermediate_size: width of the SwiGLU hidden layer.
      num_layers: decoder blocks of the target model.
      num_heads: query heads.
      num_kv_heads: key/value heads (grouped-query attention: num_heads % num_kv_heads == 0).
      head_dim: per-head width; Qwen3 sets it explicitly, and it may differ from
        hidden_size // num_heads.
      rms_norm_eps: epsilon of every RMSNorm.
      rope_theta: rotary base.
      max_position_embeddings: longest position the checkpoint was trained for (informational:
        rotary embeddings are computed on the fly, no table is sized by it).
      tie_word_embeddings: the output projection reuses the embedding matrix.
      dtype: parameter and compute dtype name ("float32" or "bfloat16").
      mtp_num_layers: decoder blocks of the MTP draft head; 0 means no head.
      fused_projections: the parameter layout of the prepared programs, not of the checkpoint:
        q, k and v kernels stored as one `qkv_proj` and gate and up as one `gate_up_proj`, so
        each pair of sibling products runs as one (`model/fused.py`). Never read from or
        written to config.json.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40_960
    tie_word_embeddings: bool = False
    dtype: str = "float32"
    mtp_num_layers: int = 0
    fused_projections: bool = False

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {sorted(_DTYPES)}")
        if self.mtp_num_layers < 0:
            raise ValueError(f"mtp_num_layers={self.mtp_num_layers} is negative")

    @property
    def jnp_dtype(self) -> Any:
        """The jax dtype named by `dtype`."""
        return _DTYPES[self.dtype]

    @property
    def queries_per_kv(self) -> int:
        """Query heads sharing one key/value head."""
        return self.num_heads // self.num_kv_heads

    @property
    def has_mtp(self) -> bool:
        return self.mtp_num_layers > 0

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    # ----------------------------------------------------------------------------------------
    # Hugging Face config.json

    @classmethod
    def from_hf_dict(cls, d: dict) -> ModelConfig:
        """Reads a Hugging Face Qwen3 config dictionary.

        Raises:
          ValueError: a required key is missing or the rope type is not "default".
        """
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ValueError(f"config.json lacks required keys {missing}")
        heads = int(d["num_attention_heads"])
        head_dim = d.get("head_dim") or int(d["hidden_size"]) // heads
        dtype = d.get("dtype") or d.get("torch_dtype") or "float32"
        if dtype not in _DTYPES:
            raise ValueError(f"config.json dtype {dtype!r} is not one of {sorted(_DTYPES)}")
        return cls(
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(d),
            max_position_embeddings=int(d.get("max_position_embeddings", 40_960)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            dtype=dtype,
            mtp_num_layers=int(d.get("mtp_num_hidden_layers") or d.get("num_nextn_predict_layers") or 0),
        )

    def to_hf_dict(self) -> dict:
        """A config.json dictionary that both this module and transformers' Qwen3 read."""
        d = {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": False,
            "dtype": self.dtype,
        }
        if self.mtp_num_layers:
            d["mtp_num_hidden_layers"] = self.mtp_num_layers
        return d

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> ModelConfig:
        with open(path) as f:
            return cls.from_hf_dict(json.load(f))


def _rope_theta(d: dict) -> float:
    params = d.get("rope_parameters") or {}
    scaling = d.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
    if rope_type not in (None, "default"):
        raise ValueError(f"rope_type {rope_type!r} is not supported (only 'default')")
    theta = params.get("rope_theta", d.get("rope_theta"))
    return float(theta) if theta is not None else 10_000.0


def tiny_config(**overrides) -> ModelConfig:
    """The tiny named config of the tests: fast on two CPU cores, GQA ratio 2, head_dim != H/heads.

    Args:
      **overrides: fields to change, e.g. `tiny_config(mtp_num_layers=1, dtype="bfloat16")`.
    """
    base = ModelConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=10_000.0,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        dtype="float32",
        mtp_num_layers=0,
    )
    return base.replace(**overrides)
