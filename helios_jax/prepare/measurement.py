"""Timed executions of prepared programs on synthetic full-occupancy inputs (step 5 of `prepare`),
and the warm-up run the engine gives every program before its first request.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from helios_jax.catalog import Catalog, GraphKind
from helios_jax.engine_config import EngineConfig
from helios_jax.programs import Program, ProgramSet
from helios_jax.programs.state import DeviceState


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
    if kind.is_prefill:  # every row a full chunk
        return program.pack(
            slots=lanes,
            chunks=[np.arange(shape.prefill_capacity) % 97 for _ in lanes],
            page_tables=tables,
            prompt_ends=[True] * len(lanes),
        )
    if kind is GraphKind.DECODE or shape.steps > 1:  # K-step programs: every lane takes K steps
        return program.pack(slots=lanes, page_tables=tables)
    if kind is GraphKind.SPECULATIVE:
        rows = [shape.width] * len(lanes)
        if shape.device_allocation:
            return program.pack(
                slots=lanes, page_tables=tables, ceilings=[min(r, shape.depth + 1) for r in rows]
            )
        while sum(rows) > shape.target_capacity:  # ragged host programs: fill P exactly
            rows[rows.index(max(rows))] -= 1
        return program.pack(slots=lanes, page_tables=tables, query_lengths=rows)
    if kind is GraphKind.MIXED:
        lengths = [shape.prefill_capacity] + [shape.width] * (len(lanes) - 1)
        return program.pack(
            slots=lanes,
            page_tables=tables,
            query_lengths=lengths,
            prefill_row=0,
            prompt_tokens=np.arange(shape.prefill_capacity) % 89,
            prompt_ends=True,
        )
    if kind is GraphKind.INITIALIZE:
        return program.pack(
            slots=lanes,
            temperature=[0.0] * len(lanes),
            top_p=[1.0] * len(lanes),
            top_k=[0] * len(lanes),
            seeds=lanes,
        )
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


# Every row's cursor set (the state donated): each timed run starts from the same contexts, as
# `measure` and the benchmarks that time programs outside an engine's loop need.
set_cursors = jax.jit(_with_cursors, donate_argnums=0)


def start_cursors(program: Program, engine: EngineConfig, context: int) -> np.ndarray:
    """Every row's cursor before a timed or warm-up run of `program`: decoders at `context`,
    the program's prompt rows at 0 (each starts a request)."""
    cursors = np.full((engine.state_rows,), context, np.int32)
    if program.shape.kind.is_prefill:
        cursors[: program.shape.lanes] = 0
    elif program.shape.kind is GraphKind.MIXED:
        cursors[0] = 0  # the prompt lane
    return cursors


def measure(
    programs: ProgramSet,
    params,
    *,
    runs: int = 5,
    context: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Median execution time (ms) per program of :func:`measure_samples`' runs."""
    samples = measure_samples(programs, params, runs=runs, context=context)
    results = {key: statistics.median(times) for key, times in samples.items()}
    if progress:
        for program in programs.values():
            progress(f"measured {program.name}: {results[program.key]:.3f} ms")
    return results


def measure_samples(
    programs: ProgramSet,
    params,
    *,
    runs: int = 5,
    context: int | None = None,
    budget_s: float | None = None,
) -> dict[object, list[float]]:
    """`runs` timed executions (ms) per program, keyed by its cost key, after one untimed
    warm-up run of each (so the warm-up of :func:`warm_up` is included). With `budget_s`, a
    program's timed runs stop once they add up to that many seconds (one at least): a long
    program's interval varies little against its length, and the start-up stays bounded.

    The programs run in rounds, each once a round (the untimed round first), so a passing
    disturbance of the machine reaches one sample of many programs rather than every sample of
    one, and their medians stay clean. Each run starts from the same cursors (decoders at
    `context`, prompts at 0; default half the context length, kept within max_model_len) and is
    timed from dispatch to `block_until_ready` on its outputs and new state; inputs are staged
    and cursors reset before the clock starts.
    """
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    engine = programs.engine_config
    # Decoders may write up to W + D positions past their cursor (K - 1 more over K steps).
    reach = max(
        (
            p.shape.width + p.shape.depth + p.shape.steps - 1
            for p in programs.values()
            if p.shape.kind.is_generation
        ),
        default=1,
    )
    margin = engine.max_model_len - reach - 1
    context = max(1, min(engine.max_model_len // 2 if context is None else context, margin))
    staged = [
        (
            p,
            jax.tree_util.tree_map(_staged, measurement_inputs(p, engine, context)),
            jnp.asarray(start_cursors(p, engine, context)),
        )
        for p in programs.values()
    ]
    state = programs.init_state()
    results: dict[object, list[float]] = {p.key: [] for p, _, _ in staged}
    for round_ in range(runs + 1):  # round 0 warms caches and allocators, untimed
        for program, inputs, cursors in staged:
            samples = results[program.key]
            if samples and budget_s is not None and sum(samples) >= budget_s * 1e3:
                continue
            state, ms = _timed_run(program, params, state, inputs, cursors)
            if round_:
                samples.append(ms)
    return results


def _timed_run(program: Program, params, state: DeviceState, inputs, cursors) -> tuple[DeviceState, float]:
    """One execution from `cursors`, timed (ms) from dispatch to readiness (warm-up runs ignore
    the time); checked across the ranks where there are several processes
    (distributed/leader.py), after the clock stops."""
    state = set_cursors(state, cursors)
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    state, out = program(params, state, inputs)
    jax.block_until_ready((state, out))
    ms = (time.perf_counter() - t0) * 1e3
    if hasattr(program, "check"):
        program.check(out)
    return state, ms


def _staged(leaf):
    """A host array moved to the device before the clock starts (the executor's own staging)."""
    return jax.device_put(leaf) if isinstance(leaf, np.ndarray) else leaf


def measured_catalog(catalog: Catalog, durations: dict) -> Catalog:
    """The catalog with each graph's measured duration_ms (the shared JSON format)."""
    graphs = tuple(
        dataclasses.replace(g, duration_ms=round(float(durations[g.key]), 4)) if g.key in durations else g
        for g in catalog.graphs
    )
    return dataclasses.replace(catalog, graphs=graphs)


def warm_up(programs: ProgramSet, params, progress: Callable[[str], None] | None = None) -> None:
    """Run every program once on a scratch state, so that no request pays (and no duration
    estimate records) a program's one-time first-execution costs. Each run starts from reset
    cursors (`start_cursors`), as in `measure`: run one after another on one state, the prompt
    rows of the prefill programs would otherwise grow past max_model_len and their page
    windows (a kernel reading past a row's pages faults on a GPU)."""
    engine = programs.engine_config
    state = programs.init_state()
    for program in programs.values():
        cursors = jnp.asarray(start_cursors(program, engine, 1))
        state, _ = _timed_run(program, params, state, measurement_inputs(program, engine, 1), cursors)
    if progress:
        progress(f"warmed up {len(programs)} programs")
