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

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from program_variants import bench_engine, compile_variant, define_flags, interleave, run_main

from helios_jax.prepare import load_engine_model

define_flags()
FLAGS = flags.FLAGS

_IDENTITY = {
    "helios_jax.programs.round.apply_processors": lambda logits, *a, **k: logits,
    "helios_jax.programs.round.count_outputs": lambda state, *a, **k: state,
    "helios_jax.programs.round.apply_token_mask": lambda logits, *a, **k: logits,
}


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
    engine = bench_engine(FLAGS.batch, FLAGS.speculative)
    compile_ = dict(engine=engine, config=model.config, params=model.params, speculative=FLAGS.speculative)
    shipped = compile_variant(**compile_)
    before = compile_variant(**compile_, patches=_IDENTITY)
    variants = {"off": shipped, "on": shipped, "before": before}
    rows = engine.state_rows

    def row_state(name, state):
        return _penalised(state, rows) if name == "on" else state

    medians, outs = interleave(
        variants, model.params, engine, runs=FLAGS.runs, context=FLAGS.context, row_state=row_state
    )
    if not np.array_equal(np.asarray(outs["off"].tokens), np.asarray(outs["before"].tokens)):
        raise AssertionError("processors off changed the tokens")
    return dict(
        program=shipped[1].name,
        runs=FLAGS.runs,
        backend=jax.default_backend(),
        **{f"{name}_median_ms": round(m, 4) for name, m in medians.items()},
        ratio_off_over_before=round(medians["off"] / medians["before"], 4),
        ratio_on_over_before=round(medians["on"] / medians["before"], 4),
    )


if __name__ == "__main__":
    run_main(run)
