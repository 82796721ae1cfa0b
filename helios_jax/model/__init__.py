"""The Qwen3 model: flax modules, paged KV cache, MTP draft head, Hugging Face weights.

Modules, leaf first:
  config      ModelConfig (frozen, hashable) from/to config.json; `tiny_config` for tests.
  qwen3       flax linen modules; attention is an injected `attend` callable.
  cache       PagedKVCache [layers, kv_heads, pages, page_size, head_dim], PackedBatch.
  attention   dense causal attention and the paged attend over the ragged paged kernel.
  forward     pure forwards: full sequence, packed paged step, logits, MTP steps.
  mtp         deprecated: `propose` moved to helios_jax.reference.mtp.paged_proposals.
  weights     safetensors <-> flax tree, transformers' tensor names plus `mtp.*`.
  checkpoint  load_checkpoint / save_checkpoint of a whole folder.

docs/model.md describes the architecture, the cache layout and the checkpoint format.
"""

import importlib

from helios_jax.model.cache import (
    PackedBatch,
    PagedKVCache,
    cache_write_locations,
    init_paged_cache,
    packed_token_rows,
    write_kv,
)
from helios_jax.model.checkpoint import LoadedModel, load_checkpoint, save_checkpoint
from helios_jax.model.config import ModelConfig, tiny_config
from helios_jax.model.forward import (
    compute_logits,
    draft_forward_full,
    draft_forward_packed,
    forward_full,
    forward_full_logits,
    forward_packed,
    init_params,
    param_shapes,
    softmax_scale,
)
from helios_jax.model.qwen3 import Params, Qwen3

__all__ = [
    "LoadedModel",
    "ModelConfig",
    "PackedBatch",
    "PagedKVCache",
    "Params",
    "Qwen3",
    "cache_write_locations",
    "compute_logits",
    "draft_forward_full",
    "draft_forward_packed",
    "forward_full",
    "forward_full_logits",
    "forward_packed",
    "init_paged_cache",
    "init_params",
    "load_checkpoint",
    "packed_token_rows",
    "param_shapes",
    "save_checkpoint",
    "softmax_scale",
    "tiny_config",
    "write_kv",
]


def __getattr__(name: str) -> object:
    """`propose` and `Proposals` moved to helios_jax.reference.mtp (see helios_jax.model.mtp)."""
    # import_module, not `from helios_jax.model import mtp`: that form asks this very hook first.
    mtp = importlib.import_module("helios_jax.model.mtp")
    if name in mtp.MOVED:
        return mtp.moved(name, stacklevel=3)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
