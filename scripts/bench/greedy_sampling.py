"""The all-greedy sampling fast path against the full path, in one program, interleaved.

    python scripts/bench/greedy_sampling.py [--batch=16] [--speculative] [--runs=40] [--json_out=FILE]

Builds one generation program for the embedded default model (float32): ordinary decode at
B = --batch, or with --speculative the widest host-ragged speculative program (D = 3). It compiles
it twice: as shipped (every row greedy: argmax only, `sampling.draw` and
`acceptance.sample_and_accept`) and with the greedy test forced false (`greedy_only` patched
while tracing), which is the full softmax / truncation test / inverse-CDF path the programs ran
before. Every lane is active and greedy (a fresh state is greedy). Runs alternate between the
two executables (ABBA) from the same cursors; each run is timed from dispatch to
block_until_ready. Prints the medians and their ratio fast/full, and checks that both return
the same tokens.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
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


def _program(engine, config, params, *, fast: bool):
    programs = build_programs(config, params, engine, engine.catalog())
    kind = GraphKind.SPECULATIVE if FLAGS.speculative else GraphKind.DECODE
    candidates = [p for p in programs.values() if p.descriptor.kind is kind and p.shape.lanes == FLAGS.batch]
    program = max(candidates, key=lambda p: (p.shape.width, p.shape.target_capacity))
    never = mock.patch("helios_jax.programs.sampling.greedy_only", lambda *a, **k: jnp.array(False))
    never_acc = mock.patch("helios_jax.programs.acceptance.greedy_only", lambda *a, **k: jnp.array(False))
    if fast:
        program.compile(programs.params_spec, programs.state_spec)
    else:
        with never, never_acc:
            program.compile(programs.params_spec, programs.state_spec)
    return programs, program


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
    variants = {
        name: _program(engine, model.config, model.params, fast=name == "fast") for name in ("fast", "full")
    }
    cursors = np.full((engine.state_rows,), FLAGS.context, np.int32)
    states = {name: ps.init_state() for name, (ps, _) in variants.items()}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    tokens = {}
    for i in range(FLAGS.runs + 1):
        order = ("fast", "full") if i % 2 == 0 else ("full", "fast")
        for name in order:
            _, program = variants[name]
            inputs = measurement_inputs(program, engine, FLAGS.context)
            state = states[name].replace(cursor=jnp.asarray(cursors))
            jax.block_until_ready(state)
            t0 = time.perf_counter()
            state, out = program(model.params, state, inputs)
            jax.block_until_ready((state, out))
            if i:  # the first run of each warms caches and allocators
                samples[name].append((time.perf_counter() - t0) * 1e3)
            states[name], tokens[name] = state, np.asarray(out.tokens)
    if not np.array_equal(tokens["fast"], tokens["full"]):
        raise AssertionError("the greedy fast path changed the tokens")
    medians = {name: statistics.median(s) for name, s in samples.items()}
    return dict(
        program=variants["fast"][1].name,
        runs=FLAGS.runs,
        backend=jax.default_backend(),
        fast_median_ms=round(medians["fast"], 4),
        full_median_ms=round(medians["full"], 4),
        ratio_fast_over_full=round(medians["fast"] / medians["full"], 4),
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
