"""Prepare (the spec's "ignition"): plan the catalog, compile every program ahead of time, measure.

    python -m helios_jax.prepare [--model=FOLDER] [--concurrency=4] [--prefill_chunks=64,128]
        [--speculation=adaptive] [--draft_tokens=3] [--proposal_depths=1,3]
        [--speculative_token_capacity=64] [--mixed_prefill] [--max_model_len=4096]
        [--page_size=16] [--kv_pages=N] [--dtype=float32] [--measure] [--measure_runs=5]
        [--catalog_out=FILE] [--compilation_cache_dir=DIR]

Steps (each an importable function; `main` only parses flags):
  1. `load_model`: a Hugging Face style checkpoint folder, or (no --model) a tiny random model
     with an MTP head, so the command runs without weights.
  2. `EngineConfig.catalog`: the same catalog planning reports (spec: "Planning reports the same
     catalog used by preparation").
  3. `build_programs` + AOT compile of every program (`ProgramSet.compile_all`) with a progress
     line per program and the persistent compilation cache.
  4. `capture_headroom`: bytes of params, the KV pool and per-row state, the largest compiled
     workspace, and the maximum packed token extent of the catalog.
  5. optionally `measure`: a few timed executions of every program on synthetic full-occupancy
     inputs (after one warm-up; each timed from dispatch to `block_until_ready`), exported as a
     measured catalog JSON in the shared format (`duration_ms` per graph).
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from helios_jax.catalog import Catalog, GraphKind
from helios_jax.engine_config import SPECULATION_MODES, EngineConfig, parse_int_list
from helios_jax.model import ModelConfig, init_params, load_checkpoint, tiny_config
from helios_jax.programs import Program, ProgramSet, build_programs, state_bytes
from helios_jax.programs.state import DeviceState


def default_model_config(dtype: str = "float32") -> ModelConfig:
    """The weightless default: the tests' tiny config with a one-block MTP head."""
    return tiny_config(mtp_num_layers=1, dtype=dtype)


def load_model(path: str | None, *, dtype: str = "float32", seed: int = 0):
    """(ModelConfig, params) from a checkpoint folder, or a seeded tiny random model."""
    if path:
        loaded = load_checkpoint(path, dtype=dtype)
        return loaded.config, loaded.params
    config = default_model_config(dtype)
    return config, init_params(config, jax.random.key(seed))


@dataclasses.dataclass(frozen=True)
class Headroom:
    """What the prepared engine occupies on the device."""

    params_bytes: int
    kv_pool_bytes: int
    row_state_bytes: int
    workspace_bytes: int  # the largest compiled program's temporary buffers (0 when unknown)
    max_packed_extent: int  # the most target tokens one program packs
    largest_workspace_program: str

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.kv_pool_bytes + self.row_state_bytes + self.workspace_bytes

    def lines(self) -> list[str]:
        mib = 1 / 2**20
        return [
            f"params        {self.params_bytes * mib:10.2f} MiB",
            f"kv pool       {self.kv_pool_bytes * mib:10.2f} MiB",
            f"row state     {self.row_state_bytes * mib:10.2f} MiB",
            f"workspace     {self.workspace_bytes * mib:10.2f} MiB  ({self.largest_workspace_program})",
            f"total         {self.total_bytes * mib:10.2f} MiB",
            f"max packed token extent {self.max_packed_extent}",
        ]


def _workspace_bytes(program: Program) -> int:
    try:
        analysis = program.compiled.memory_analysis()
        return int(getattr(analysis, "temp_size_in_bytes", 0) or 0)
    except Exception:  # noqa: BLE001 - some backends do not report memory analysis
        return 0


def capture_headroom(programs: ProgramSet, params) -> Headroom:
    """Bytes and extents of a compiled program set (workspace needs compiled programs)."""
    sizes = state_bytes(programs.state_spec)
    params_bytes = sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(params))
    workspaces = {p.name: _workspace_bytes(p) for p in programs.values() if p.compiled is not None}
    largest = max(workspaces, key=workspaces.get, default="none")
    return Headroom(
        params_bytes=int(params_bytes),
        kv_pool_bytes=sizes["kv_pool"],
        row_state_bytes=sizes["row_state"],
        workspace_bytes=workspaces.get(largest, 0),
        max_packed_extent=programs.catalog.max_packed_extent,
        largest_workspace_program=largest,
    )


# -- measurement -------------------------------------------------------------------------------

def _pages(engine: EngineConfig, row: int) -> list[int]:
    n = engine.pages_per_row
    return [(row * n + j) % engine.kv_pages for j in range(n)]


