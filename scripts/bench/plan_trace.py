"""Write every plan of ``plan_path.py``'s closed loops, for an exact before/after comparison.

    python scripts/bench/plan_trace.py --out=FILE [--decisions=300]   (plan_path's flag)
    diff BEFORE_FILE AFTER_FILE     # a change that keeps decisions identical: no output

A restructure of the ``plan()`` path must choose the same plans. This runs the closed loops of
``plan_path.py`` (the 69-program catalog at 64, 16 and 1 resident requests, its prefill and
generation subset at 64, the engine's catalog at 1 and 4, and bursts of 16 requests on
``engine.py``'s catalog, every one from the same seed) and
writes one line per decision: the population, the decision's index and the ``repr`` of the
frozen plan (its program, lanes, per-lane work, expected service and timing class, with every
float in full). Each loop's SHA-1 over those lines is printed at the end.
"""

from __future__ import annotations

import hashlib
import pathlib
import sys

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import plan_path  # noqa: E402  (the loops and catalogs benched there)

from helios_jax.catalog import DecodeMode  # noqa: E402

flags.DEFINE_string("out", None, "write the plans here", required=True)
FLAGS = flags.FLAGS

# (catalog, subset, resident requests, burst): 'synthetic' is plan_path's default catalog; the
# engine-off16 burst is engine.py's workload (16 prompts at once, no speculation, K-step decode).
LOOPS = (
    ("synthetic", "all", 64, False),
    ("synthetic", "all", 16, False),
    ("synthetic", "all", 1, False),
    ("synthetic", "no_mixed", 64, False),
    ("engine", "all", 1, False),
    ("engine", "all", 4, False),
    ("engine-off16", "all", 16, True),
)


def main(argv):
    del argv
    if not FLAGS["decisions"].present:
        FLAGS.decisions = 300  # per loop (plan_path's default is its timed count)
    digests = []
    with open(FLAGS.out, "w") as out:
        for catalog, subset, n, burst in LOOPS:
            FLAGS.catalog = None if catalog == "synthetic" else catalog
            graphs, kwargs = plan_path.load(subset)
            mode = DecodeMode.ORDINARY if catalog == "engine-off16" else DecodeMode.ADAPTIVE
            loop = plan_path.Loop(graphs, mode, n, FLAGS.seed, burst=burst, **kwargs)
            digest = hashlib.sha1()
            for i in range(FLAGS.decisions):
                plan = loop.sched.plan()
                line = f"{catalog} {subset} {n}{' burst' if burst else ''} {i} {plan!r}\n"
                digest.update(line.encode())
                out.write(line)
                loop.step(plan)
            digests.append(f"{catalog}/{subset}/{n}{'/burst' if burst else ''}: {digest.hexdigest()}")
    print("\n".join(digests))


if __name__ == "__main__":
    app.run(main)
