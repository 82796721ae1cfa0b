"""Checkpoint folders: load and save config, weights and tokenizer together.

    folder/
      config.json                      ModelConfig.from_hf_dict / to_hf_dict
      model.safetensors                or model.safetensors.index.json + model-0000i-of-0000n
      tokenizer.json                   optional; read with the `tokenizers` library
      chat_template.jinja, tokenizer_config.json, generation_config.json
                                       optional; the chat template and EOS ids
                                       (`tokenizer_files.read_tokenizer_files`)

`load_checkpoint` returns a `LoadedModel`: config, params, tokenizer and a jitted full-sequence
`forward_logits` for verification. The serving programs take `config` and `params` from it and
build their own executables from `helios_jax.model.forward`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from tokenizers import Tokenizer

from helios_jax.model.config import ModelConfig
from helios_jax.model.forward import forward_full, forward_full_logits
from helios_jax.model.qwen3 import Params
from helios_jax.model.sharding import check_tensor_parallel, tensor_parallel_mesh
from helios_jax.model.tokenizer_files import TokenizerFiles, read_tokenizer_files
from helios_jax.model.weights import checkpoint_tensor_files, load_params, mtp_layers_in, save_params

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"

_full_logits = jax.jit(forward_full_logits, static_argnums=0)
_full_hidden = jax.jit(forward_full, static_argnums=0)


@dataclasses.dataclass(frozen=True, eq=False)
class LoadedModel:
    """A model read from (or about to be written to) a checkpoint folder."""

    config: ModelConfig
    params: Params
    tokenizer: Tokenizer | None = None
    # The folder's chat template, special token names and generation_config.json EOS ids.
    tokenizer_files: TokenizerFiles | None = None

    @property
    def has_mtp(self) -> bool:
        return self.config.has_mtp

    def forward_logits(self, token_ids) -> jax.Array:
        """f32[T, V] logits of one sequence (positions 0..T-1), no cache. Compiles per length."""
        return _full_logits(self.config, self.params, jnp.asarray(np.asarray(token_ids), jnp.int32))

    def forward_hidden(self, token_ids) -> jax.Array:
        """Final-normed hidden states [T, H] of one sequence (the MTP head's input)."""
        return _full_hidden(self.config, self.params, jnp.asarray(np.asarray(token_ids), jnp.int32))

    def save(self, folder: str | os.PathLike, *, max_shard_size: int | str | None = None) -> None:
        save_checkpoint(folder, self.config, self.params, self.tokenizer, max_shard_size=max_shard_size)


def load_checkpoint(
    folder: str | os.PathLike, *, dtype: str | None = None, tensor_parallel: int = 1
) -> LoadedModel:
    """Loads a Hugging Face style Qwen3 folder, with the MTP head when its tensors are present.

    The head's size comes from config.json (`mtp_num_hidden_layers` or
    `num_nextn_predict_layers`); a config that says nothing while `mtp.layers.*` tensors are
    present gets the count from the tensors.

    Args:
      folder: the checkpoint folder.
      dtype: "float32" or "bfloat16" to override config.json's dtype.
      tensor_parallel: N > 1 loads each tensor straight into its shards over the first N
        devices (`sharding.tensor_parallel_mesh`, the mesh the programs are built on).
    Raises:
      FileNotFoundError: config.json or the weights are missing.
      ValueError: a missing/unexpected tensor or a shape mismatch (named in the message), or a
        malformed tokenizer_config.json or generation_config.json, or a tensor_parallel
        degree that does not divide the model or exceeds the devices.
    """
    folder = pathlib.Path(folder)
    config_path = folder / CONFIG_FILE
    if not config_path.exists():
        raise FileNotFoundError(f"{config_path} is missing")
    config = ModelConfig.from_json_file(config_path)
    if dtype is not None:
        config = config.replace(dtype=dtype)
    if not config.has_mtp:
        config = config.replace(mtp_num_layers=mtp_layers_in(checkpoint_tensor_files(folder)))
    mesh = None
    if tensor_parallel > 1:
        check_tensor_parallel(config, tensor_parallel, devices=jax.device_count())
        mesh = tensor_parallel_mesh(tensor_parallel)
    params = load_params(folder, config, mesh=mesh)
    tokenizer_path = folder / TOKENIZER_FILE
    tokenizer = Tokenizer.from_file(str(tokenizer_path)) if tokenizer_path.exists() else None
    files = read_tokenizer_files(folder) if tokenizer is not None else None
    return LoadedModel(config=config, params=params, tokenizer=tokenizer, tokenizer_files=files)


def save_checkpoint(
    folder: str | os.PathLike,
    config: ModelConfig,
    params: Params,
    tokenizer: Tokenizer | None = None,
    *,
    max_shard_size: int | str | None = None,
) -> None:
    """Writes config.json, the safetensors weights (sharded above `max_shard_size` bytes) and
    tokenizer.json; `load_checkpoint` and transformers' `from_pretrained` both read the result."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(config.to_hf_dict(), indent=2) + "\n")
    save_params(folder, config, params, max_shard_size=max_shard_size)
    if tokenizer is not None:
        tokenizer.save(str(folder / TOKENIZER_FILE))
