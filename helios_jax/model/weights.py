"""Weights in the Hugging Face format: safetensors files named with transformers' tensor names.

A checkpoint folder holds `config.json` and either `model.safetensors` or the sharded form
(`model.safetensors.index.json` whose "weight_map" names the shard of every tensor). The
tensor names are transformers' Qwen3 names, so a real Qwen3 checkpoint loads unchanged, plus
the MTP head's names (Qwen3-Next style):

    model.embed_tokens.weight                       [V, H]
    model.layers.{i}.input_layernorm.weight         [H]
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight  torch Linear [out, in]
    model.layers.{i}.self_attn.{q,k}_norm.weight    [head_dim]
    model.layers.{i}.post_attention_layernorm.weight  [H]
    model.layers.{i}.mlp.{gate,up,down}_proj.weight   [out, in]
    model.norm.weight                               [H]
    lm_head.weight                                  [V, H] (absent or ignored when tied)
    mtp.pre_fc_norm_embedding.weight                [H]
    mtp.pre_fc_norm_hidden.weight                   [H]
    mtp.fc.weight                                   [H, 2H]  input is concat(embedding, hidden)
    mtp.layers.{j}.*                                as model.layers.{i}.*

The mapping to the flax tree is mechanical (`flax_path_to_hf_name`): `layers_N` becomes
`layers.N`, leaves `kernel`/`embedding` become `weight`, target tensors gain the `model.`
prefix, and `kernel`s are transposed (flax Dense is [in, out]).
"""

from __future__ import annotations

import json
import os
import pathlib
import re

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy; safetensors' numpy path needs it)
import numpy as np
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding
from safetensors import safe_open
from safetensors.numpy import save_file

from helios_jax.model.config import ModelConfig
from helios_jax.model.forward import param_shapes
from helios_jax.model.qwen3 import Params
from helios_jax.model.sharding import param_spec

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Tensors some checkpoints carry that the model recomputes or does not need.
_BENIGN = re.compile(r"(.*\.rotary_emb\.inv_freq)$")


def flax_path_to_hf_name(path: tuple[str, ...]) -> tuple[str, bool]:
    """('layers_0', 'self_attn', 'q_proj', 'kernel') -> ('model.layers.0.self_attn.q_proj.weight', True).

    Returns:
      the transformers tensor name and whether the tensor is stored transposed.
    """
    parts = [re.sub(r"^layers_(\d+)$", r"layers.\1", p) for p in path[:-1]]
    leaf = path[-1]
    name = ".".join(parts + ["weight"])
    if parts[0] not in ("lm_head", "mtp"):
        name = "model." + name
    return name, leaf == "kernel"


def expected_tensors(config: ModelConfig) -> dict[str, tuple[tuple[str, ...], bool, tuple[int, ...]]]:
    """Every tensor a checkpoint of `config` holds: name -> (flax path, transposed, stored shape)."""
    out = {}
    for path, leaf in traverse_util.flatten_dict(param_shapes(config)).items():
        name, transposed = flax_path_to_hf_name(path)
        shape = tuple(leaf.shape[::-1]) if transposed else tuple(leaf.shape)
        out[name] = (path, transposed, shape)
    return out


def checkpoint_tensor_files(folder: str | os.PathLike) -> dict[str, pathlib.Path]:
    """tensor name -> the safetensors file holding it, from the index or the single file.

    Raises:
      FileNotFoundError: neither form is present, or the index names a missing shard.
    """
    folder = pathlib.Path(folder)
    index = folder / INDEX_FILE
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {name: folder / shard for name, shard in weight_map.items()}
        for shard in sorted(set(files.values())):
            if not shard.exists():
                raise FileNotFoundError(f"{index} names shard {shard.name}, which is missing")
        return files
    single = folder / SINGLE_FILE
    if not single.exists():
        raise FileNotFoundError(f"{folder} holds neither {SINGLE_FILE} nor {INDEX_FILE}")
    with safe_open(single, framework="numpy") as f:
        return {name: single for name in f.keys()}


