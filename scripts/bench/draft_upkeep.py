"""What keeping the draft context costs: width-one speculative programs against decode programs.

    python scripts/bench/draft_upkeep.py [--lanes=16] [--steps=1,4,8] [--context=128] [--rounds=25]
        [--json_out=FILE]

A width-one speculative program (`speculative[B,W=1,D=0,S=K]`) is a decode step that also
absorbs the committed token into the MTP draft head's context, as the spec requires of width one
(`speculative-coverage/width-one-draft-context`), so that a wider round can follow. On a device
where drafts never pay, that upkeep is what an adaptive engine pays over one without
speculation. This builds both engines on the embedded default model (float32, 16 request slots,
context 512, decode programs of --steps steps; the adaptive one with three drafts), then times
the --lanes-lane programs of every K bare: each run from the same cursors (--context, reset
outside the timing, as `prepare --measure` does), dispatch to `block_until_ready`, all programs
interleaved round after round (the order reversed every other round), medians of --rounds - 1
rounds after a warm-up. Prints each program's median, its time per step, and the ratio
speculative / decode per K.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from absl import app, flags
from bench_common import machine

from helios_jax.compilation_cache import enable_compilation_cache

FLAGS = flags.FLAGS
flags.DEFINE_integer("lanes", 16, "batch capacity B of the programs compared")
flags.DEFINE_list("steps", ["1", "4", "8"], "step counts K compared")
flags.DEFINE_integer("context", 128, "every lane's cursor at the start of each run")
flags.DEFINE_integer("rounds", 25, "interleaved rounds (the first warms up)")
flags.DEFINE_string("json_out", None, "write the results as JSON here")


def engines(steps: tuple[int, ...]) -> dict:
    from helios_jax.engine_config import EngineConfig
    from helios_jax.prepare import load_engine_model
    from helios_jax.runtime.engine import HeliosEngine
    from helios_jax.runtime.tokenizer import HFTokenizer

    model = load_engine_model(None, dtype="float32")
    out = {}
    for mode in ("off", "adaptive"):
        config = EngineConfig(
            request_slots=16,
            prefill_chunks=(64,),
            speculation=mode,
            draft_tokens=0 if mode == "off" else 3,
            max_model_len=512,
            dtype="float32",
            decode_steps=steps,
        )
        out[mode] = HeliosEngine(
            model_config=model.config,
            params=model.params,
            tokenizer=HFTokenizer(model.tokenizer),
            engine_config=config,
        )
    return out


def timed_programs(built: dict) -> list[tuple[str, int, object, object]]:
    """(name, steps, engine, program) of the width-one generation programs of --lanes lanes."""
    out = []
    for engine in built.values():
        for program in engine.executor.programs.values():
            shape = program.shape
            if shape.kind.is_generation and shape.width == 1 and shape.lanes == FLAGS.lanes:
                out.append((program.name, shape.steps, engine, program))
    return sorted(out, key=lambda p: (p[1], p[0]))


def main(argv):
    del argv
    enable_compilation_cache()
    from helios_jax.prepare.measurement import measurement_inputs, set_cursors

    built = engines(tuple(int(k) for k in FLAGS.steps))
    try:
        jobs = [
            (name, steps, engine, program, measurement_inputs(program, engine.config, FLAGS.context))
            for name, steps, engine, program in timed_programs(built)
        ]
        times: dict[str, list[float]] = {name: [] for name, *_ in jobs}
        for r in range(FLAGS.rounds):
            for name, _, engine, program, inputs in jobs if r % 2 else jobs[::-1]:
                executor = engine.executor
                cursors = executor.state.cursor
                executor.state = set_cursors(
                    executor.state, jnp.full(cursors.shape, FLAGS.context, cursors.dtype)
                )
                jax.block_until_ready(executor.state)
                t = time.perf_counter()
                executor.state, out = program(executor.params, executor.state, inputs)
                jax.block_until_ready((executor.state, out))
                if r:
                    times[name].append((time.perf_counter() - t) * 1e3)
    finally:
        for engine in built.values():
            engine.shutdown()
    rows = []
    for name, steps, *_ in jobs:
        median = statistics.median(times[name])
        rows.append(dict(program=name, steps=steps, median_ms=median, per_step_ms=median / steps))
        print(f"{name:48s} {median:8.3f} ms  {median / steps:6.3f} ms a step")
    ratios = {}
    for k in sorted({row["steps"] for row in rows}):
        by_kind = {row["program"].split("[")[0]: row["median_ms"] for row in rows if row["steps"] == k}
        if {"speculative", "decode"} <= by_kind.keys():
            ratios[k] = by_kind["speculative"] / by_kind["decode"]
            print(f"K = {k}: speculative / decode {ratios[k]:.3f}")
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(dict(programs=rows, ratios=ratios, machine=machine(), argv=sys.argv), f, indent=1)


if __name__ == "__main__":
    app.run(main)
