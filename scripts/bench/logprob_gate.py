"""The log-probability gate: a generation program's time with and without scoring, interleaved.

    python scripts/bench/logprob_gate.py [--batch=16] [--speculative] [--runs=40] [--json_out=FILE]

Builds one generation program for the embedded default model (float32): ordinary decode at
B = --batch, or with --speculative the widest host-ragged speculative program (D = 3). It compiles
it twice: as shipped (`scores.token_logprobs` behind a `lax.cond` on the rows' `logprobs` flags)
and ungated (the predicate forced true while tracing: the program every generation program was
before the gate). Three variants then run, alternating in rotated order from the same cursors,
each timed from dispatch to block_until_ready:

  skipped   shipped program, no row flagged (the common batch: nobody asked for logprobs)
  scored    shipped program, every row flagged
  ungated   ungated program, no row flagged (it scores anyway)

Prints the medians and the ratios skipped/ungated and scored/ungated, and checks that the three
emit the same tokens and that scored and ungated report the same log-probability bits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from program_variants import bench_engine, compile_variant, define_flags, interleave, run_main

from helios_jax.prepare import load_engine_model
from helios_jax.programs import scores

define_flags()
FLAGS = flags.FLAGS


def _always_scored(logits, tokens, wanted):
    return scores.token_logprobs(logits, tokens, jnp.ones_like(wanted))


def run() -> dict:
    model = load_engine_model(None, dtype="float32")
    engine = bench_engine(FLAGS.batch, FLAGS.speculative)
    compile_ = dict(engine=engine, config=model.config, params=model.params, speculative=FLAGS.speculative)
    gated = compile_variant(**compile_)
    always = {"helios_jax.programs.round.token_logprobs": _always_scored}
    ungated = compile_variant(**compile_, patches=always)
    variants = {"skipped": gated, "scored": gated, "ungated": ungated}
    rows = engine.state_rows

    def row_state(name, state):
        return state.replace(logprobs=jnp.full((rows,), name == "scored"))

    medians, outs = interleave(
        variants, model.params, engine, runs=FLAGS.runs, context=FLAGS.context, row_state=row_state
    )
    _check(outs)
    return dict(
        program=gated[1].name,
        runs=FLAGS.runs,
        backend=jax.default_backend(),
        **{f"{name}_median_ms": round(m, 4) for name, m in medians.items()},
        ratio_skipped_over_ungated=round(medians["skipped"] / medians["ungated"], 4),
        ratio_scored_over_ungated=round(medians["scored"] / medians["ungated"], 4),
    )


def _check(outs) -> None:
    tokens = {name: np.asarray(out.tokens) for name, out in outs.items()}
    if not all(np.array_equal(tokens["ungated"], t) for t in tokens.values()):
        raise AssertionError("the gate changed the tokens")
    if not np.isnan(np.asarray(outs["skipped"].logprobs)).all():
        raise AssertionError("an unflagged batch was scored")
    for name in ("logprobs", "top_logprobs", "top_tokens"):
        a, b = np.asarray(getattr(outs["scored"], name)), np.asarray(getattr(outs["ungated"], name))
        if a.tobytes() != b.tobytes():
            raise AssertionError(f"gated and ungated {name} differ")


if __name__ == "__main__":
    run_main(run)
