"""The command line of ``python -m helios_jax.prepare``: flags in, a compiled (and measured) catalog out.

The engine flags are `EngineOptions`' (the same definition ``python -m helios_jax.serve`` uses,
without the scheduler policy flags); prepare adds ``--name``, ``--measure``, ``--measure_runs``,
``--catalog_out`` and ``--compilation_cache_dir``. `main` only parses flags and prints; the work
is `helios_jax.prepare.prepare`.
"""

from __future__ import annotations

from absl import flags

from helios_jax.compilation_cache import enable_compilation_cache
from helios_jax.engine_config import EngineConfig
from helios_jax.engine_options import EngineOptions
from helios_jax.model import ModelConfig
from helios_jax.prepare import prepare
from helios_jax.prepare.models import load_engine_model


def define_flags(fv: flags.FlagValues = flags.FLAGS) -> None:
    """The engine flags (`EngineOptions.define_flags`) and prepare's own."""
    EngineOptions.define_flags(fv, policy=False)
    flags.DEFINE_string("name", "prepared", "catalog name", flag_values=fv)
    flags.DEFINE_bool("measure", False, "time every program after compiling", flag_values=fv)
    flags.DEFINE_integer("measure_runs", 5, "timed executions per program", flag_values=fv)
    flags.DEFINE_string("catalog_out", None, "write the (measured) catalog JSON here", flag_values=fv)
    flags.DEFINE_string(
        "compilation_cache_dir",
        None,
        "persistent compilation cache (default: "
        "$JAX_COMPILATION_CACHE_DIR or ~/.cache/helios_jax/xla; empty: none)",
        flag_values=fv,
    )


def engine_from_flags(
    fv: flags.FlagValues = flags.FLAGS, model_config: ModelConfig | None = None
) -> EngineConfig:
    """The engine config the flags ask for, resolved against the loaded model's config."""
    return EngineOptions.from_flags(fv).engine_config(model_config)


def main(argv) -> int:
    del argv
    fv = flags.FLAGS
    cache = enable_compilation_cache(fv.compilation_cache_dir)
    options = EngineOptions.from_flags(fv)
    model = load_engine_model(options.model, dtype=options.dtype, tensor_parallel=options.tensor_parallel)
    config = model.config
    engine = options.engine_config(config)
    catalog = engine.catalog(fv.name)
    print(
        f"model: {options.model or 'the embedded default model'} ({config.num_layers} layers, "
        f"hidden {config.hidden_size}, vocab {config.vocab_size}, mtp {config.mtp_num_layers}, "
        f"{config.dtype}); "
        f"compilation cache {cache or 'off'}"
    )
    print(
        f"catalog {catalog.name}: {len(catalog.graphs)} programs, mode {catalog.mode}, "
        f"request slots {engine.request_slots}, R {engine.speculative_token_capacity}, "
        f"max_model_len {engine.max_model_len}"
    )
    prepared = prepare(
        config, model.params, engine, name=fv.name, do_measure=fv.measure, runs=fv.measure_runs
    )
    print(f"compiled {len(prepared.programs)} programs in {prepared.compile_seconds:.1f} s")
    print("capture headroom:")
    for line in prepared.headroom.lines():
        print("  " + line)
    if fv.catalog_out:
        prepared.catalog.save(fv.catalog_out)
        print(f"wrote {fv.catalog_out}")
    return 0
