"""What a compiled program's call costs on the host for its number of buffers alone.

    python scripts/bench/call_overhead.py [--shapes=5:8,28:31,77:31] [--calls=300]

For each IN:OUT pair, a jitted program of IN 4-element float32 inputs returning OUT elementwise
sums is compiled ahead of time, then called --calls times, with and without donating the inputs
its outputs replace; the median time from the call to its return (the host's dispatch, not the
execution: the clock stops before `block_until_ready`) is printed in microseconds. 77:31 is a
decode program's call on the embedded model (49 parameter arrays, 23 donated state arrays and 5
packed inputs in; 23 state arrays and 8 outputs back), so the figure bounds what argument
handling contributes to that call.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_list("shapes", ["5:8", "28:31", "77:31"], "IN:OUT buffer counts")
flags.DEFINE_integer("calls", 300, "timed calls per program")


def call_us(n_in: int, n_out: int, donate: bool) -> float:
    """Median host time of one call of an IN-in, OUT-out program, in microseconds."""
    args = [jnp.zeros((4,), jnp.float32) for _ in range(n_in)]
    kept = min(n_in, n_out)  # donated inputs are replaced by the outputs of the same position

    def f(*xs):
        return tuple(xs[i % n_in] + 1 for i in range(n_out))

    compiled = jax.jit(f, donate_argnums=tuple(range(kept)) if donate else ()).lower(*args).compile()
    out = jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(FLAGS.calls):
        if donate:
            args = list(out[:kept]) + args[kept:]
        start = time.perf_counter()
        out = compiled(*args)
        times.append((time.perf_counter() - start) * 1e6)
        jax.block_until_ready(out)
    return statistics.median(times)


def main(argv):
    del argv
    for shape in FLAGS.shapes:
        n_in, n_out = (int(x) for x in shape.split(":"))
        plain, donated = call_us(n_in, n_out, False), call_us(n_in, n_out, True)
        print(f"{n_in:3d} in {n_out:3d} out: call {plain:6.1f} us, donated {donated:6.1f} us")


if __name__ == "__main__":
    app.run(main)
