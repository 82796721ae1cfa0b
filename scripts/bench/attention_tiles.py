"""The CPU attention's tile sizes inside the engine's programs: today's tiles against others.

    python scripts/bench/attention_tiles.py [--runs=30] [--against=32,128,128[,GROUP]] [--json_out=FILE]

Builds `engine.py`'s engine (the embedded default model, float32, 16 slots, prompt rows 1, 4,
16, chunks 64-512) and compiles four of its programs twice: with the default
`RaggedAttentionTiles` and with `--against` (xla_block_q, xla_block_k, xla_prompt_block_k and,
optionally, xla_item_group, the default's otherwise; the default is the tiling before prompt
chunks had their own key step: 32-token tiles, 128-key steps for every tile). Each program
then runs in rotated order from the same cursors, timed from dispatch to `block_until_ready`
(median of --runs after one warm-up round):

  prefill[B=16,W=64] at cursor 0 and at cursor 448 (a later chunk of a 512-token prompt),
  prefill[B=4,W=64] at cursor 0, and decode[B=16] (one step) at cursor 448.

Prints the medians and the ratio default / against per program and cursor; below 1.0 the
default is faster. The same tokens come out of both (checked).
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from contextlib import ExitStack
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from bench_common import engine_bench_config
from program_variants import run_main

from helios_jax.catalog import GraphKind
from helios_jax.compilation_cache import enable_compilation_cache
from helios_jax.kernels.ragged_attention_tiles import RaggedAttentionTiles
from helios_jax.kernels.ragged_paged_attention import ragged_paged_attention
from helios_jax.prepare import load_engine_model
from helios_jax.prepare.measurement import measurement_inputs
from helios_jax.programs import build_programs

FLAGS = flags.FLAGS
flags.DEFINE_integer("runs", 30, "timed executions per variant and case")
flags.DEFINE_list(
    "against", ["32", "128", "128"], "xla_block_q, xla_block_k, xla_prompt_block_k[, xla_item_group]"
)
flags.DEFINE_string("json_out", None, "write the figures as JSON here")

# (program kind, lanes, cursor)
CASES = (
    (GraphKind.PREFILL, 16, 0),
    (GraphKind.PREFILL, 16, 448),
    (GraphKind.PREFILL, 4, 0),
    (GraphKind.DECODE, 16, 448),
)


def _program(programs, kind: GraphKind, lanes: int):
    def wanted(p) -> bool:
        d = p.descriptor
        chunk = d.token_capacity == 64 if kind is GraphKind.PREFILL else d.steps == 1
        return d.kind is kind and d.batch_capacity == lanes and chunk

    return next(p for p in programs.values() if wanted(p))


def _compiled(model, engine, tiles: RaggedAttentionTiles | None):
    """The engine's programs, the CASES' compiled with `tiles` (None: the defaults)."""
    programs = build_programs(model.config, model.params, engine, engine.catalog())
    with ExitStack() as stack:
        if tiles is not None:
            kernel = functools.partial(ragged_paged_attention, tiles=tiles)
            stack.enter_context(mock.patch("helios_jax.programs.impls.ragged_paged_attention", kernel))
        for kind, lanes in {(kind, lanes) for kind, lanes, _ in CASES}:
            _program(programs, kind, lanes).compile(programs.params_spec, programs.state_spec)
    return programs


def _run(program, params, state, inputs):
    jax.block_until_ready((state, inputs))
    t = time.perf_counter()
    state, outputs = program(params, state, inputs)[:2]
    jax.block_until_ready((state, outputs))
    return (time.perf_counter() - t) * 1e3, state, outputs


def run() -> dict:
    enable_compilation_cache()
    model = load_engine_model(None, dtype="float32")
    engine = engine_bench_config(16, 512)
    q, k, pk, *group = (int(x) for x in FLAGS.against)
    against = RaggedAttentionTiles(xla_block_q=q, xla_block_k=k, xla_prompt_block_k=pk)
    if group:
        against = dataclasses.replace(against, xla_item_group=group[0])
    variants = {"default": _compiled(model, engine, None), "against": _compiled(model, engine, against)}
    states = {name: programs.init_state() for name, programs in variants.items()}
    samples = {(name, i): [] for name in variants for i in range(len(CASES))}
    tokens = {}
    names = list(variants)
    for r in range(FLAGS.runs + 1):
        for i, (kind, lanes, cursor) in enumerate(CASES):
            for name in names[r % 2 :] + names[: r % 2]:
                program = _program(variants[name], kind, lanes)
                inputs = measurement_inputs(program, engine, cursor)
                state = states[name].replace(cursor=jnp.full((engine.state_rows,), cursor, jnp.int32))
                ms, states[name], outputs = _run(program, model.params, state, inputs)
                tokens[(name, i)] = np.asarray(outputs.tokens)
                if r:
                    samples[(name, i)].append(ms)
    rows = []
    for i, (kind, lanes, cursor) in enumerate(CASES):
        assert np.array_equal(tokens[("default", i)], tokens[("against", i)]), CASES[i]
        default, other = (statistics.median(samples[(n, i)]) for n in ("default", "against"))
        rows.append(
            dict(
                program=f"{kind.value}[B={lanes}]",
                cursor=cursor,
                default_ms=round(default, 3),
                against_ms=round(other, 3),
                ratio=round(default / other, 3),
            )
        )
        print(
            f"{rows[-1]['program']:18s} cursor {cursor:4d}  default {default:7.2f} ms  "
            f"against {other:7.2f} ms  ratio {default / other:5.2f}",
            flush=True,
        )
    return dict(
        defaults=dataclasses.asdict(RaggedAttentionTiles()),
        against=dataclasses.asdict(against),
        runs=FLAGS.runs,
        backend=jax.default_backend(),
        rows=rows,
    )


if __name__ == "__main__":
    run_main(run)
