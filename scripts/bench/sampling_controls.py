"""Logits processors and the token mask: a generation program's time with them off, on, and
as the program was before them, interleaved.

    python scripts/bench/sampling_controls.py [--batch=16] [--speculative] [--runs=40] [--json_out=FILE]

Builds one generation program for the embedded default model (float32): ordinary decode at
B = --batch, or with --speculative the widest host-ragged speculative program (D = 3). It compiles
it twice: as shipped, and "before" (the processors' step, the output-count update and the token
mask traced as the identity: the program every generation program was before them). Three
variants then run, alternating in rotated order from the same cursors, each timed from dispatch
to block_until_ready:

  off      shipped program, no row has processors and no lane is masked (the common batch)
  on       shipped program, every row with presence, frequency and repetition penalties
  before   the program without processors or mask

Prints the medians and the ratios off/before and on/before, and checks that off and before emit
the same tokens.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from contextlib import ExitStack
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from helios_jax.catalog import GraphKind
from helios_jax.engine_config import EngineConfig
from helios_jax.prepare import load_engine_model
from helios_jax.prepare.measurement import measurement_inputs
from helios_jax.programs import build_programs

flags.DEFINE_integer("batch", 16, "lanes (request slots)")
flags.DEFINE_bool("speculative", False, "time a speculative program (D = 3) instead of decode")
flags.DEFINE_integer("runs", 40, "timed executions per variant")
flags.DEFINE_integer("context", 64, "decode cursor")
flags.DEFINE_string("json_out", None, "write the figures as JSON here")
FLAGS = flags.FLAGS

_IDENTITY = {
    "helios_jax.programs.round.apply_processors": lambda logits, *a, **k: logits,
    "helios_jax.programs.round.count_outputs": lambda state, *a, **k: state,
    "helios_jax.programs.round.apply_token_mask": lambda logits, *a, **k: logits,
}


def _program(engine, config, params, *, shipped: bool):
    programs = build_programs(config, params, engine, engine.catalog())
    kind = GraphKind.SPECULATIVE if FLAGS.speculative else GraphKind.DECODE
    candidates = [p for p in programs.values() if p.descriptor.kind is kind and p.shape.lanes == FLAGS.batch]
    program = max(candidates, key=lambda p: (p.shape.width, p.shape.target_capacity))
    with ExitStack() as stack:
        if not shipped:
            for target, fn in _IDENTITY.items():
                stack.enter_context(mock.patch(target, fn))
        program.compile(programs.params_spec, programs.state_spec)
    return programs, program


def _time(program, params, state, inputs):
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    state, out = program(params, state, inputs)
    jax.block_until_ready((state, out))
    return (time.perf_counter() - t0) * 1e3, state, out


def _penalised(state, rows: int):
    p = state.processors.replace(
        enabled=jnp.ones((rows,), bool),
        presence=jnp.full((rows,), 0.5, jnp.float32),
        frequency=jnp.full((rows,), 0.3, jnp.float32),
        repetition=jnp.full((rows,), 1.2, jnp.float32),
    )
    return state.replace(processors=p)


def run() -> dict:
    model = load_engine_model(None, dtype="float32")
    engine = EngineConfig(
        request_slots=FLAGS.batch,
        prefill_chunks=(64,),
        speculation="adaptive" if FLAGS.speculative else "off",
        draft_tokens=3 if FLAGS.speculative else 0,
        speculative_token_capacity=4 * FLAGS.batch,
        mixed_prefill=False,
        max_model_len=256,
    )
    shipped = _program(engine, model.config, model.params, shipped=True)
    before = _program(engine, model.config, model.params, shipped=False)
    rows = engine.state_rows
    variants = {"off": (shipped, False), "on": (shipped, True), "before": (before, False)}
    cursors = np.full((rows,), FLAGS.context, np.int32)  # a fresh cursor per run: state is donated
    states = {name: ps.init_state() for name, ((ps, _), _) in variants.items()}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    outs = {}
    names = list(variants)
    for i in range(FLAGS.runs + 1):
        for name in names[i % 3 :] + names[: i % 3]:  # rotate the order
            (_, program), processed = variants[name]
            inputs = measurement_inputs(program, engine, FLAGS.context)
            state = states[name].replace(cursor=jnp.asarray(cursors))
            state = _penalised(state, rows) if processed else state
            ms, states[name], out = _time(program, model.params, state, inputs)
            if i:  # the first run of each warms caches and allocators
                samples[name].append(ms)
            outs[name] = out
    if not np.array_equal(np.asarray(outs["off"].tokens), np.asarray(outs["before"].tokens)):
        raise AssertionError("processors off changed the tokens")
    medians = {name: statistics.median(s) for name, s in samples.items()}
    return dict(
        program=shipped[1].name,
        runs=FLAGS.runs,
        backend=jax.default_backend(),
        **{f"{name}_median_ms": round(m, 4) for name, m in medians.items()},
        ratio_off_over_before=round(medians["off"] / medians["before"], 4),
        ratio_on_over_before=round(medians["on"] / medians["before"], 4),
    )


def main(argv) -> int:
    del argv
    result = run()
    print(json.dumps(result, indent=1))
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
