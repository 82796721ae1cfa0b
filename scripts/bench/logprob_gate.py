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
from helios_jax.programs import build_programs, scores

flags.DEFINE_integer("batch", 16, "lanes (request slots)")
flags.DEFINE_bool("speculative", False, "time a speculative program (D = 3) instead of decode")
flags.DEFINE_integer("runs", 40, "timed executions per variant")
flags.DEFINE_integer("context", 64, "decode cursor")
flags.DEFINE_string("json_out", None, "write the figures as JSON here")
FLAGS = flags.FLAGS


def _always_scored(logits, tokens, wanted):
    return scores.token_logprobs(logits, tokens, jnp.ones_like(wanted))


def _program(engine, config, params, *, gated: bool):
    programs = build_programs(config, params, engine, engine.catalog())
    kind = GraphKind.SPECULATIVE if FLAGS.speculative else GraphKind.DECODE
    candidates = [p for p in programs.values() if p.descriptor.kind is kind and p.shape.lanes == FLAGS.batch]
    program = max(candidates, key=lambda p: (p.shape.width, p.shape.target_capacity))
    if gated:
        program.compile(programs.params_spec, programs.state_spec)
    else:
        with mock.patch("helios_jax.programs.round.token_logprobs", _always_scored):
            program.compile(programs.params_spec, programs.state_spec)
    return programs, program


def _time(program, params, state, inputs):
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    state, out = program(params, state, inputs)
    jax.block_until_ready((state, out))
    return (time.perf_counter() - t0) * 1e3, state, out


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
    gated = _program(engine, model.config, model.params, gated=True)
    ungated = _program(engine, model.config, model.params, gated=False)
    rows = engine.state_rows
    variants = {"skipped": (gated, False), "scored": (gated, True), "ungated": (ungated, False)}
    cursors = np.full((rows,), FLAGS.context, np.int32)  # a fresh buffer per run: state is donated
    states = {name: ps.init_state() for name, ((ps, _), _) in variants.items()}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    outs = {}
    names = list(variants)
    for i in range(FLAGS.runs + 1):
        for name in names[i % 3 :] + names[: i % 3]:  # rotate the order
            (_, program), flagged = variants[name]
            inputs = measurement_inputs(program, engine, FLAGS.context)
            state = states[name].replace(cursor=jnp.asarray(cursors), logprobs=jnp.full((rows,), flagged))
            ms, states[name], out = _time(program, model.params, state, inputs)
            if i:  # the first run of each warms caches and allocators
                samples[name].append(ms)
            outs[name] = out
    _check(outs)
    medians = {name: statistics.median(s) for name, s in samples.items()}
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
