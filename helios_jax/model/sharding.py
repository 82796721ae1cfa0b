"""Tensor parallelism: the `tp` mesh and where every parameter and KV-cache leaf lives on it.

Megatron-style layout over one mesh axis, `tp` (N devices):

    q_proj, k_proj, v_proj   kernel [H, heads * head_dim]     columns by head  P(None, "tp")
    o_proj                   kernel [heads * head_dim, H]     rows by head     P("tp", None)
    gate_proj, up_proj       kernel [H, I]                    columns          P(None, "tp")
    qkv_proj (fused.py)      kernel [H, kv_heads, g + 2, d]   by KV head       P(None, "tp")
    gate_up_proj (fused.py)  kernel [H, 2, I]                 columns          P(None, None, "tp")
    down_proj                kernel [I, H]                    rows             P("tp", None)
    embed_tokens/embedding   [V, H]                           rows (vocab)     P("tp", None)
    lm_head/kernel           [H, V]                           columns (vocab)  P(None, "tp")
    norms, mtp/fc            small                            replicated       P()
    KV pages                 [layers, kv_heads, pages, page_size, head_dim]
                                                              by KV head       P(None, "tp")

The MTP head's blocks are decoder blocks and follow the same rules. Shard i holds query heads
[i * heads/N, (i+1) * heads/N) and KV heads [i * kv/N, (i+1) * kv/N): grouped-query attention
maps query head h to KV head h // (heads/kv), so every shard's query heads read only its own KV
heads and attention is shard-local (`shard_attention_kernel`). The row-parallel products
(o_proj, down_proj) contract a sharded dimension: the compiler adds the all-reduce after them.

The mesh's axis is `AxisType.Auto`: shardings are pinned at each program's boundary (parameters,
device state, inputs and outputs) and inside only around the attention kernel (`shard_map`);
XLA's SPMD partitioner propagates the rest, so the model's modules keep their single-device code.
Explicit axes would make every contraction over a sharded dimension name its output sharding
in the modules themselves.

Degrees that do not divide query heads, KV heads, the intermediate size and the vocabulary are
refused (`check_tensor_parallel`). Replicating KV heads when N exceeds them (vLLM's way) is not
built: each rank would hold a copy of the cache it shares.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from helios_jax.model.config import ModelConfig

AXIS = "tp"
_COLUMN = PartitionSpec(None, AXIS)
_ROW = PartitionSpec(AXIS, None)
REPLICATED = PartitionSpec()
KV_PAGES = PartitionSpec(None, AXIS)  # [layers, kv_heads, pages, page_size, head_dim]

# Parameter leaves by (module, parameter) name, the last two entries of their flax path.
_SPECS = {
    ("q_proj", "kernel"): _COLUMN,
    ("k_proj", "kernel"): _COLUMN,
    ("v_proj", "kernel"): _COLUMN,
    ("o_proj", "kernel"): _ROW,
    ("gate_proj", "kernel"): _COLUMN,
    ("up_proj", "kernel"): _COLUMN,
    ("qkv_proj", "kernel"): _COLUMN,  # [H, kv_heads, g + 2, d]: a KV head's queries, key and value
    ("gate_up_proj", "kernel"): PartitionSpec(None, None, AXIS),  # [H, 2, I]
    ("down_proj", "kernel"): _ROW,
    ("embed_tokens", "embedding"): _ROW,
    ("lm_head", "kernel"): _COLUMN,
}


def check_tensor_parallel(config: ModelConfig, degree: int, *, devices: int | None = None) -> None:
    """Raises ValueError unless `degree` splits the model evenly (and, given `devices`, fits).

    Args:
      config: the model.
      degree: N, the size of the `tp` axis.
      devices: devices available; None skips that check.
    """
    if not isinstance(degree, int) or isinstance(degree, bool) or degree < 1:
        raise ValueError(f"tensor_parallel must be a positive integer, got {degree!r}")
    sizes = {
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "intermediate_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
    }
    for name, size in sizes.items():
        if size % degree:
            raise ValueError(f"tensor_parallel={degree} does not divide the model's {name}={size}")
    if devices is not None and degree > devices:
        raise ValueError(f"tensor_parallel={degree} needs {degree} devices, {devices} available")


def tensor_parallel_mesh(degree: int, devices=None) -> Mesh:
    """A one-axis mesh `("tp",)` over the first `degree` devices, with an Auto axis (module docs)."""
    devices = jax.devices() if devices is None else list(devices)
    if degree > len(devices):
        raise ValueError(f"tensor_parallel={degree} needs {degree} devices, {len(devices)} available")
    return Mesh(np.asarray(devices[:degree]), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,))


def param_spec(path: tuple[str, ...]) -> PartitionSpec:
    """The PartitionSpec of one parameter leaf, by its flax path (module docstring's table)."""
    return _SPECS.get(tuple(path[-2:]), REPLICATED)


def param_shardings(mesh: Mesh, params: Mapping):
    """NamedShardings mirroring the parameter tree (arrays or ShapeDtypeStructs)."""

    def one(path, leaf):
        del leaf
        return NamedSharding(mesh, param_spec(tuple(str(getattr(k, "key", k)) for k in path)))

    return jax.tree_util.tree_map_with_path(one, params)


def place_params(mesh: Mesh, params: Mapping):
    """The parameters laid out on the mesh: each device receives only its shard of a split leaf."""
    return jax.device_put(params, param_shardings(mesh, params))