def mtp_layers_in(names) -> int:
    """Number of MTP decoder blocks that tensor names describe (0 when there is no head)."""
    layers = {int(m.group(1)) for n in names if (m := re.match(r"mtp\.layers\.(\d+)\.", n))}
    return max(layers) + 1 if layers else 0


def load_params(folder: str | os.PathLike, config: ModelConfig, *, mesh: Mesh | None = None) -> Params:
    """Reads and validates every tensor of `config` from a checkpoint folder.

    Tensors are cast to `config.dtype`. For tied embeddings a stored `lm_head.weight` is ignored,
    as transformers does. With a tensor-parallel `mesh` each tensor goes from the host straight to
    its shards (`sharding.param_spec`): no device ever holds a whole split matrix.

    Raises:
      FileNotFoundError: no weights file (see `checkpoint_tensor_files`).
      ValueError: a missing tensor, an unexpected tensor, or a shape mismatch, each named.
    """
    files = checkpoint_tensor_files(folder)
    expected = expected_tensors(config)
    ignored = {n for n in files if _BENIGN.match(n)}
    if config.tie_word_embeddings:
        ignored.add("lm_head.weight")
    missing = sorted(set(expected) - set(files))
    if missing:
        raise ValueError(f"checkpoint {folder} lacks tensors {missing}")
    unexpected = sorted(set(files) - set(expected) - ignored)
    if unexpected:
        raise ValueError(f"checkpoint {folder} has unexpected tensors {unexpected}")

    by_file: dict[pathlib.Path, list[str]] = {}
    for name in expected:
        by_file.setdefault(files[name], []).append(name)
    flat = {}
    for path, names in by_file.items():
        with safe_open(path, framework="numpy") as f:
            for name in names:
                array = f.get_tensor(name)
                tree_path, transposed, shape = expected[name]
                if tuple(array.shape) != shape:
                    raise ValueError(
                        f"tensor {name}: checkpoint shape {tuple(array.shape)} != expected {shape}"
                    )
                if transposed:
                    array = array.T
                flat[tree_path] = _place(array, config, tree_path, mesh)
    return traverse_util.unflatten_dict(flat)


def _place(array: np.ndarray, config: ModelConfig, tree_path, mesh: Mesh | None) -> jax.Array:
    if mesh is None:
        return jnp.asarray(array).astype(config.jnp_dtype)
    # The host cast rounds to nearest even, as the device cast does (ml_dtypes for bfloat16).
    host = np.asarray(array).astype(config.jnp_dtype)
    return jax.device_put(host, NamedSharding(mesh, param_spec(tuple(tree_path))))


def parse_size(size: int | str) -> int:
    """Bytes from an int or a transformers-style string ("20KB", "5GB", "2MiB")."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B)?\s*", size, re.IGNORECASE)
    if not m:
        raise ValueError(f"cannot parse size {size!r}")
    unit = (m.group(2) or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    return int(float(m.group(1)) * scale[unit])


def save_params(
    folder: str | os.PathLike,
    config: ModelConfig,
    params: Params,
    *,
    max_shard_size: int | str | None = None,
) -> list[pathlib.Path]:
    """Writes `params` as `model.safetensors`, or as shards plus an index when they exceed
    `max_shard_size` bytes (tensors are kept whole; a shard holds at least one tensor).

    Returns:
      the files written.
    """
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for path, leaf in traverse_util.flatten_dict(params).items():
        name, transposed = flax_path_to_hf_name(path)
        array = np.asarray(leaf)
        tensors[name] = np.ascontiguousarray(array.T if transposed else array)
    metadata = {"format": "pt"}  # transformers refuses safetensors files without a format
    limit = parse_size(max_shard_size) if max_shard_size is not None else None
    total = sum(a.nbytes for a in tensors.values())
    if limit is None or total <= limit:
        save_file(tensors, folder / SINGLE_FILE, metadata=metadata)
        return [folder / SINGLE_FILE]

    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name in sorted(tensors):
        if shards[-1] and size + tensors[name].nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += tensors[name].nbytes
    written, weight_map = [], {}
    for i, shard in enumerate(shards):
        shard_name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, folder / shard_name, metadata=metadata)
        written.append(folder / shard_name)
        weight_map.update({name: shard_name for name in shard})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return written + [folder / INDEX_FILE]
