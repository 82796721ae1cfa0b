"""Bare execution time of the engine's prepared programs, for comparing two checkouts.

    python scripts/bench/program_times.py [--programs='decode\\[B=(1|16),'] [--runs=30] [--context=128]
        [--decode_steps=1,4,8] [--dtype=float32] [--json_out=FILE]

Builds the engine `engine.py` serves (`bench_common.engine_bench_config`: 16 request slots, the
default model) and times every prepared program whose name matches ``--programs`` (a regular
expression) the way `intervals.py` times its bare baseline: call, then ``block_until_ready``, back
to back, every call from the same cursors (``--context`` tokens; a prefill's lanes from 0), on
`prepare.measurement_inputs` (every lane active). Programs are timed in rounds, each round timing
each program once, so a change in the machine's load falls on all of them alike; the median of
``--runs`` rounds is reported. Use it under ``ab_checkouts.py`` to compare a change to a program
against its baseline in one invocation (``--fields=median_ms``).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time

import jax
from absl import app, flags
from bench_common import engine_bench_config

from helios_jax.compilation_cache import enable_compilation_cache

FLAGS = flags.FLAGS
flags.DEFINE_string("programs", r"decode\[B=(1|16),", "regular expression over the programs' names")
flags.DEFINE_integer("runs", 30, "timed rounds (after three untimed ones)")
flags.DEFINE_integer("context", 128, "each lane's cursor before every call")
flags.DEFINE_list("decode_steps", ["1", "4", "8"], "steps K of the decode programs")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "the model's dtype")
flags.DEFINE_string("json_out", None, "write the results as JSON here")


def time_programs(engine, keys, runs: int, context: int) -> dict[str, float]:
    """Median call-to-ready milliseconds of each program in `keys`, rounds interleaved."""
    from helios_jax.prepare.measurement import measurement_inputs, set_cursors

    executor = engine.executor
    cursors = executor.state.cursor
    setups = []
    for key in keys:
        program = executor.programs[key]
        start = jax.numpy.full(cursors.shape, context, cursors.dtype)
        if program.shape.kind.is_prefill:
            start = start.at[: program.shape.lanes].set(0)
        setups.append((program, measurement_inputs(program, engine.config, context), start))
    times: dict[str, list[float]] = {program.name: [] for program, _, _ in setups}
    for _ in range(runs + 3):
        for program, inputs, start in setups:
            executor.state = set_cursors(executor.state, start)
            jax.block_until_ready(executor.state)
            t = time.perf_counter_ns()
            executor.state, out = program(executor.params, executor.state, inputs)
            jax.block_until_ready(out)
            times[program.name].append((time.perf_counter_ns() - t) / 1e6)
    return {name: statistics.median(values[3:]) for name, values in times.items()}


def main(argv):
    del argv
    enable_compilation_cache()
    from helios_jax.prepare import load_engine_model
    from helios_jax.runtime.engine import HeliosEngine
    from helios_jax.runtime.tokenizer import HFTokenizer

    model = load_engine_model(None, dtype=FLAGS.dtype)
    steps = tuple(int(k) for k in FLAGS.decode_steps)
    ec = engine_bench_config(16, 512, decode_steps=steps, dtype=FLAGS.dtype)
    tokenizer = HFTokenizer(model.tokenizer)
    engine = HeliosEngine(
        model_config=model.config, params=model.params, tokenizer=tokenizer, engine_config=ec
    )
    try:
        pattern = re.compile(FLAGS.programs)
        keys = [k for k, p in engine.executor.programs.items() if pattern.search(p.name)]
        medians = time_programs(engine, keys, FLAGS.runs, FLAGS.context)
    finally:
        engine.shutdown()
    for name, ms in medians.items():
        print(f"{name:44s} {ms:8.3f} ms")
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            programs = {name: dict(median_ms=ms) for name, ms in medians.items()}
            json.dump(dict(programs=programs, argv=sys.argv), f, indent=1)


if __name__ == "__main__":
    app.run(main)
