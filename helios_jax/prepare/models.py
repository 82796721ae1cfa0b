"""The models `prepare` and the engine compile for: a checkpoint folder, the embedded default
model, or (tests and benchmarks) a seeded tiny random model.

`load_engine_model` is the one loader of the command-line programs (``python -m
helios_jax.prepare``, ``python -m helios_jax.serve``): no folder is the embedded default model
(`helios_jax.model.default`), and no dtype is float32 on a CPU (CPUs without bfloat16 arithmetic
run float32 much faster: 2.9x at concurrency 1 for the default model,
docs/benchmarks-engine.md) and bfloat16 on an accelerator (float32 products there run at IEEE
precision without tensor cores, and the attention kernel's float32 tiles spill; float32 stays
the numerics reference, on request with ``--dtype=float32``).
"""

from __future__ import annotations

import warnings

import jax

from helios_jax.model import LoadedModel, ModelConfig, Params, init_params, load_checkpoint, tiny_config


def default_dtype() -> str:
    """The compute dtype an unset ``--dtype`` means: float32 on a CPU, bfloat16 elsewhere."""
    return "float32" if jax.default_backend() == "cpu" else "bfloat16"


def load_engine_model(
    path: str | None = None, *, dtype: str | None = None, tensor_parallel: int = 1
) -> LoadedModel:
    """A checkpoint folder, or the embedded default model when `path` is None, in `dtype`
    (``None``: :func:`default_dtype`); `tensor_parallel` > 1 loads the weights sharded over that
    many devices (`load_checkpoint`)."""
    if path is None:
        from helios_jax.model.default import default_model_path

        path = str(default_model_path())
    return load_checkpoint(path, dtype=dtype or default_dtype(), tensor_parallel=tensor_parallel)


def default_model_config(dtype: str = "float32") -> ModelConfig:
    """The weightless tiny model: the tests' tiny config with a one-block MTP head."""
    return tiny_config(mtp_num_layers=1, dtype=dtype)


def random_model(*, dtype: str = "float32", seed: int = 0) -> tuple[ModelConfig, Params]:
    """(ModelConfig, params) of a seeded tiny random model with an MTP head (tests, benchmarks)."""
    config = default_model_config(dtype)
    return config, init_params(config, jax.random.key(seed))


def load_model(path: str | None, *, dtype: str = "float32", seed: int = 0) -> tuple[ModelConfig, Params]:
    """Deprecated: `load_engine_model(path)` for a folder, `random_model()` for the tiny random one."""
    warnings.warn(
        "helios_jax.prepare.load_model is deprecated: use load_engine_model(path) for a checkpoint "
        "or random_model() for the tiny random model",
        DeprecationWarning,
        stacklevel=2,
    )
    if path:
        loaded = load_checkpoint(path, dtype=dtype)
        return loaded.config, loaded.params
    return random_model(dtype=dtype, seed=seed)
