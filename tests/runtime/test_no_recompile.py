"""After its warm-up the engine never compiles again.

The engine test module's engine (tests/runtime/test_engine.py: the tiny model, adaptive
speculation; compiled once for both modules' tests) is built and warmed by its constructor; then
a mixed workload runs:
more concurrent requests than slots, prompts from 2 to 100 tokens (one chunk, several chunks),
greedy and sampled rows (temperature, top-k, top-p, seeds) in the same batches, stop strings,
generated-token log-probabilities and prompt scores. Any XLA compilation meanwhile (a program
that was not prepared, a jnp operation on the host path, a shape that varies) fails the test,
naming the compiled functions. The counter itself (`helios_jax.runtime.compilations`) must see
a fresh jit compile and render as a Prometheus counter.
"""

import jax
import numpy as np

from helios_jax.runtime import compilations


def test_the_counter_sees_a_new_compilation_and_renders_as_a_counter():
    before = compilations.compilation_count()
    jax.jit(lambda x: x * 3 + 1)(np.arange(7, dtype=np.int32)).block_until_ready()
    assert compilations.compilation_count() == before + 1
    assert "<lambda>" in compilations.recent_compilations()[-1]
    jax.jit(lambda x: x * 3 + 1)  # a jit that never runs compiles nothing
    assert compilations.compilation_count() == before + 1
    text = compilations.render_compilations()
    lines = text.splitlines()
    assert text.endswith("\n") and lines[1] == "# TYPE helios_xla_compilations_total counter"
    assert lines[0].startswith("# HELP helios_xla_compilations_total ")
    assert lines[2] == f"helios_xla_compilations_total {before + 1}"
