"""Prepare (the spec's "ignition"): plan the catalog, compile every program ahead of time, measure.

    python -m helios_jax.prepare [--model=FOLDER] [--concurrency=4] [--prefill_chunks=64,128]
        [--speculation=adaptive] [--draft_tokens=3] [--proposal_depths=1,3]
        [--speculative_token_capacity=64] [--mixed_prefill] [--max_model_len=N]
        [--page_size=16] [--kv_pages=N] [--snapshot_rows=N] [--dtype=float32] [--measure]
        [--measure_runs=5] [--catalog_out=FILE] [--compilation_cache_dir=DIR]

Steps (each an importable function; the command line, `helios_jax.prepare.command`, only parses
flags and prints):
  1. `load_engine_model` (`models`): a Hugging Face style checkpoint folder, or (no --model) the
     embedded default model, the one ``python -m helios_jax.serve`` serves. Tests and benchmarks
     use `random_model`, a seeded tiny random model with an MTP head.
  2. `EngineConfig.catalog`: the same catalog planning reports (spec: "Planning reports the same
     catalog used by preparation").
  3. `build_programs` + AOT compile of every program (`ProgramSet.compile_all`) with a progress
     line per program and the persistent compilation cache
     (`helios_jax.compilation_cache.enable_compilation_cache`).
  4. `capture_headroom` (`headroom`): bytes of params, the KV pool and per-row state, the largest
     compiled workspace, and the maximum packed token extent of the catalog.
  5. optionally `measure` (`measurement`): a few timed executions of every program on synthetic
     full-occupancy inputs (after one warm-up; each timed from dispatch to `block_until_ready`),
     exported as a measured catalog JSON in the shared format (`duration_ms` per graph).

The engine (`helios_jax.runtime.engine.HeliosEngine`) prepares its programs through `prepare`
and then, before it admits a request, runs each once (`warm_up`) or, as the server does,
measures them (`measure_samples`) and seeds its scheduler's duration estimates with the runs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax

from helios_jax.catalog import Catalog
from helios_jax.compilation_cache import DEFAULT_COMPILATION_CACHE_DIR, enable_compilation_cache
from helios_jax.distributed.group import lead_if_leader
from helios_jax.engine_config import EngineConfig
from helios_jax.model import ModelConfig, Params
from helios_jax.model.fused import fuse_projections
from helios_jax.prepare.headroom import Headroom, capture_headroom
from helios_jax.prepare.measurement import (
    measure,
    measure_samples,
    measured_catalog,
    measurement_inputs,
    warm_up,
)
from helios_jax.prepare.models import (
    default_dtype,
    default_model_config,
    load_engine_model,
    load_model,
    random_model,
)
from helios_jax.programs import Program, ProgramSet, build_programs

__all__ = [
    "DEFAULT_COMPILATION_CACHE_DIR",
    "Headroom",
    "Prepared",
    "capture_headroom",
    "default_dtype",
    "default_model_config",
    "enable_compilation_cache",
    "load_engine_model",
    "load_model",
    "measure",
    "measure_samples",
    "measured_catalog",
    "measurement_inputs",
    "prepare",
    "random_model",
    "warm_up",
]


@dataclasses.dataclass
class Prepared:
    programs: ProgramSet
    params: Params  # in the engine's dtype: what the programs run on
    catalog: Catalog  # measured when measure() ran
    headroom: Headroom
    compile_seconds: float


def prepare(
    model_config: ModelConfig,
    params: Params,
    engine: EngineConfig,
    *,
    name: str = "prepared",
    do_measure: bool = False,
    runs: int = 5,
    progress: Callable[[str], None] | None = print,
    fused_projections: bool = True,
) -> Prepared:
    """Plan, build and AOT-compile every program; optionally measure them. The programs run on
    the parameters with q/k/v and gate/up fused (`model/fused.py`) unless `fused_projections`
    is false; `Prepared.params` are what they run on."""
    if model_config.dtype != engine.dtype:
        model_config = model_config.replace(dtype=engine.dtype)
        params = jax.tree_util.tree_map(lambda x: x.astype(model_config.jnp_dtype), params)
    if fused_projections:
        model_config, params = fuse_projections(model_config, params)
    catalog = engine.catalog(name)
    programs = lead_if_leader(build_programs(model_config, params, engine, catalog))  # several processes
    params = programs.place_params(params)  # sharded over the tp mesh (already so when loaded so)
    start = time.perf_counter()

    def report(i: int, n: int, program: Program) -> None:
        if progress:
            width = 24
            bar = "#" * (width * i // n) + "." * (width - width * i // n)
            progress(f"[{bar}] {i:3d}/{n} {program.name} compiled in {program.compile_seconds:.2f} s")

    programs.compile_all(report)
    compile_seconds = time.perf_counter() - start
    headroom = capture_headroom(programs, params)
    if do_measure:
        catalog = measured_catalog(catalog, measure(programs, params, runs=runs, progress=progress))
    return Prepared(
        programs=programs, params=params, catalog=catalog, headroom=headroom, compile_seconds=compile_seconds
    )
