"""Timing one generation program in variants, interleaved: what `logprob_gate.py` and
`sampling_controls.py` share.

Each script compiles the same program of the embedded default model (float32) more than once,
with functions of `helios_jax.programs.round` replaced while tracing (`compile_variant`), then
runs its variants in rotated order from the same cursors, each timed from dispatch to
`block_until_ready` (`interleave`). Rotating the order and starting every run from a fresh copy
of the row state (the state is donated) keeps the machine's drift and the allocators' warm-up
out of the ratios; the first round of runs is dropped.

The scripts run as `python scripts/bench/<name>.py`, so this folder is on `sys.path` and they
import this module by name.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from helios_jax.catalog import GraphKind
from helios_jax.engine_config import EngineConfig
from helios_jax.prepare.measurement import measurement_inputs
from helios_jax.programs import build_programs


def define_flags() -> None:
    flags.DEFINE_integer("batch", 16, "lanes (request slots)")
    flags.DEFINE_bool("speculative", False, "time a speculative program (D = 3) instead of decode")
    flags.DEFINE_integer("runs", 40, "timed executions per variant")
    flags.DEFINE_integer("context", 64, "decode cursor")
    flags.DEFINE_string("json_out", None, "write the figures as JSON here")


def bench_engine(batch: int, speculative: bool, decode_steps: tuple[int, ...] = (1,)) -> EngineConfig:
    """`batch` request slots; ordinary decode (of `decode_steps` steps), or adaptive speculation
    with D = 3."""
    return EngineConfig(
        decode_steps=decode_steps,
        request_slots=batch,
        prefill_chunks=(64,),
        speculation="adaptive" if speculative else "off",
        draft_tokens=3 if speculative else 0,
        speculative_token_capacity=4 * batch,
        mixed_prefill=False,
        max_model_len=256,
    )


def timed_program(programs, engine: EngineConfig, *, speculative: bool, steps: int = 1):
    """The program these scripts time: decode at B = request slots, or the widest host-ragged
    speculative program, of `steps` steps (not compiled)."""
    kind = GraphKind.SPECULATIVE if speculative else GraphKind.DECODE
    lanes = engine.request_slots
    candidates = [
        p
        for p in programs.values()
        if p.descriptor.kind is kind and p.shape.lanes == lanes and p.shape.steps == steps
    ]
    return max(candidates, key=lambda p: (p.shape.width, p.shape.target_capacity))


def compile_variant(
    engine: EngineConfig, config, params, *, speculative: bool, patches: dict | None = None, steps: int = 1
):
    """(programs, the program): decode at B = request slots, or the widest host-ragged speculative
    program, of `steps` steps, compiled with each `patches` target (a dotted name) replaced while
    tracing."""
    programs = build_programs(config, params, engine, engine.catalog())
    program = timed_program(programs, engine, speculative=speculative, steps=steps)
    with ExitStack() as stack:
        for target, fn in (patches or {}).items():
            stack.enter_context(mock.patch(target, fn))
        program.compile(programs.params_spec, programs.state_spec)
    return programs, program


def _time(program, params, state, inputs):
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    state, out = program(params, state, inputs)
    jax.block_until_ready((state, out))
    return (time.perf_counter() - t0) * 1e3, state, out


def interleave(
    variants: dict[str, tuple],
    params,
    engine: EngineConfig,
    *,
    runs: int,
    context: int,
    row_state: Callable[[str, object], object],
    params_of: dict[str, object] | None = None,
) -> tuple[dict[str, float], dict[str, object]]:
    """Runs every variant `runs` + 1 times in rotated order; returns (median ms by variant, the
    last outputs by variant).

    Args:
      variants: name -> (programs, program) from `compile_variant`.
      row_state: (name, a fresh state with every cursor at `context`) -> the state that variant
        runs from (its rows' settings).
      params_of: name -> the parameters that variant runs on, where not `params`.
    """
    cursors = np.full((engine.state_rows,), context, np.int32)
    states = {name: programs.init_state() for name, (programs, _) in variants.items()}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    outs = {}
    names = list(variants)
    for i in range(runs + 1):
        for name in names[i % len(names) :] + names[: i % len(names)]:  # rotate the order
            program = variants[name][1]
            inputs = measurement_inputs(program, engine, context)
            state = row_state(name, states[name].replace(cursor=jnp.asarray(cursors)))
            ms, states[name], outs[name] = _time(program, (params_of or {}).get(name, params), state, inputs)
            if i:  # the first run of each warms caches and allocators
                samples[name].append(ms)
    return {name: statistics.median(s) for name, s in samples.items()}, outs


def paired_medians(
    variants: dict[str, tuple],
    params,
    engine: EngineConfig,
    *,
    runs: int,
    context: int,
    params_of: dict[str, object] | None = None,
) -> dict[str, float]:
    """Two variants (base first, then the other) run by :func:`interleave` from plain row state;
    raises unless they emit the same tokens. Returns {base}_median_ms, {other}_median_ms and
    {other}_over_{base}."""
    (base, other) = variants
    medians, outs = interleave(
        variants, params, engine, runs=runs, context=context, row_state=lambda n, s: s, params_of=params_of
    )
    if not np.array_equal(np.asarray(outs[base].tokens), np.asarray(outs[other].tokens)):
        raise AssertionError("the variants emitted different tokens")
    return {
        f"{base}_median_ms": round(medians[base], 4),
        f"{other}_median_ms": round(medians[other], 4),
        f"{other}_over_{base}": round(medians[other] / medians[base], 4),
    }


def run_main(run: Callable[[], dict]) -> None:
    """absl's app.run over `run`: prints its figures as JSON, and writes them to --json_out."""

    def main(argv) -> int:
        del argv
        result = run()
        print(json.dumps(result, indent=1))
        if flags.FLAGS.json_out:
            with open(flags.FLAGS.json_out, "w") as f:
                json.dump(result, f, indent=1)
                f.write("\n")
        return 0

    app.run(lambda argv: sys.exit(main(argv)))