def measurement_inputs(program: Program, engine: EngineConfig, context: int):
    """Full-occupancy host inputs for timing: every lane active on slots 0..B-1, decode rows at
    `context` tokens of history, prompts filling the chunk."""
    shape = program.shape
    kind = shape.kind
    lanes = list(range(min(shape.lanes, engine.request_slots)))
    tables = [_pages(engine, s) for s in lanes]
    if kind.is_prefill:
        return program.pack(slot=0, tokens=np.arange(shape.prefill_capacity) % 97, page_table=tables[0],
                            prompt_ends=True)
    if kind is GraphKind.DECODE:
        return program.pack(slots=lanes, page_tables=tables)
    if kind is GraphKind.SPECULATIVE:
        rows = [shape.width] * len(lanes)
        if shape.device_allocation:
            return program.pack(slots=lanes, page_tables=tables, ceilings=[min(r, shape.depth + 1) for r in rows])
        while sum(rows) > shape.target_capacity:  # ragged host programs: fill P exactly
            rows[rows.index(max(rows))] -= 1
        return program.pack(slots=lanes, page_tables=tables, query_lengths=rows)
    if kind is GraphKind.MIXED:
        lengths = [shape.prefill_capacity] + [shape.width] * (len(lanes) - 1)
        return program.pack(slots=lanes, page_tables=tables, query_lengths=lengths, prefill_row=0,
                            prompt_tokens=np.arange(shape.prefill_capacity) % 89, prompt_ends=True)
    if kind is GraphKind.INITIALIZE:
        return program.pack(slots=lanes, temperature=[0.0] * len(lanes), top_p=[1.0] * len(lanes),
                            top_k=[0] * len(lanes), seeds=lanes)
    used = -(-context // engine.page_size)
    snapshot_rows = [engine.request_slots + i for i in range(min(shape.lanes, engine.snapshot_rows))]
    lanes = lanes[: len(snapshot_rows)]
    src = [_pages(engine, s)[:used] for s in lanes]
    dst = [_pages(engine, r)[:used] for r in snapshot_rows]
    if kind is GraphKind.SNAPSHOT:
        return program.pack(src_rows=lanes, dst_rows=snapshot_rows, src_pages=src, dst_pages=dst)
    return program.pack(src_rows=snapshot_rows, dst_rows=lanes, src_pages=dst, dst_pages=src)


def _with_cursors(state: DeviceState, cursor: jax.Array) -> DeviceState:
    return state.replace(cursor=cursor)


_set_cursors = jax.jit(_with_cursors, donate_argnums=0)


def measure(programs: ProgramSet, params, *, runs: int = 5, context: int | None = None,
            progress: Callable[[str], None] | None = None) -> dict:
    """Median execution time (ms) per program, measured after one warm-up run.

    Each run starts from the same cursors (decoders at `context`, prompts at 0; default half the
    context length, kept within max_model_len). A run is timed from dispatch to
    `block_until_ready` on its outputs and new state; cursor resets happen outside the timing.
    """
    engine = programs.engine_config
    # Decoders may write up to W + D positions past their cursor.
    reach = max((p.shape.width + p.shape.depth for p in programs.values() if p.shape.kind.is_generation), default=1)
    margin = engine.max_model_len - reach - 1
    context = max(1, min(engine.max_model_len // 2 if context is None else context, margin))
    cursors = np.full((engine.state_rows,), context, np.int32)
    state = programs.init_state()
    results = {}
    for program in programs.values():
        inputs = measurement_inputs(program, engine, context)
        start_cursors = cursors.copy()
        if program.shape.kind.is_prefill or program.shape.kind is GraphKind.MIXED:
            start_cursors[0] = 0  # the prompt lane starts a request
        samples = []
        for i in range(runs + 1):
            state = _set_cursors(state, jnp.asarray(start_cursors))
            jax.block_until_ready(state)
            t0 = time.perf_counter()
            state, out = program(params, state, inputs)
            jax.block_until_ready((state, out))
            if i:  # the first run warms caches and allocators
                samples.append((time.perf_counter() - t0) * 1e3)
        results[program.key] = statistics.median(samples)
        if progress:
            progress(f"measured {program.name}: {results[program.key]:.3f} ms")
    return results


def measured_catalog(catalog: Catalog, durations: dict) -> Catalog:
    """The catalog with each graph's measured duration_ms (the shared JSON format)."""
    graphs = tuple(dataclasses.replace(g, duration_ms=round(float(durations[g.key]), 4)) if g.key in durations else g
                   for g in catalog.graphs)
    return dataclasses.replace(catalog, graphs=graphs)


@dataclasses.dataclass
class Prepared:
    programs: ProgramSet
    catalog: Catalog  # measured when measure() ran
    headroom: Headroom
    compile_seconds: float


def prepare(model_config: ModelConfig, params, engine: EngineConfig, *, name: str = "prepared",
            do_measure: bool = False, runs: int = 5, progress: Callable[[str], None] | None = print) -> Prepared:
    """Plan, build and AOT-compile every program; optionally measure them."""
    if model_config.dtype != engine.dtype:
        model_config = model_config.replace(dtype=engine.dtype)
        params = jax.tree_util.tree_map(lambda x: x.astype(model_config.jnp_dtype), params)
    catalog = engine.catalog(name)
    programs = build_programs(model_config, params, engine, catalog)
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
    return Prepared(programs=programs, catalog=catalog, headroom=headroom, compile_seconds=compile_seconds)


# -- command line ------------------------------------------------------------------------------

def define_flags(fv: flags.FlagValues = flags.FLAGS) -> None:
    """The flags mirror EngineConfig's fields (absl spelling of the spec's hyphenated flags)."""
    flags.DEFINE_string("model", None, "checkpoint folder (default: a tiny random model)", flag_values=fv)
    flags.DEFINE_integer("concurrency", 4, "request slots", flag_values=fv)
    flags.DEFINE_list("prefill_chunks", [], "prefill chunk sizes (default 64..4096 capped by max_model_len)",
                      flag_values=fv)
    flags.DEFINE_enum("speculation", "adaptive", list(SPECULATION_MODES), "speculation mode", flag_values=fv)
    flags.DEFINE_integer("draft_tokens", 3, "deepest proposal depth D", flag_values=fv)
    flags.DEFINE_list("proposal_depths", [], "every captured depth (default: draft_tokens)", flag_values=fv)
    flags.DEFINE_integer("speculative_token_capacity", 64, "R, aggregate target-row envelope", flag_values=fv)
    flags.DEFINE_bool("mixed_prefill", False, "capture mixed prefill/verification graphs", flag_values=fv)
    flags.DEFINE_integer("max_model_len", 256, "longest context in tokens", flag_values=fv)
    flags.DEFINE_integer("page_size", 16, "tokens per KV page", flag_values=fv)
    flags.DEFINE_integer("kv_pages", None, "KV pool pages (default: every row at full context)", flag_values=fv)
    flags.DEFINE_integer("snapshot_rows", 1, "state rows for snapshots", flag_values=fv)
    flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "compute dtype", flag_values=fv)
    flags.DEFINE_string("name", "prepared", "catalog name", flag_values=fv)
    flags.DEFINE_bool("measure", False, "time every program after compiling", flag_values=fv)
    flags.DEFINE_integer("measure_runs", 5, "timed executions per program", flag_values=fv)
    flags.DEFINE_string("catalog_out", None, "write the (measured) catalog JSON here", flag_values=fv)
    flags.DEFINE_string("compilation_cache_dir", None, "persistent compilation cache (default: "
                        "$JAX_COMPILATION_CACHE_DIR or ~/.cache/helios_jax/xla)", flag_values=fv)


def engine_from_flags(fv: flags.FlagValues = flags.FLAGS) -> EngineConfig:
    speculative = fv.speculation != "off"
    return EngineConfig(
        request_slots=fv.concurrency,
        prefill_chunks=parse_int_list(fv.prefill_chunks),
        speculation=fv.speculation,
        draft_tokens=fv.draft_tokens if speculative else 0,
        proposal_depths=parse_int_list(fv.proposal_depths) if speculative else None,
        speculative_token_capacity=fv.speculative_token_capacity,
        mixed_prefill=fv.mixed_prefill,
        max_model_len=fv.max_model_len,
        page_size=fv.page_size,
        kv_pages=fv.kv_pages,
        dtype=fv.dtype,
        snapshot_rows=fv.snapshot_rows,
    )


def enable_compilation_cache(directory: str | None) -> str:
    import os

    directory = directory or os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.expanduser("~/.cache/helios_jax/xla")
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return directory


def main(argv) -> int:
    del argv
    fv = flags.FLAGS
    cache = enable_compilation_cache(fv.compilation_cache_dir)
    engine = engine_from_flags(fv)
    config, params = load_model(fv.model, dtype=fv.dtype)
    catalog = engine.catalog(fv.name)
    print(f"model: {'tiny random' if not fv.model else fv.model} ({config.num_layers} layers, "
          f"hidden {config.hidden_size}, vocab {config.vocab_size}, mtp {config.mtp_num_layers}); "
          f"compilation cache {cache}")
    print(f"catalog {catalog.name}: {len(catalog.graphs)} programs, mode {catalog.mode}, "
          f"request slots {engine.request_slots}, R {engine.speculative_token_capacity}")
    prepared = prepare(config, params, engine, name=fv.name, do_measure=fv.measure, runs=fv.measure_runs)
    print(f"compiled {len(prepared.programs)} programs in {prepared.compile_seconds:.1f} s")
    print("capture headroom:")
    for line in prepared.headroom.lines():
        print("  " + line)
    if fv.catalog_out:
        prepared.catalog.save(fv.catalog_out)
        print(f"wrote {fv.catalog_out}")
    return 0


if __name__ == "__main__":
    define_flags()
    app.run(lambda argv: sys.exit(main(argv)))
