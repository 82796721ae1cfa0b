"""Sibling projections stored as one kernel, so that each pair of them is one product.

A decoder block reads its normed input three times for attention (q, k and v projections) and
twice for the MLP (gate and up). The prepared programs store those kernels concatenated
(`ModelConfig.fused_projections`) and compute each group as one product: on this CPU
sixteen-row decode programs ran 0.87-0.94x of the separate products' time, one-row programs
0.94-1.01x (`scripts/bench/fused_projections.py`; docs/benchmarks-engine.md, tenth stop), and on
a GPU it is two kernel launches a block instead of five. vLLM's `QKVParallelLinear` and
`MergedColumnParallelLinear` do the same.

Layouts (H hidden, kv KV heads, g = queries_per_kv, d head_dim, I intermediate):

    self_attn/qkv_proj/kernel    [H, kv, g + 2, d]   per KV head j: its g query heads
                                                     (query head j*g + i), then k_j, then v_j
    mlp/gate_up_proj/kernel      [H, 2, I]           [:, 0] gate, [:, 1] up

Grouping by KV head keeps tensor parallelism a split of one axis (`sharding.py`): shard i holds
its KV heads' query heads, keys and values, exactly the heads it held unfused, and gate and up
split on I as before. Checkpoints keep transformers' separate tensors (`weights.py`); `prepare`
fuses the loaded parameters once (`fuse_projections`), and `split_projections` undoes it.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax.numpy as jnp

from helios_jax.model.config import ModelConfig
from helios_jax.model.qwen3 import Params


def fuse_projections(config: ModelConfig, params: Params) -> tuple[ModelConfig, Params]:
    """(config, params) in the fused layout; unchanged when `config` is already fused. Every
    decoder block is fused, the MTP head's included; other leaves are shared, not copied."""
    if config.fused_projections:
        return config, params
    return config.replace(fused_projections=True), _map_blocks(params, lambda b: _fuse_block(config, b))


def split_projections(config: ModelConfig, params: Params) -> tuple[ModelConfig, Params]:
    """The inverse of :func:`fuse_projections`: transformers' separate kernels."""
    if not config.fused_projections:
        return config, params
    return config.replace(fused_projections=False), _map_blocks(params, lambda b: _split_block(config, b))


def _map_blocks(tree: Mapping, fn) -> dict:
    """`tree` with `fn` applied to every decoder block (a dict holding `self_attn` and `mlp`)."""
    if "self_attn" in tree and "mlp" in tree:
        return fn(tree)
    return {k: _map_blocks(v, fn) if isinstance(v, Mapping) else v for k, v in tree.items()}


def _fuse_block(c: ModelConfig, block: Mapping) -> dict:
    attn, mlp = block["self_attn"], block["mlp"]
    hidden, kv, g, d = c.hidden_size, c.num_kv_heads, c.queries_per_kv, c.head_dim
    q = attn["q_proj"]["kernel"].reshape(hidden, kv, g, d)
    k = attn["k_proj"]["kernel"].reshape(hidden, kv, 1, d)
    v = attn["v_proj"]["kernel"].reshape(hidden, kv, 1, d)
    fused_attn = {n: x for n, x in attn.items() if n not in ("q_proj", "k_proj", "v_proj")}
    fused_attn["qkv_proj"] = {"kernel": jnp.concatenate([q, k, v], axis=2)}
    gate_up = jnp.stack([mlp["gate_proj"]["kernel"], mlp["up_proj"]["kernel"]], axis=1)
    fused_mlp = {n: x for n, x in mlp.items() if n not in ("gate_proj", "up_proj")}
    fused_mlp["gate_up_proj"] = {"kernel": gate_up}
    return {**block, "self_attn": fused_attn, "mlp": fused_mlp}


def _split_block(c: ModelConfig, block: Mapping) -> dict:
    attn, mlp = block["self_attn"], block["mlp"]
    hidden, g = c.hidden_size, c.queries_per_kv
    qkv = attn["qkv_proj"]["kernel"]
    split_attn = {n: x for n, x in attn.items() if n != "qkv_proj"}
    split_attn["q_proj"] = {"kernel": qkv[:, :, :g].reshape(hidden, -1)}
    split_attn["k_proj"] = {"kernel": qkv[:, :, g].reshape(hidden, -1)}
    split_attn["v_proj"] = {"kernel": qkv[:, :, g + 1].reshape(hidden, -1)}
    gate_up = mlp["gate_up_proj"]["kernel"]
    split_mlp = {n: x for n, x in mlp.items() if n != "gate_up_proj"}
    split_mlp["gate_proj"] = {"kernel": gate_up[:, 0]}
    split_mlp["up_proj"] = {"kernel": gate_up[:, 1]}
    return {**block, "self_attn": split_attn, "mlp": split_mlp}
